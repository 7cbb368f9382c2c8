// `weightcast run` with more than one rank: the job itself is the library's (run_job,
// weightcast/distributed/job.hpp); this file prints what each rank reports and ends with the job's status.
#include "commands.hpp"
#include "interrupt.hpp"
#include "progress.hpp"
#include "test_hooks.hpp"

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/control/control_plane.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/distributed/job.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/core/log.hpp"
#include "weightcast/control/world.hpp"

#include <fmt/core.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

namespace weightcast::cli {
namespace {

/// Prints this rank's failure; from now on a signal (mpirun ending the failed job) ends the
/// process with its status and no second line.
void report_failure(const Error& e, InterruptHandler& interrupts) {
  interrupts.failing(exit_status(e.code()));
  std::fflush(stdout);
  eprint("weightcast: error: {}\n", printable(e.what()));
  std::fflush(stderr);
}

}  // namespace

TransportKind transport_for_world(const Config& config, bool host_device, int world_size,
                                  bool mpi_world) {
  return resolve_transport(config.transport, host_device, std::max(world_size, 2), mpi_world);
}

int run_ranks(const RunArgs& args, const Config& config, const World& world,
              InterruptHandler& interrupts) {
  const int rank = world.rank;
  interrupts.set_rank(rank);
  std::atomic<bool> printed{false};
  try {
    if (rank == 0) {
      WEIGHTCAST_EXPECT(!config.checkpoint.empty(), Errc::config,
                        "rank 0: checkpoint: not set (give it in the config or with --set "
                        "checkpoint=PATH)");
    }
    JobOptions job = JobOptions::from_config(config, world);
    // The message is printed as soon as this rank knows it, before the waits that let the
    // other ranks learn of it: mpirun drops output it has not forwarded when it tears a job
    // down on the first non-zero exit, and this rank's message must reach the user.
    job.on_failure = [&](const Error& e) {
      report_failure(e, interrupts);
      printed = true;
    };
    job.before_exit = [](const Error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    };
    // From the rendezvous on an interrupt outside the load sends its ABORT over the control
    // plane. Ranks other than 0 never touch the checkpoint path; before the load (and, on
    // rank 0, before the catalogue) a report or trace this rank cannot write ends the job,
    // every rank with this rank's message.
    job.on_control_plane = [&](ControlPlane* control) {
      interrupts.attach(control);
      if (control != nullptr) check_output_paths(args, config, rank, world.world_size);
    };
    std::size_t shards = 0;
    job.on_catalogue = [&](const Catalogue& catalogue) {
      check_outputs_spare_checkpoint(args, config, catalogue, rank, world.world_size);
    };
    // Rank 0 shows the load's progress as `run` does alone, as plain lines whatever stderr
    // is: the other ranks' lines would break a redrawn bar.
    std::optional<ProgressRenderer> progress;
    if (rank == 0 && !args.quiet) {
      progress.emplace(stderr, ProgressRenderer::Mode::lines, std::chrono::steady_clock::now(),
                       "weightcast[rank 0]");
    }
    job.load.on_progress = [&progress](const LoadProgress& p) {
      if (progress) progress->update(p);
    };
    add_load_hooks(job, config, rank, world.world_size, interrupts);
    job.test_hooks = test_hooks::job(rank);

    // Each rank's own summary; the job's verdict is rank 0's alone, printed once below.
    job.on_loaded = [&](const JobResult& r) {
      const LoadResult& result = r.load;
      shards = result.catalogue.shards.size();
      if (!args.json) {
        fmt::print("# rank {} of {}: {} tensors, {} shard{}, {} ({} B) in {:.3f} s: {:.2f} "
                   "GB/s, transport {}{}\n",
                   rank, world.world_size, result.catalogue.tensors.size(), shards,
                   shards == 1 ? "" : "s", format_bytes(result.stats.bytes), result.stats.bytes,
                   result.stats.seconds, result.stats.gbps(), result.stats.transport,
                   result.stats.node_reads.empty()
                       ? std::string()
                       : fmt::format(" ({} reads)", result.stats.node_reads));
        // The promise of the front page, measured: rank 0's memory is the window plus what
        // it keeps itself, not the model. Not a "# rank " line: those are one per rank.
        if (rank == 0) {
          fmt::print("# memory on rank 0: peak RSS {} against a window of {} (chunk_size {} × "
                     "buffer_depth {}) plus its own {}; the model is {}\n",
                     format_bytes(peak_rss_bytes()), format_bytes(result.stats.staging_bytes),
                     format_bytes(config.chunk_bytes), config.buffer_depth,
                     format_bytes(result.stats.bytes),
                     format_bytes(result.catalogue.total_bytes()));
        }
      }
      const std::string report_path = report_path_for_rank(args.report_path, rank,
                                                           world.world_size);
      if (!report_path.empty()) {
        write_report(report_path, result, r.digests, rank, world.world_size, peak_rss_bytes());
        if (!args.json && !args.quiet) fmt::print("# report written to {}\n", report_path);
      }
      std::fflush(stdout);
    };
    // --json: every rank's summary line, rank 0's with the verdict, whatever it says (a JSON
    // reader gets the mismatches too; the error line and status follow).
    job.on_verdict = [&](const JobResult& r) {
      if (args.json) {
        print_json_summary(r.load, config, shards, rank, world.world_size, peak_rss_bytes(),
                           rank == 0 ? r.verdict.message : std::string());
      } else if (rank == 0 && r.verdict.status == 0) {
        fmt::print("# {}\n", printable(r.verdict.message));
      }
      std::fflush(stdout);
    };
    run_job(job);
    return 0;
  } catch (const Error& e) {
    // Printed here unless printed already (on_failure): after the message, linger a moment
    // before the exit, because mpirun drops output it has not forwarded when it tears a job
    // down on the first non-zero exit. mpirun's SIGTERM meanwhile ends it with this status,
    // silently.
    if (!printed) report_failure(e, interrupts);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return exit_status(e.code());
  }
}

}  // namespace weightcast::cli
