// `weightcast run` with more than one rank: rendezvous over the control plane, the catalogue
// from rank 0, the load over the data plane, every rank's digests compared on rank 0.
#include "commands.hpp"
#include "interrupt.hpp"
#include "progress.hpp"

#include "weightcast/catalogue_wire.hpp"
#include "weightcast/checkpoint.hpp"
#include "weightcast/control_plane.hpp"
#include "weightcast/detail/plural.hpp"
#include "weightcast/digest.hpp"
#include "weightcast/error.hpp"
#include "weightcast/loader.hpp"
#include "weightcast/log.hpp"
#include "weightcast/transport_mpi.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <charconv>
#include <csignal>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <unistd.h>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

namespace weightcast::cli {
namespace {

// Test hook (tests/test_multirank.cpp): rank 0 sleeps this many milliseconds after reading
// the catalogue and before sending it (and before opening the shards for the load), while
// the other ranks wait for it; so a test can truncate a shard, kill or stop a peer at a
// known point. Not a user feature; ignored when unset or not a number.
constexpr const char* pause_hook_env = "WEIGHTCAST_TEST_PAUSE_AFTER_CATALOGUE_MS";

void honour_pause_hook() {
  const long ms = test_hook_ms(pause_hook_env);
  if (ms == 0) return;
  spdlog::info("test hook {}: pausing {} ms after reading the catalogue", pause_hook_env, ms);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// Test hook (tests/test_multirank.cpp): the rank named here reports a wrong XXH3-64 for the
// first tensor, so that rank 0's verdict finds a mismatch. Not a user feature.
constexpr const char* corrupt_hook_env = "WEIGHTCAST_TEST_CORRUPT_DIGEST_RANK";

void honour_corrupt_hook(int rank, std::vector<std::uint64_t>& digests) {
  const char* text = std::getenv(corrupt_hook_env);
  if (text == nullptr || digests.empty()) return;
  int target = -1;
  auto [end, ec] = std::from_chars(text, text + std::char_traits<char>::length(text), target);
  if (ec != std::errc() || target != rank) return;
  spdlog::info("test hook {}: reporting a wrong digest for the first tensor", corrupt_hook_env);
  digests.front() = ~digests.front();
}

/// An error this rank has printed already (`report_failure`): not printed again.
class Reported : public Error {
 public:
  using Error::Error;
};

/// Prints this rank's failure; from now on a signal (mpirun ending the failed job) ends the
/// process with its status and no second line.
void report_failure(const Error& e, InterruptHandler& interrupts) {
  interrupts.failing(exit_status(e.code()));
  std::fflush(stdout);
  eprint("weightcast: error: {}\n", printable(e.what()));
  std::fflush(stderr);
}

/// How long a rank other than 0 that sent its ABORT waits for rank 0 to take it
/// (`ControlPlane::linger`) before it exits.
std::chrono::milliseconds linger_most(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(2'000));
}

/// How long a rank other than 0 that times out waits for rank 0's diagnosis of the same
/// stall (`ControlPlane::defer_to_root`) before it sends its own.
std::chrono::milliseconds root_grace(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(5'000));
}

// Test hook (tests/test_multirank.cpp): the rank named here stops itself (SIGSTOP) once it
// has the verdict, before MPI_Finalize: a rank stopped after the verdict must not hold the
// launcher forever. Not a user feature.
constexpr const char* stop_after_verdict_hook_env = "WEIGHTCAST_TEST_STOP_AFTER_VERDICT_RANK";

void honour_stop_after_verdict_hook(int rank) {
  const char* text = std::getenv(stop_after_verdict_hook_env);
  if (text == nullptr) return;
  int target = -1;
  auto [end, ec] = std::from_chars(text, text + std::char_traits<char>::length(text), target);
  if (ec != std::errc() || target != rank) return;
  spdlog::info("test hook {}: stopping this rank after the verdict", stop_after_verdict_hook_env);
  ::raise(SIGSTOP);
}

/// Ends the process (through the control plane's ABORT, status 75) if a blocking call that
/// takes no timeout has not returned within @p timeout.
class InitWatchdog {
 public:
  InitWatchdog(ControlPlane& control, int rank, std::chrono::milliseconds timeout,
               std::string what)
      : _thread([this, &control, rank, timeout, what = std::move(what)] {
          std::unique_lock lock(_mutex);
          if (wait_running(lock, timeout)) return;
          // Rank 0 meets the same stall and knows every rank's state: let it speak first.
          lock.unlock();
          control.defer_to_root(root_grace(timeout));
          lock.lock();
          if (_finished) return;
          const Error error(Errc::timeout,
                            fmt::format("rank {}: {} did not return within {} ms (timeout): "
                                        "{}",
                                        rank, what, timeout.count(), control.stall_report()));
          control.abort(error);
          std::fflush(stdout);
          eprint("weightcast: error: {}\n", printable(error.what()));
          std::fflush(stderr);
          control.linger(linger_most(timeout));
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          control.join_finished_reader();
          ::_exit(exit_status(Errc::timeout));
        }) {}
  ~InitWatchdog() {
    {
      std::lock_guard lock(_mutex);
      _finished = true;
    }
    _done.notify_all();
    _thread.join();
  }
  InitWatchdog(const InitWatchdog&) = delete;
  InitWatchdog& operator=(const InitWatchdog&) = delete;

 private:
  // Waits up to @p timeout of time this process ran, in steps of at most 1 s; a step that
  // took far longer than asked (the process was stopped, then resumed) counts as its length
  // only, lest a rank stopped for `timeout` blame the others once resumed (meanwhile, rank 0
  // has named it, and its ABORT waits to be read). @return whether the call finished.
  bool wait_running(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout) {
    using Clock = std::chrono::steady_clock;
    Clock::duration left = timeout;
    while (left > Clock::duration::zero()) {
      const Clock::duration step = std::min<Clock::duration>(left, std::chrono::seconds(1));
      const auto begin = Clock::now();
      if (_done.wait_for(lock, step, [this] { return _finished; })) return true;
      left -= std::min<Clock::duration>(Clock::now() - begin, step);
    }
    return false;
  }

  std::mutex _mutex;
  std::condition_variable _done;
  bool _finished = false;
  std::thread _thread;  // last: starts after the members it uses exist
};

// The settings every rank must share, one `key: value` per line: the plan (chunk_size), the
// data plane (device kind, transport) and the verdict (verify). Ranks can be started with
// different configs (MPMD, a config per node); a plan that differs between ranks makes the
// broadcasts disagree on their sizes, which MPI does not detect (wrong bytes, or a hang).
std::string shared_settings(const Config& config, bool host_device, TransportKind transport) {
  return fmt::format("chunk_size: {}\ndevice: {}\ntransport: {}\nverify: {}\n",
                     format_bytes(config.chunk_bytes) + fmt::format(" ({} B)", config.chunk_bytes),
                     host_device ? "host" : "cuda", to_string(transport),
                     to_string(config.verify));
}

// Ranks other than 0: this rank's shared settings against rank 0's.
// @throws Error `config` (78) naming the first setting that differs and both values.
void check_shared_settings(const std::string& mine, const std::string& root) {
  auto lines = [](std::string_view text) {
    std::vector<std::string_view> out;
    while (!text.empty()) {
      const auto end = text.find('\n');
      out.push_back(text.substr(0, end));
      text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    }
    return out;
  };
  const auto a = lines(mine);
  const auto b = lines(root);
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string_view m = i < a.size() ? a[i] : "";
    const std::string_view r = i < b.size() ? b[i] : "";
    if (m == r) continue;
    const auto colon = m.find(':');
    const std::string_view key = m.substr(0, colon);
    throw Error(Errc::config,
                fmt::format("{} differs between ranks: this rank has{}, rank 0 has{}; every rank "
                            "must use the same (set it alike in every rank's config)",
                            key, m.substr(colon + 1),
                            r.substr(std::min(r.size(), r.find(':') + 1))));
  }
}

// Rank 0: every rank's digests against rank 0's own (`verify` and `seconds`, the time the
// digests took: rank 0's).
Verdict judge(const std::vector<RankReport>& reports, const Catalogue& catalogue, Verify verify,
              double seconds) {
  // Every rank has the same `verify` (check_shared_settings).
  if (verify == Verify::none) {
    return Verdict{0, fmt::format("{} × {} loaded, not compared (verify: none)",
                                  detail::counted(reports.size(), "rank"),
                                  detail::counted(catalogue.tensors.size(), "tensor"))};
  }
  const auto& mine = reports.at(0).digests;
  std::vector<std::string> mismatches;
  std::size_t count = 0;
  for (const RankReport& report : reports) {
    if (report.digests.size() != mine.size()) {
      ++count;
      mismatches.push_back(fmt::format("rank {} reported {} digests, rank 0 has {}", report.rank,
                                       report.digests.size(), mine.size()));
      continue;
    }
    for (std::size_t t = 0; t < mine.size(); ++t) {
      if (report.digests[t] == mine[t]) continue;
      if (++count <= 10) {
        mismatches.push_back(fmt::format("rank {}: tensor '{}' xxh3 {}, rank 0 has {}",
                                         report.rank, catalogue.tensors[t].name,
                                         digest_hex(report.digests[t]), digest_hex(mine[t])));
      }
    }
  }
  if (count == 0) {
    return Verdict{0, fmt::format("{} × {} bit-exact (XXH3-64 of every tensor "
                                  "matches rank 0's; hashing took {:.3f} s on rank 0)",
                                  detail::counted(reports.size(), "rank"),
                                  detail::counted(mine.size(), "tensor"), seconds)};
  }
  std::string message = fmt::format("{} against rank 0's bytes: ",
                                    detail::counted(count, "tensor mismatch", "tensor mismatches"));
  for (std::size_t i = 0; i < mismatches.size(); ++i) {
    message += (i ? "; " : "") + mismatches[i];
  }
  return Verdict{exit_status(Errc::internal), message};
}

}  // namespace

namespace {

int run_ranks_or_throw(const RunArgs& args, const Config& config, const World& world,
                       InterruptHandler& interrupts) {
  const int rank = world.rank;
  interrupts.set_rank(rank);
  auto prefixed = [rank](const std::exception& e, Errc code) {
    return Error(code, fmt::format("rank {}: {}", rank, e.what()));
  };

  std::unique_ptr<Device> device;
  TransportKind kind{};
  std::optional<ControlPlane> control;
  try {
    // host memory travels over mpi; a cuda arena (this rank's GPU: its local rank) over nccl.
    device = make_device(config.device, world.local_rank);
    kind = transport_for_world(config, device->name() == "host", world.world_size);
    if (kind == TransportKind::mpi && !mpi_compiled_in()) MpiSession{};  // "no MPI" (69)
    if (rank == 0) {
      WEIGHTCAST_EXPECT(!config.checkpoint.empty(), Errc::config,
                        "checkpoint: not set (give it in the config or with --set "
                        "checkpoint=PATH)");
    }
    control.emplace(world, rendezvous_options(config, world));
  } catch (const RemoteAbort&) {
    throw;
  } catch (const Error& e) {
    throw prefixed(e, e.code());
  }

  // From here an interrupt outside the load sends its ABORT over the control plane; detached
  // before the control plane goes (declared after it).
  interrupts.attach(&*control);
  struct Detach {
    InterruptHandler& interrupts;
    ~Detach() { interrupts.attach(nullptr); }
  } detach{interrupts};

  std::unique_ptr<MpiSession> mpi;
  try {
    // Ranks other than 0 never touch the checkpoint path: they get the catalogue instead.
    // Before the load (and, on rank 0, before the catalogue): a report or trace this rank
    // cannot write ends the job now, every rank with this rank's message.
    check_output_paths(args, config, rank, world.world_size);
    Catalogue catalogue;
    if (rank == 0) {
      catalogue = open_checkpoint(config.checkpoint);
      check_outputs_spare_checkpoint(args, config, catalogue, rank, world.world_size);
      honour_pause_hook();
      control->share(encode_catalogue(catalogue));
    } else {
      check_outputs_spare_checkpoint(args, config, Catalogue{}, rank, world.world_size);
      catalogue = decode_catalogue(control->share({}), "catalogue from rank 0");
    }
    const std::string settings = shared_settings(config, device->name() == "host", kind);
    if (rank == 0) {
      control->share(settings);
    } else {
      check_shared_settings(settings, control->share({}));
    }

    std::unique_ptr<Transport> transport;
    if (kind == TransportKind::mpi) {
      {
        // MPI_Init_thread waits for every rank (Open MPI's modex) and takes no timeout: if a
        // rank stalls there, end the job from a watchdog instead of waiting forever.
        InitWatchdog watchdog(*control, rank, config.timeout, "MPI_Init_thread");
        mpi = std::make_unique<MpiSession>();
      }
      if (mpi->rank() != rank || mpi->world_size() != world.world_size) {
        // Where the config gave the world, the config is what disagrees with mpirun.
        const std::string hint =
            world.source == WorldSource::config
                ? fmt::format("remove world.rank and world.size from the config (mpirun's "
                              "environment gives each rank its place), or start {} ranks "
                              "with mpirun -np {} in that order",
                              world.world_size, world.world_size)
                : fmt::format("launch with mpirun -np {} (weightcast launch does)",
                              world.world_size);
        throw Error(Errc::unavailable,
                    fmt::format("transport mpi: MPI says rank {} of {}, but this is rank {} of "
                                "{} ({}); {}",
                                mpi->rank(), mpi->world_size(), rank, world.world_size,
                                to_string(world.source), hint));
      }
      transport = make_mpi_transport(*mpi);
    } else {
      // NCCL's bootstrap: rank 0's ncclUniqueId travels over the control plane (NCCL docs,
      // "Creating a communicator with options"), then every rank joins the communicator.
      NcclUniqueId id{};
      if (rank == 0) {
        id = nccl_unique_id();
        control->share(std::string(reinterpret_cast<const char*>(id.data()), id.size()));
      } else {
        const std::string bytes = control->share({});
        WEIGHTCAST_EXPECT(bytes.size() == id.size(), Errc::unavailable,
                          fmt::format("the NCCL unique id from rank 0 has {} bytes, expected {}",
                                      bytes.size(), id.size()));
        std::memcpy(id.data(), bytes.data(), id.size());
      }
      transport = make_nccl_transport(rank, world.world_size, world.local_rank, id,
                                      config.timeout);
    }

    LoadOptions options = LoadOptions::from_config(config);
    if (device->name() != "host") options.tensor_alignment = 256;
    // The control plane's heartbeat carries this rank's progress, so that a stall's message
    // can say which rank is behind. Rank 0 shows the load's progress as `run` does alone, as
    // plain lines whatever stderr is: the other ranks' lines would break a redrawn bar.
    std::optional<ProgressRenderer> progress;
    if (rank == 0 && !args.quiet) {
      progress.emplace(stderr, ProgressRenderer::Mode::lines, std::chrono::steady_clock::now(),
                       "weightcast[rank 0]");
    }
    options.on_progress = [&control, &progress](const LoadProgress& p) {
      control->note_progress(p.chunks_done);
      if (progress) progress->update(p);
    };
    const std::size_t shards = catalogue.shards.size();
    // Another rank's failure ends this process from the control plane's thread: with a
    // trace asked for, the load is stopped first and its trace written (a second at most).
    struct ClearHook {
      ControlPlane& control;
      ~ClearHook() { control.on_ending({}); }
    } clear_hook{*control};
    if (!config.trace.empty()) {
      control->on_ending([&interrupts] {
        interrupts.stop_load_and_wait(std::chrono::milliseconds(1'000));
      });
    }
    const LoadResult result =
        load_traced(std::move(catalogue), *device, *transport, std::move(options), config, rank,
                    world.world_size, interrupts);
    // A cuda arena is read back through a pinned bounce buffer: the verdict covers the bytes
    // that landed in GPU memory, not a host copy of them. `verify: none` skips it.
    const auto digests_begin = std::chrono::steady_clock::now();
    std::vector<std::uint64_t> digests;
    if (config.verify == Verify::digest) digests = tensor_digests(result);
    const double digest_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - digests_begin).count();
    honour_corrupt_hook(rank, digests);

    // Each rank's own summary; the job's verdict is rank 0's alone, printed once below.
    if (!args.json) {
      fmt::print("# rank {} of {}: {} tensors, {} shard{}, {} ({} B) in {:.3f} s: {:.2f} GB/s, "
                 "transport {}\n",
                 rank, world.world_size, result.catalogue.tensors.size(), shards,
                 shards == 1 ? "" : "s", format_bytes(result.stats.bytes), result.stats.bytes,
                 result.stats.seconds, result.stats.gbps(), result.stats.transport);
    }
    const std::string report_path = report_path_for_rank(args.report_path, rank,
                                                         world.world_size);
    if (!report_path.empty()) {
      write_report(report_path, result, digests, rank, world.world_size, peak_rss_bytes());
      if (!args.json && !args.quiet) fmt::print("# report written to {}\n", report_path);
    }
    std::fflush(stdout);

    RankReport report{rank, result.stats.bytes, result.stats.seconds, digests};
    Verdict verdict;
    if (rank == 0) {
      verdict = judge(control->gather(std::move(report)), result.catalogue, config.verify,
                      digest_seconds);
    } else {
      control->gather(std::move(report));
    }
    verdict = control->finish(std::move(verdict));
    // --json: every rank's summary line, rank 0's with the verdict, whatever it says (a JSON
    // reader gets the mismatches too; the error line and status follow).
    if (args.json) {
      print_json_summary(result, config, shards, rank, world.world_size, peak_rss_bytes(),
                         rank == 0 ? verdict.message : std::string());
      std::fflush(stdout);
    }
    if (verdict.status != 0) {
      // The mismatch list is rank 0's to print; the others end with its status and say where
      // to look, so a job of N ranks does not print the list N times.
      throw RemoteAbort(static_cast<Errc>(verdict.status),
                        rank == 0 ? "rank 0: " + verdict.message
                                  : fmt::format("rank {}: rank 0 found tensor mismatches "
                                                "between the ranks (its message lists them)",
                                                rank));
    }
    if (!args.json && rank == 0) fmt::print("# {}\n", printable(verdict.message));
    std::fflush(stdout);
    // The job has ended only once every process has: a rank stopped or hung from here on
    // would hold mpirun, or launch, forever. MPI_Finalize waits for every rank (Open MPI's
    // fence), so it is bounded like MPI_Init_thread; then rank 0 waits, as long again, for
    // the others to hang up, and fails (mpirun then ends them) if one does not.
    honour_stop_after_verdict_hook(rank);
    // nccl: ncclCommFinalize waits for every rank (bounded, 10 s, then ncclCommAbort), so
    // every rank shuts its transport down before rank 0 waits for the hang-ups below.
    transport.reset();
    if (mpi) {
      InitWatchdog watchdog(*control, rank, config.timeout, "MPI_Finalize");
      mpi.reset();
    }
    control->await_hangups(config.timeout);
    return 0;
  } catch (const RemoteAbort&) {
    if (mpi) mpi->abandon();
    throw;
  } catch (const Error& e) {
    if (control->ending() && !control->aborted()) {
      // Another rank's ABORT, or a lost peer, is ending this process on the control plane's
      // thread, which printed why; this is the load stopping for it (on_ending). That thread
      // exits the process; this one says nothing.
      std::this_thread::sleep_for(std::chrono::seconds(15));
    }
    Error mine = prefixed(e, e.code());
    if (e.code() == Errc::timeout) {
      // A stall: rank 0, if it answers, names the rank behind it; else say what this rank
      // knows (whether rank 0 answers, the chunks landed).
      control->defer_to_root(root_grace(config.timeout));
      mine = Error(Errc::timeout, fmt::format("{}; {}", mine.what(), control->stall_report()));
    }
    control->abort(mine);
    report_failure(mine, interrupts);
    control->linger(linger_most(config.timeout));
    if (mpi) mpi->abandon();
    throw Reported(mine.code(), mine.what());
  } catch (const std::exception& e) {
    Error mine = prefixed(e, Errc::internal);
    control->abort(mine);
    report_failure(mine, interrupts);
    control->linger(linger_most(config.timeout));
    if (mpi) mpi->abandon();
    throw Reported(mine.code(), mine.what());
  }
}

}  // namespace

TransportKind transport_for_world(const Config& config, bool host_device, int world_size) {
  switch (config.transport) {
    case TransportKind::local:
      throw Error(Errc::config,
                  fmt::format("transport: local moves no bytes between processes; a world of {} "
                              "ranks needs transport mpi (device host) or nccl (device cuda)",
                              world_size));
    case TransportKind::mpi:
      WEIGHTCAST_EXPECT(host_device, Errc::config,
                        "transport: mpi broadcasts host memory, but the device is cuda (set "
                        "device: host, or transport: nccl)");
      return TransportKind::mpi;
    case TransportKind::nccl:
      WEIGHTCAST_EXPECT(!host_device, Errc::config,
                        "transport: nccl broadcasts GPU memory, but the device is host (set "
                        "device: cuda or auto on a GPU machine, or transport: mpi)");
      return TransportKind::nccl;
    case TransportKind::automatic:
      return host_device ? TransportKind::mpi : TransportKind::nccl;
  }
  return TransportKind::mpi;
}

int run_ranks(const RunArgs& args, const Config& config, const World& world,
              InterruptHandler& interrupts) {
  try {
    return run_ranks_or_throw(args, config, world, interrupts);
  } catch (const Error& e) {
    // Printed here rather than by main() (unless printed already): after the message, linger
    // a moment before the exit, because mpirun drops output it has not forwarded when it
    // tears a job down on the first non-zero exit, and this rank's message must reach the
    // user. mpirun's SIGTERM meanwhile ends it with this status, silently.
    if (dynamic_cast<const Reported*>(&e) == nullptr) report_failure(e, interrupts);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return exit_status(e.code());
  }
}

}  // namespace weightcast::cli
