// `weightcast synth OUT_DIR [--params 1B] [--dtype BF16] [--shard-size 2GiB] [--seed 0]`
#include "commands.hpp"

#include "weightcast/config/config.hpp"
#include "weightcast/core/detail/plural.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/checkpoint/synth.hpp"

#include "interrupt.hpp"
#include "test_hooks.hpp"

#include <fmt/core.h>

#include <array>
#include <atomic>
#include <cmath>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

namespace weightcast::cli {

namespace {

Dtype parse_dtype_arg(const std::string& name) {
  if (auto dtype = parse_dtype(name)) return *dtype;
  std::string known;
  for (std::size_t i = 0; i < dtype_count; ++i) {
    if (!known.empty()) known += ", ";
    known += dtype_name(static_cast<Dtype>(i));
  }
  throw Error(Errc::usage, fmt::format("--dtype '{}' is not a safetensors dtype (one of: {})",
                                       name, known));
}

std::uint64_t parse_shard_size_arg(const std::string& text) {
  try {
    return parse_size(text, "--shard-size");
  } catch (const Error& e) {
    // A command-line argument, not a config key: the exit status is usage's.
    throw Error(Errc::usage, e.what());
  }
}

}  // namespace

std::string human_count(std::uint64_t n) {
  // As model sizes are written (125M, 1.3B, 7B), with three significant digits: 1.00M,
  // 12.3M, 125M; below a thousand, the number itself.
  static constexpr std::array<std::pair<double, const char*>, 4> units{
      {{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}}};
  for (const auto& [scale, suffix] : units) {
    const double value = static_cast<double>(n) / scale;
    if (value < 1) continue;
    // Rounded to three digits first, so that 999,999 is 1.00M rather than 1000K.
    const int decimals = value < 10 ? 2 : value < 100 ? 1 : 0;
    const double rounded = std::round(value * std::pow(10, decimals)) / std::pow(10, decimals);
    if (rounded >= 1000 && scale < 1e12) continue;  // belongs to the next unit up
    return fmt::format("{:.{}f}{}", rounded, decimals, suffix);
  }
  return fmt::format("{}", n);
}

std::optional<std::uint64_t> parse_seed(std::string_view text) {
  std::uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, seed);
  if (text.empty() || ec != std::errc() || at != end) return std::nullopt;
  return seed;
}

int synth(const SynthArgs& args) {
  // First, before any thread starts: the writing threads inherit SIGINT and SIGTERM blocked,
  // and a signal stops the write (its temporary files removed) rather than leave them.
  InterruptHandler interrupts;
  SynthOptions options;
  options.params = parse_param_count(args.params);
  options.dtype = parse_dtype_arg(args.dtype);
  options.shard_bytes = parse_shard_size_arg(args.shard_size);
  const auto seed = parse_seed(args.seed);
  if (!seed) throw Error(Errc::usage, fmt::format("--seed {}: not a whole number", args.seed));
  options.seed = *seed;
  if (options.shard_bytes == 0) throw Error(Errc::usage, "--shard-size must be more than 0");

  auto shape = choose_llama_shape(options.params);
  fmt::print("synth: {} layers, hidden {}, intermediate {}, heads {}/{} kv, vocab {}, {}\n",
             shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads,
             shape.vocab, dtype_name(options.dtype));
  flush_stdout();  // before the checkpoint is written, not after

  test_hooks::add_block_delay(options);
  auto start = std::chrono::steady_clock::now();
  constexpr const char* during = " while writing the checkpoint";
  InterruptHandler::LoadScope scope(interrupts, during);
  options.stop = interrupts.stop_token();
  SynthSummary summary;
  try {
    summary = write_synthetic_checkpoint(args.out_dir, options);
  } catch (const Error& e) {
    // The stop's own error says less than the signal that asked for it; a failure of its
    // own that beat the stop is the cause.
    const int sig = scope.end();
    if (sig != 0 && e.code() == Errc::interrupted) throw interrupted_error(sig, during);
    throw;
  }
  // A signal that came as the files were renamed into place: the checkpoint is whole, but
  // the process was asked to end, and says so with 128 + signal, as `run` does.
  if (const int sig = scope.end(); sig != 0) throw interrupted_error(sig, during);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  fmt::print("synth: wrote {}\n", summary.checkpoint.string());
  fmt::print("synth: {}, {}, {} params ({}), {} bytes ({})\n",
             detail::counted(summary.tensors, "tensor"), detail::counted(summary.shards, "shard"),
             human_count(summary.params), summary.params, summary.file_bytes,
             format_bytes(summary.file_bytes));
  // 1 GB = 1e9 B, as in every throughput weightcast reports.
  fmt::print("synth: {:.3f} s, {:.2f} GB/s\n", seconds,
             seconds > 0 ? static_cast<double>(summary.file_bytes) / seconds / 1e9 : 0.0);
  return 0;
}

}  // namespace weightcast::cli
