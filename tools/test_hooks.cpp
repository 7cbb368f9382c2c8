#include "test_hooks.hpp"

#ifdef WEIGHTCAST_TEST_HOOKS

#include "commands.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace weightcast::cli::test_hooks {

namespace {

constexpr const char* pause_hook_env = "WEIGHTCAST_TEST_PAUSE_AFTER_CATALOGUE_MS";
constexpr const char* corrupt_hook_env = "WEIGHTCAST_TEST_CORRUPT_DIGEST_RANK";
constexpr const char* stop_after_verdict_hook_env = "WEIGHTCAST_TEST_STOP_AFTER_VERDICT_RANK";
constexpr const char* chunk_delay_hook_env = "WEIGHTCAST_TEST_CHUNK_DELAY_MS";
constexpr const char* block_delay_hook_env = "WEIGHTCAST_TEST_SYNTH_BLOCK_DELAY_MS";
constexpr const char* local_mpi_hook_env = "WEIGHTCAST_TEST_LOCAL_SPAWNER_ALLOWS_MPI";

// The milliseconds hook @p env asks for; 0 when it is unset, not a number or not positive.
long hook_ms(const char* env) {
  const char* text = std::getenv(env);
  if (text == nullptr) return 0;
  long ms = 0;
  auto [end, ec] = std::from_chars(text, text + std::char_traits<char>::length(text), ms);
  return ec == std::errc() && *end == '\0' && ms > 0 ? ms : 0;
}

bool names_rank(const char* env, int rank) {
  const char* text = std::getenv(env);
  if (text == nullptr) return false;
  int target = -1;
  auto [end, ec] = std::from_chars(text, text + std::char_traits<char>::length(text), target);
  return ec == std::errc() && target == rank;
}

}  // namespace

JobTestHooks job(int rank) {
  JobTestHooks hooks;
  if (const long ms = hook_ms(pause_hook_env); ms != 0) {
    hooks.after_catalogue = [ms] {
      spdlog::info("test hook {}: pausing {} ms after reading the catalogue", pause_hook_env, ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
  }
  if (names_rank(corrupt_hook_env, rank)) {
    hooks.before_report = [](std::vector<std::uint64_t>& digests) {
      if (digests.empty()) return;
      spdlog::info("test hook {}: reporting a wrong digest for the first tensor",
                   corrupt_hook_env);
      digests.front() = ~digests.front();
    };
  }
  if (names_rank(stop_after_verdict_hook_env, rank)) {
    hooks.after_verdict = [] {
      spdlog::info("test hook {}: stopping this rank after the verdict",
                   stop_after_verdict_hook_env);
      ::raise(SIGSTOP);
    };
  }
  return hooks;
}

void add_chunk_delay(LoadOptions& options) {
  const long ms = hook_ms(chunk_delay_hook_env);
  if (ms == 0) return;
  options.on_progress = [inner = std::move(options.on_progress), ms,
                         first = true](const LoadProgress& progress) mutable {
    if (inner) inner(progress);
    if (std::exchange(first, false)) {
      spdlog::info("test hook {}: the first chunk landed; sleeping {} ms after each chunk",
                   chunk_delay_hook_env, ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
}

void add_block_delay(SynthOptions& options) {
  const long ms = hook_ms(block_delay_hook_env);
  if (ms == 0) return;
  options.on_block = [ms, first = std::make_shared<std::atomic<bool>>(true)](std::uint64_t) {
    if (first->exchange(false)) {
      eprint("test hook {}: the first block was written; sleeping {} ms after each block\n",
             block_delay_hook_env, ms);
      std::fflush(stderr);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  };
}

bool local_spawner_allows_mpi() { return std::getenv(local_mpi_hook_env) != nullptr; }

}  // namespace weightcast::cli::test_hooks

#else  // a build without the test suite: no hooks

namespace weightcast::cli::test_hooks {

JobTestHooks job(int) { return {}; }
void add_chunk_delay(LoadOptions&) {}
void add_block_delay(SynthOptions&) {}
bool local_spawner_allows_mpi() { return false; }

}  // namespace weightcast::cli::test_hooks

#endif
