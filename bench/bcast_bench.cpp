// Host-mode broadcast throughput: weightcast's loader with the mpi transport against a plain
// MPI_Bcast of the same bytes with the same chunking, in the same run (nccl-tests style).
//
//   mpirun -np 3 build/bcast_bench CHECKPOINT [chunk_size] [iterations] [direct_io]
//
// Rank 0 opens CHECKPOINT and sends the catalogue to the others with MPI_Bcast (the bench's
// own control channel); then, per iteration, every rank runs `weightcast::load` (read,
// upload and broadcast stages) and two loops of MPI_Bcast over the same chunks of the same
// bytes: rank 0 sends from the arena it just loaded, the others receive into a fresh arena
// (as the loader's are) or into a buffer faulted in once; and a third time into a fresh arena
// while rank 0 also reads the checkpoint on a second thread, which is what the broadcast stage
// meets in a load (the read competes with the broadcast for cores and memory bandwidth;
// a plain MPI_Bcast loop does not). It prints the whole load and the
// broadcast stage alone: the wall time during which at least one chunk's broadcast was in
// flight, a chunk's broadcast running from its post on rank 0 (the chunk is in rank 0's
// arena) to its landing on the last other rank (all ranks share one node and so one
// steady clock). That is the time the stage was busy, not waiting on reads. A second row
// ends each span where rank 0 saw its own broadcast complete, which lags whenever rank 0's
// thread is busy queueing a read. #wrong counts ranks whose buffer's XXH3-64 differs from
// rank 0's. busbw = algbw for broadcast (nccl-tests). cpu(s) is the CPU time (user + system)
// of all ranks together, so cpu / time is how many cores the job kept busy. "rank 0 alone"
// is the same load at world size 1 while the other ranks wait (its cpu(s) is rank 0's):
// the whole load can be no faster, and where it is as fast the broadcast cost nothing.
#include "weightcast/checkpoint/catalogue_wire.hpp"
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/core/log.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include <fmt/core.h>
#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace weightcast;

