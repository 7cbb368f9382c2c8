// A trainer's process under `mpirun -np N` that initialises MPI itself and then runs a job
// (weightcast/distributed/job.hpp) on it: tests/distributed/test_job.cpp starts it. Usage:
//   mpi_job MODE CHECKPOINT PORT OUT_DIR
// MODE: world    - MPI_Init_thread here, no communicator handed in: the job must use MPI as
//                  it is, neither initialise nor finalise it;
//       split    - a communicator of this program's (MPI_COMM_WORLD split with the ranks
//                  reversed) handed in: the job's ranks are the communicator's;
//       split-fsdp - split, with placement fsdp: the point-to-point slices go between the
//                  communicator's ranks too (each line then holds a local shard's digest);
//       mismatch - MPI_COMM_WORLD handed in, world rank 1 with another chunk_size: every rank
//                  must throw (config, 78) before any collective, and MPI stay usable.
//       slow-dup - rank 0 stays 300 ms inside the watched MPI_Comm_dup after it returned, and
//                  rank 1 fails (config, 78) as soon as it is out: rank 0 must throw the
//                  failure as the others do, not be ended by the job's watchdog.
// Each rank writes OUT_DIR/r<world rank>.txt: "job_rank <r> of <n>", then "<tensor> <xxh3>"
// per tensor (or "error <status> <message>"), and afterwards proves MPI still works
// (MPI_Allreduce, then its own MPI_Finalize). Exit status 0 unless something here failed.
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/distributed/job.hpp"
#include "weightcast/transport/mpi.hpp"

#include <fmt/core.h>
#include <fmt/os.h>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: mpi_job world|split|split-fsdp|mismatch|slow-dup CHECKPOINT PORT "
                 "OUT_DIR\n");
    return 64;
  }
  const std::string_view mode = argv[1];
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return 69;
  int world_rank = 0;
  int world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);

  MPI_Comm split = MPI_COMM_NULL;
  weightcast::JobOptions job;
  job.device = weightcast::DeviceKind::host;
  job.load.timeout = std::chrono::seconds(60);
  job.load.chunk_bytes = 64 << 10;
  weightcast::RendezvousOptions rendezvous;
  rendezvous.port = static_cast<std::uint16_t>(std::stoi(argv[3]));
  rendezvous.timeout = std::chrono::seconds(60);
  job.rendezvous = rendezvous;
  job.checkpoint = argv[2];
  if (mode == "split-fsdp") job.placement.mode = weightcast::PlacementMode::fsdp;
  if (mode == "split" || mode == "split-fsdp") {
    MPI_Comm_split(MPI_COMM_WORLD, 0, world_size - 1 - world_rank, &split);
    job.mpi_communicator = weightcast::mpi_communicator(split);
    // Only the communicator's rank 0 (world rank N-1) may need the checkpoint.
    if (world_rank != world_size - 1) job.checkpoint = "/nonexistent/checkpoint";
  } else if (mode == "mismatch") {
    job.mpi_communicator = weightcast::mpi_communicator(MPI_COMM_WORLD);
    if (world_rank == 1) job.load.chunk_bytes = 128 << 10;
  } else if (mode == "slow-dup") {
    job.test_hooks.inside_mpi_open = [world_rank] {
      if (world_rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    };
    job.wants = [](const weightcast::Catalogue& catalogue, int rank, int size) {
      if (rank == 1) throw weightcast::Error(weightcast::Errc::config, "mpi_job: no wants here");
      return weightcast::resolve_placement({}, catalogue, rank, size);
    };
  } else if (mode != "world") {
    std::fprintf(stderr, "mpi_job: unknown mode %s\n", argv[1]);
    return 64;
  }

  int failed_here = 0;
  auto out = fmt::output_file(fmt::format("{}/r{}.txt", argv[4], world_rank));
  try {
    const weightcast::JobResult result = weightcast::run_job(job);
    out.print("job_rank {} of {}\n", result.world.rank, result.world.world_size);
    out.print("verdict {}\n", result.verdict.message);
    if (result.load.placed) {
      const auto digests = weightcast::local_digests(result.load);
      for (std::size_t i = 0; i < digests.size(); ++i) {
        out.print("{} {}\n", result.load.wants.tensors[i].tensor,
                  weightcast::digest_hex(digests[i]));
      }
    } else {
      const auto digests = weightcast::tensor_digests(result.load);
      for (std::size_t i = 0; i < digests.size(); ++i) {
        out.print("{} {}\n", result.load.catalogue.tensors[i].name,
                  weightcast::digest_hex(digests[i]));
      }
    }
  } catch (const weightcast::Error& e) {
    out.print("error {} {}\n", weightcast::exit_status(e.code()), e.what());
    failed_here = mode == "mismatch" || mode == "slow-dup" ? 0 : 1;
  }
  // The caller's MPI is still usable: a collective of its own, then its own MPI_Finalize
  // (which would fail had the job finalised MPI).
  int sum = 0;
  const int one = 1;
  if (MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS ||
      sum != world_size) {
    failed_here = 1;
  }
  out.print("allreduce {}\n", sum);
  out.close();
  if (split != MPI_COMM_NULL) MPI_Comm_free(&split);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) return 70;  // the job finalised the caller's MPI
  MPI_Finalize();
  return failed_here;
}
