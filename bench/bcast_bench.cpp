// Host-mode broadcast throughput: weightcast's loader with the mpi transport against a plain
// MPI_Bcast of the same bytes with the same chunking, in the same run (nccl-tests style).
//
//   mpirun -np 3 build/bcast_bench CHECKPOINT [chunk_size] [iterations]
//
// Rank 0 opens CHECKPOINT and sends the catalogue to the others with MPI_Bcast (the bench's
// own control channel); then, per iteration, every rank runs `weightcast::load` (read,
// upload and broadcast stages) and a loop of
// MPI_Bcast over the same chunk sizes into a buffer of the same size. It prints the whole
// load and the broadcast stage alone (the sum, on rank 0, of each chunk's broadcast from post
// to completion: the time the stage was busy, not waiting on reads). #wrong counts ranks
// whose arena's XXH3-64 differs from rank 0's. busbw = algbw for broadcast (nccl-tests).
#include "weightcast/catalogue_wire.hpp"
#include "weightcast/checkpoint.hpp"
#include "weightcast/config.hpp"
#include "weightcast/device.hpp"
#include "weightcast/digest.hpp"
#include "weightcast/error.hpp"
#include "weightcast/loader.hpp"
#include "weightcast/log.hpp"
#include "weightcast/transport_mpi.hpp"

#include <fmt/core.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

using namespace weightcast;

namespace {

std::string share_catalogue(int rank, const std::string& path) {
  std::string bytes;
  if (rank == 0) bytes = encode_catalogue(open_checkpoint(path));
  std::uint64_t size = bytes.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  bytes.resize(size);
  MPI_Bcast(bytes.data(), static_cast<int>(size), MPI_BYTE, 0, MPI_COMM_WORLD);
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: mpirun -np N bcast_bench CHECKPOINT [chunk_size] [iterations]\n");
    return 64;
  }
  try {
    MpiSession session;
    const int rank = session.rank();
    configure_log(LogLevel::warn, rank);
    const std::uint64_t chunk_bytes = argc > 2 ? parse_size(argv[2], "chunk_size") : 16ull << 20;
    const int iterations = argc > 3 ? std::atoi(argv[3]) : 5;
    auto transport = make_mpi_transport(session);
    auto device = make_host_device();
    const std::string wire = share_catalogue(rank, argv[1]);
    Catalogue catalogue = decode_catalogue(wire, "catalogue");
    if (rank == 0) catalogue = open_checkpoint(argv[1]);  // rank 0 needs the shard paths

    LoadOptions options;
    options.chunk_bytes = chunk_bytes;
    // The broadcast stage alone: on rank 0, each chunk's broadcast runs from its post (the
    // chunk is in the arena) to its completion on this rank, so the sum of those spans is
    // the time the stage was busy, without the read and upload stages it waits on.
    double broadcast_busy = 0;
    options.on_stage_event = [&](const StageEvent& event) {
      if (event.stage == Stage::broadcast) {
        broadcast_busy += std::chrono::duration<double>(event.end - event.begin).count();
      }
    };
    const ArenaLayout layout = layout_arena(catalogue);
    const Plan plan = make_plan(catalogue, layout, chunk_bytes);
    // Two raw baselines: into fresh memory each iteration, as the loader's arena is (a
    // receiver pays the first touch of every page: ~1 s/GiB on a small VM), and into memory
    // faulted in once (the MPI_Bcast bandwidth alone).
    std::vector<std::byte> warm(plan.total_bytes);

    double best_loader = 1e30;
    double best_stage = 1e30;
    double best_raw = 1e30;
    double best_warm = 1e30;
    int wrong = 0;
    for (int i = 0; i <= iterations; ++i) {  // iteration 0 warms up page cache and MPI
      MPI_Barrier(MPI_COMM_WORLD);
      broadcast_busy = 0;
      auto start = std::chrono::steady_clock::now();
      LoadResult result = load(catalogue, *device, *transport, options);
      MPI_Barrier(MPI_COMM_WORLD);
      const double loader_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

      std::uint64_t digest = xxh3_64(result.arena->data(), result.arena->bytes());
      std::uint64_t root_digest = digest;
      MPI_Bcast(&root_digest, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
      int mine_wrong = digest != root_digest ? 1 : 0;
      int all_wrong = 0;
      MPI_Reduce(&mine_wrong, &all_wrong, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);

      auto raw_loop = [&](std::byte* buffer) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto begin = std::chrono::steady_clock::now();
        for (const Chunk& chunk : plan.chunks) {
          MPI_Bcast(buffer + chunk.arena_offset, static_cast<int>(chunk.bytes), MPI_BYTE, 0,
                    MPI_COMM_WORLD);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      };
      double raw_s = 0;
      {
        auto fresh = make_host_arena(plan.total_bytes);  // the loader's own kind of arena
        raw_s = raw_loop(fresh->data());
      }
      const double warm_s = raw_loop(warm.data());
      if (i > 0) {
        best_loader = std::min(best_loader, loader_s);
        best_stage = std::min(best_stage, broadcast_busy);
        best_raw = std::min(best_raw, raw_s);
        best_warm = std::min(best_warm, warm_s);
        wrong += all_wrong;
      }
    }
    if (rank == 0) {
      const double bytes = static_cast<double>(plan.total_bytes);
      fmt::print("# bcast_bench: {} ranks, {} bytes in {} chunks of <= {}, best of {} "
                 "iterations after 1 warm-up\n",
                 session.world_size(), plan.total_bytes, plan.chunks.size(),
                 format_bytes(chunk_bytes), iterations);
      fmt::print("# {:>12} {:>12} {:>10} {:>10} {:>7}  {}\n", "size(B)", "time(us)", "algbw",
                 "busbw", "#wrong", "what");
      fmt::print("  {:>12} {:>12.0f} {:>10.2f} {:>10.2f} {:>7}  weightcast load (mpi)\n",
                 plan.total_bytes, best_loader * 1e6, bytes / best_loader / 1e9,
                 bytes / best_loader / 1e9, wrong);
      fmt::print("  {:>12} {:>12.0f} {:>10.2f} {:>10.2f} {:>7}  weightcast broadcast stage "
                 "(rank 0)\n",
                 plan.total_bytes, best_stage * 1e6, bytes / best_stage / 1e9,
                 bytes / best_stage / 1e9, wrong);
      fmt::print("  {:>12} {:>12.0f} {:>10.2f} {:>10.2f} {:>7}  MPI_Bcast, same chunks, fresh "
                 "arena\n",
                 plan.total_bytes, best_raw * 1e6, bytes / best_raw / 1e9, bytes / best_raw / 1e9,
                 "-");
      fmt::print("  {:>12} {:>12.0f} {:>10.2f} {:>10.2f} {:>7}  MPI_Bcast, same chunks, "
                 "pre-faulted buffer\n",
                 plan.total_bytes, best_warm * 1e6, bytes / best_warm / 1e9,
                 bytes / best_warm / 1e9, "-");
      fmt::print("# ratio weightcast / MPI_Bcast (fresh arena): whole load {:.3f}, broadcast "
                 "stage {:.3f}; broadcast stage / pre-faulted MPI_Bcast {:.3f}\n",
                 best_raw / best_loader, best_raw / best_stage, best_warm / best_stage);
    }
    return wrong == 0 ? 0 : 1;
  } catch (const Error& e) {
    fmt::print(stderr, "bcast_bench: error: {}\n", e.what());
    return exit_status(e.code());
  }
}