namespace {

using Clock = std::chrono::steady_clock;
using Span = std::pair<Clock::time_point, Clock::time_point>;

std::string share_catalogue(int rank, const std::string& path) {
  std::string bytes;
  if (rank == 0) bytes = encode_catalogue(open_checkpoint(path));
  std::uint64_t size = bytes.size();
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  bytes.resize(size);
  MPI_Bcast(bytes.data(), static_cast<int>(size), MPI_BYTE, 0, MPI_COMM_WORLD);
  return bytes;
}

/// Seconds covered by the union of `spans` (broadcasts in flight together count once).
double union_seconds(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0;
  Clock::time_point begin = spans.empty() ? Clock::time_point{} : spans.front().first;
  Clock::time_point end = begin;
  for (const auto& [b, e] : spans) {
    if (b > end) {
      total += std::chrono::duration<double>(end - begin).count();
      begin = b;
    }
    end = std::max(end, e);
  }
  return total + std::chrono::duration<double>(end - begin).count();
}

/// On rank 0: each chunk's broadcast from its post on rank 0 to its landing on the last
/// other rank (`spans` on every rank: this rank's post and completion per chunk). The ranks
/// must share a node: steady_clock is then one clock (CLOCK_MONOTONIC) for all of them.
std::vector<Span> spans_to_last_landing(int rank, const std::vector<Span>& spans) {
  std::vector<std::int64_t> landed(spans.size(), 0), last(spans.size(), 0);
  if (rank != 0) {
    for (std::size_t c = 0; c < spans.size(); ++c) {
      landed[c] = spans[c].second.time_since_epoch().count();
    }
  }
  MPI_Reduce(landed.data(), last.data(), static_cast<int>(spans.size()), MPI_INT64_T, MPI_MAX,
             0, MPI_COMM_WORLD);
  if (rank != 0) return {};
  std::vector<Span> result;
  for (std::size_t c = 0; c < spans.size(); ++c) {
    const Clock::time_point end{Clock::duration(last[c])};
    // One rank alone: nothing lands elsewhere; keep rank 0's own span.
    result.emplace_back(spans[c].first, last[c] == 0 ? spans[c].second : end);
  }
  return result;
}

/// This process's CPU time so far (user + system), seconds.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

/// `mine` summed over every rank (the result is meaningful on rank 0).
double sum_over_ranks(double mine) {
  double all = 0;
  MPI_Reduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  return all;
}

/// How many ranks' `data` has an XXH3-64 different from rank 0's (meaningful on rank 0).
int count_wrong(const std::byte* data, std::uint64_t bytes) {
  const std::uint64_t digest = xxh3_64(data, bytes);
  std::uint64_t root_digest = digest;
  MPI_Bcast(&root_digest, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  int mine = digest != root_digest ? 1 : 0;
  int all = 0;
  MPI_Reduce(&mine, &all, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  return all;
}

/// Mean seconds of one span.
double mean_seconds(const std::vector<Span>& spans) {
  double total = 0;
  for (const auto& [begin, end] : spans) total += std::chrono::duration<double>(end - begin).count();
  return spans.empty() ? 0 : total / static_cast<double>(spans.size());
}

/// The best (shortest) iteration of one measured row, with the CPU time it took (or, for the
/// broadcast stage, the mean time of one chunk's broadcast).
struct Row {
  double seconds = 1e30;
  double cpu = 0;
  int wrong = 0;
  void add(double s, double c, int w) {
    if (s < seconds) {
      seconds = s;
      cpu = c;
    }
    wrong += w;
  }
};

void print_row(const char* what, std::uint64_t bytes, const Row& row, bool with_cpu) {
  const double gbps = static_cast<double>(bytes) / row.seconds / 1e9;
  fmt::print("  {:>12} {:>12.0f} {:>10.2f} {:>10.2f} {:>7} {:>7}  {}\n", bytes,
             row.seconds * 1e6, gbps, gbps, row.wrong,
             with_cpu ? fmt::format("{:.3f}", row.cpu) : std::string("-"), what);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr,
               "usage: mpirun -np N bcast_bench CHECKPOINT [chunk_size] [iterations] "
               "[direct_io: auto|on|off]\n");
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
    // direct_io as a config says it (auto, on, off), read by the config's own parser.
    if (argc > 4) {
      options.direct_io = load_config("", {fmt::format("direct_io={}", argv[4])}).direct_io;
    }
    const ArenaLayout layout = layout_arena(catalogue);
    const Plan plan = make_plan(catalogue, layout, chunk_bytes);
    // The broadcast stage alone: each chunk's broadcast, from its post on this rank to its
    // completion on this rank, per chunk.
    std::vector<Span> broadcast_spans(plan.chunks.size());
    options.on_stage_event = [&](const StageEvent& event) {
      if (event.stage == Stage::broadcast) broadcast_spans[event.chunk] = {event.begin, event.end};
    };
    // Both raw baselines send the checkpoint's bytes from rank 0's loaded arena, as the
    // loader does. (Never-written memory would map the kernel's one shared zero page, which
    // is always in cache, and flatter the baseline.) Receivers use a fresh arena of the
    // loader's own kind each iteration (they pay the first touch of every page, as the
    // loader's do), or a buffer faulted in once (the MPI_Bcast bandwidth alone).
    std::vector<std::byte> warm(rank == 0 ? 0 : plan.total_bytes);

    Row loader_row, stage_row, root_stage_row, raw_row, reading_row, warm_row, alone_row;
    auto local = make_local_transport();
    LoadOptions alone_options = options;
    alone_options.on_stage_event = nullptr;
    for (int i = 0; i <= iterations; ++i) {  // iteration 0 warms up page cache and MPI
      MPI_Barrier(MPI_COMM_WORLD);
      std::fill(broadcast_spans.begin(), broadcast_spans.end(), Span{});
      const double cpu_before = cpu_seconds();
      const auto start = Clock::now();
      LoadResult result = load(catalogue, *device, *transport, options);
      MPI_Barrier(MPI_COMM_WORLD);
      const double loader_s = std::chrono::duration<double>(Clock::now() - start).count();
      const double loader_cpu = sum_over_ranks(cpu_seconds() - cpu_before);
      const int loader_wrong = count_wrong(result.arena->data(), plan.total_bytes);
      const std::vector<Span> landed_spans = spans_to_last_landing(rank, broadcast_spans);

      // `reading`: rank 0 also runs rank 0 alone's load (reads the checkpoint into an arena of
      // its own, no MPI) on a second thread for the whole loop, as the loader's read stage
      // runs beside its broadcasts. The two then share the machine's cores and memory
      // bandwidth, which is what the broadcast stage meets in a load.
      auto raw_loop = [&](std::byte* buffer, Row& row, bool reading) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double cpu_begin = cpu_seconds();
        const auto begin = Clock::now();
        std::thread reader;
        std::exception_ptr reader_failure;
        if (reading && rank == 0) {
          reader = std::thread([&] {
            try {
              load(catalogue, *device, *local, alone_options);
            } catch (...) {
              reader_failure = std::current_exception();
            }
          });
        }
        for (const Chunk& chunk : plan.chunks) {
          MPI_Bcast(buffer + chunk.arena_offset, static_cast<int>(chunk.bytes), MPI_BYTE, 0,
                    MPI_COMM_WORLD);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        if (reader.joinable()) reader.join();
        if (reader_failure) std::rethrow_exception(reader_failure);
        const double cpu = sum_over_ranks(cpu_seconds() - cpu_begin);
        const int wrong = count_wrong(buffer, plan.total_bytes);
        if (i > 0) row.add(seconds, cpu, wrong);
      };
      for (Row* row : {&raw_row, &reading_row}) {
        auto fresh = make_host_arena(rank == 0 ? 0 : plan.total_bytes);  // the loader's kind
        raw_loop(rank == 0 ? result.arena->data() : fresh->data(), *row, row == &reading_row);
      }
      raw_loop(rank == 0 ? result.arena->data() : warm.data(), warm_row, false);
      // Rank 0 alone: the same load with no broadcast (world size 1), while the others wait.
      // The whole load can be no faster; the gap between the two is what broadcasting cost.
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) {
        const double cpu_begin = cpu_seconds();
        const auto begin = Clock::now();
        load(catalogue, *device, *local, alone_options);
        const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
        if (i > 0) alone_row.add(seconds, cpu_seconds() - cpu_begin, 0);
      }
      MPI_Barrier(MPI_COMM_WORLD);
      if (i > 0) {
        loader_row.add(loader_s, loader_cpu, loader_wrong);
        stage_row.add(union_seconds(landed_spans), mean_seconds(landed_spans), loader_wrong);
        root_stage_row.add(union_seconds(broadcast_spans), 0, loader_wrong);
      }
    }
    if (rank == 0) {
      fmt::print("# bcast_bench: {} ranks, {} bytes in {} chunks of <= {}, best of {} "
                 "iterations after 1 warm-up\n",
                 session.world_size(), plan.total_bytes, plan.chunks.size(),
                 format_bytes(chunk_bytes), iterations);
      fmt::print("# {:>12} {:>12} {:>10} {:>10} {:>7} {:>7}  {}\n", "size(B)", "time(us)",
                 "algbw", "busbw", "#wrong", "cpu(s)", "what");
      print_row("weightcast load (mpi)", plan.total_bytes, loader_row, true);
      print_row("weightcast broadcast stage (rank 0 post to last landing)", plan.total_bytes,
                stage_row, false);
      print_row("weightcast broadcast stage (rank 0 post to rank 0 completion)",
                plan.total_bytes, root_stage_row, false);
      print_row("rank 0 alone: the same load, no broadcast", plan.total_bytes, alone_row,
                true);
      print_row("MPI_Bcast, same bytes, fresh receive arena", plan.total_bytes, raw_row, true);
      print_row("MPI_Bcast, same bytes, fresh arena, rank 0 reading beside it", plan.total_bytes,
                reading_row, true);
      print_row("MPI_Bcast, same bytes, pre-faulted receive buffer", plan.total_bytes, warm_row,
                true);
      fmt::print("# ratio weightcast / MPI_Bcast (fresh arena): whole load {:.3f}, broadcast "
                 "stage {:.3f} (to rank 0's completion {:.3f}); broadcast stage / pre-faulted "
                 "MPI_Bcast {:.3f}\n",
                 raw_row.seconds / loader_row.seconds, raw_row.seconds / stage_row.seconds,
                 raw_row.seconds / root_stage_row.seconds, warm_row.seconds / stage_row.seconds);
      fmt::print("# broadcast stage / MPI_Bcast with rank 0 reading beside it: {:.3f} (the "
                 "same contention for cores and memory bandwidth as in a load); that MPI_Bcast "
                 "/ MPI_Bcast alone: {:.3f}\n",
                 reading_row.seconds / stage_row.seconds, raw_row.seconds / reading_row.seconds);
      const double chunks = static_cast<double>(plan.chunks.size());
      fmt::print("# one chunk's broadcast, mean: {:.0f} us in the load (post to last landing), "
                 "{:.0f} us in the MPI_Bcast loop alone, {:.0f} us with rank 0 reading beside "
                 "it (loop time / chunks)\n",
                 stage_row.cpu * 1e6, raw_row.seconds / chunks * 1e6,
                 reading_row.seconds / chunks * 1e6);
      fmt::print("# whole load / rank 0 alone: {:.3f} (1.0: the broadcast is hidden behind "
                 "rank 0's reads)\n",
                 loader_row.seconds / alone_row.seconds);
    }
    const bool all_right = loader_row.wrong == 0 && raw_row.wrong == 0 &&
                           reading_row.wrong == 0 && warm_row.wrong == 0;
    return all_right ? 0 : 1;
  } catch (const Error& e) {
    fmt::print(stderr, "bcast_bench: error: {}\n", e.what());
    return exit_status(e.code());
  }
}
