// A data-parallel trainer's start on N ranks: every rank gets the same checkpoint, read by
// rank 0 alone and broadcast over MPI into each rank's host memory, with one library call,
// weightcast::run_job. Run it under mpirun:
//
//   mpirun -n 3 distributed_trainer [--comm world|dup|reversed] [--port P] [--digests DIR] CKPT
//
//   --comm world     weightcast finds the world in mpirun's environment and initialises MPI
//                    itself (and finalises it)
//   --comm dup       (default) the trainer initialises MPI and hands weightcast a communicator
//                    of its own (MPI_Comm_dup of MPI_COMM_WORLD); weightcast uses that MPI and
//                    leaves it initialised
//   --comm reversed  as dup, with the ranks in reverse order (MPI_Comm_split): the
//                    communicator's rank 0 is the last process, and it reads the checkpoint
//   --port P         rank 0's control-plane port (default: rendezvous.port's)
//   --digests DIR    each rank writes DIR/rank-R.digests: "NAME XXH3" per tensor it holds
//
// Each rank prints "rank R of N: T tensors, B bytes; VERDICT", R its rank in the job's
// communicator, and with dup or reversed "(MPI_COMM_WORLD rank W)".
#include <weightcast/pipeline/digest.hpp>
#include <weightcast/core/error.hpp>
#include <weightcast/core/settings.hpp>
#include <weightcast/distributed/job.hpp>
#include <weightcast/transport/mpi.hpp>

#include <mpi.h>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>

namespace {

struct Args {
  std::string comm = "dup";
  int port = static_cast<int>(weightcast::setting::rendezvous_port.default_value);
  std::string digests_dir;
  std::string checkpoint;
};

bool parse(int argc, char** argv, Args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--comm" || arg == "--port" || arg == "--digests") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--comm") args.comm = value;
      if (arg == "--digests") args.digests_dir = value;
      if (arg == "--port") {
        const auto [end, error] =
            std::from_chars(value.data(), value.data() + value.size(), args.port);
        if (error != std::errc{} || end != value.data() + value.size() || args.port < 1 ||
            args.port > 65535) {
          return false;
        }
      }
    } else if (!arg.empty() && arg[0] != '-' && args.checkpoint.empty()) {
      args.checkpoint = arg;
    } else {
      return false;
    }
  }
  return !args.checkpoint.empty() &&
         (args.comm == "world" || args.comm == "dup" || args.comm == "reversed");
}

// The load; the caller owns MPI (or, with --comm world, weightcast does).
// world_rank: this process's rank in MPI_COMM_WORLD, or -1 where MPI is weightcast's.
void load(const Args& args, std::optional<MPI_Comm> comm, int world_rank) {
  weightcast::JobOptions options;
  options.checkpoint = args.checkpoint;  // read where the job's rank 0 runs; ignored elsewhere
  options.device = weightcast::DeviceKind::host;
  options.transport = weightcast::TransportKind::mpi;
  if (comm) options.mpi_communicator = weightcast::mpi_communicator(*comm);
  weightcast::RendezvousOptions rendezvous;  // rank 0 on this host (mpirun -n N, one node)
  rendezvous.port = static_cast<std::uint16_t>(args.port);
  options.rendezvous = rendezvous;
  // Chunks of 256 KiB: host RAM on rank 0 stays chunk_bytes × buffer_depth, whatever the
  // checkpoint's size, and a small checkpoint still streams as several broadcasts.
  options.load.chunk_bytes = 256 << 10;
  // A failure while an MPI broadcast is in flight cannot be unwound: the default policy
  // (FailurePolicy::end_process) logs it to stderr and ends the process with its
  // <sysexits.h> status. Every other failure throws, on every rank: main() catches it.

  const weightcast::JobResult result = weightcast::run_job(options);
  const int rank = result.world.rank;
  std::printf("rank %d of %d: %zu tensors, %llu bytes; %s", rank, result.world.world_size,
              result.load.catalogue.tensors.size(),
              static_cast<unsigned long long>(result.load.stats.bytes),
              result.verdict.message.c_str());
  if (world_rank >= 0) std::printf(" (MPI_COMM_WORLD rank %d)", world_rank);
  std::printf("\n");
  if (!args.digests_dir.empty()) {
    // What landed in this rank's host memory, hashed here (not the job's own digests).
    const auto digests = weightcast::tensor_digests(result.load);
    std::ofstream out(std::filesystem::path(args.digests_dir) /
                      ("rank-" + std::to_string(rank) + ".digests"));
    for (std::size_t i = 0; i < digests.size(); ++i) {
      out << result.load.catalogue.tensors[i].name << ' '
          << weightcast::digest_hex(digests[i]) << '\n';
    }
    if (!out) throw std::runtime_error("cannot write the digests to " + args.digests_dir);
  }
}

// After a failure weightcast threw (it throws only where MPI is still usable: see
// job.hpp, "The failure model"), the trainer ends the MPI it started.
void finalize_own_mpi(const Args& args) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (args.comm != "world" && initialized && !finalized) MPI_Finalize();
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, args)) {
    std::fprintf(stderr, "usage: mpirun -n N distributed_trainer [--comm world|dup|reversed] "
                         "[--port P] [--digests DIR] CHECKPOINT\n");
    return 64;
  }
  try {
    if (args.comm == "world") {
      load(args, std::nullopt, -1);
      return 0;
    }

    // The trainer's own MPI: initialised before weightcast runs, finalised after it.
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm comm = MPI_COMM_NULL;
    if (args.comm == "dup") {
      MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    } else {
      MPI_Comm_split(MPI_COMM_WORLD, 0, world_size - 1 - world_rank, &comm);
    }
    load(args, comm, world_rank);
    // The trainer's communicator is its own again: the job broadcast on a duplicate of it,
    // so this collective cannot match one of the job's.
    MPI_Barrier(comm);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
  } catch (const weightcast::Error& e) {
    // Thrown on every rank with the failing rank's message: "rank 2: ...". Its <sysexits.h>
    // status: 66 for a missing checkpoint, 69 for a lost rank, 75 for a stall, ...
    std::fprintf(stderr, "distributed_trainer: %s\n", e.what());
    finalize_own_mpi(args);
    return weightcast::exit_status(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_trainer: %s\n", e.what());
    finalize_own_mpi(args);
    return 70;
  }
}
