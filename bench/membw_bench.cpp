// Memory bandwidth of plain memcpy on one core and on several at once: whether two copies
// running together (rank 0's read stage and another rank's broadcast receive, on one node)
// each keep the bandwidth one copy gets alone. bench/RESULTS.md quotes it beside bcast_bench.
//
//   build/membw_bench [threads] [MiB per copy] [repeats]
//
// Each thread copies its own buffer (faulted in first) `repeats` times; the table gives each
// run's total GB/s (1 GB = 1e9 B) and GB/s per thread, one thread against `threads` at once,
// alternating, three rounds.
#include <fmt/core.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

/// Total GB/s of `threads` threads each copying `bytes` `repeats` times at once.
double copy_gbps(int threads, std::size_t bytes, int repeats) {
  std::vector<std::vector<char>> sources(threads, std::vector<char>(bytes, 1));
  std::vector<std::vector<char>> targets(threads, std::vector<char>(bytes, 2));
  std::vector<double> seconds(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const auto begin = std::chrono::steady_clock::now();
      for (int r = 0; r < repeats; ++r) {
        std::memcpy(targets[t].data(), sources[t].data(), bytes);
      }
      seconds[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    });
  }
  for (auto& worker : workers) worker.join();
  double total = 0;
  for (int t = 0; t < threads; ++t) total += static_cast<double>(bytes) * repeats / seconds[t] / 1e9;
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::size_t bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 256) << 20;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 4;
  if (threads < 1 || bytes == 0 || repeats < 1) {
    fmt::print(stderr, "usage: membw_bench [threads >= 1] [MiB per copy] [repeats >= 1]\n");
    return 64;
  }
  fmt::print("# memcpy of {} MiB x {} per thread; GB/s total (per thread)\n", bytes >> 20, repeats);
  for (int round = 0; round < 3; ++round) {
    const double one = copy_gbps(1, bytes, repeats);
    const double many = copy_gbps(threads, bytes, repeats);
    fmt::print("  1 thread {:6.2f}   {} threads {:6.2f} ({:5.2f} each, {:.2f} of one alone)\n", one,
               threads, many, many / threads, many / threads / one);
  }
}
