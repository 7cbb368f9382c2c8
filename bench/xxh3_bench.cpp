// XXH3-64 throughput: libxxhash's default entry point (SSE2 on x86-64) against its runtime
// dispatch (AVX2 or AVX-512 where the CPU has them), which weightcast uses (src/pipeline/digest.cpp),
// over the same warm buffer, alternating, with the digests compared.
//
//   build/xxh3_bench [buffer_size] [rounds]      (defaults: 16MiB, 64)
//
// Each round hashes the whole buffer once with each entry point; the best round of each is
// printed in GB/s with their ratio. A digest mismatch exits 1.
#include "weightcast/config/config.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  try {
    const std::uint64_t bytes =
        argc > 1 ? weightcast::parse_size(argv[1], "buffer_size") : 16ull << 20;
    const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 64;
    std::vector<std::uint64_t> buffer(bytes / sizeof(std::uint64_t) + 1);
    std::mt19937_64 rng(1);
    for (auto& word : buffer) word = rng();
    const void* data = buffer.data();

    double best_default = 1e30, best_dispatch = 1e30;
    for (int r = 0; r < rounds; ++r) {
      auto begin = Clock::now();
      const std::uint64_t plain = XXH3_64bits(data, bytes);  // libxxhash's own entry point
      best_default = std::min(best_default,
                              std::chrono::duration<double>(Clock::now() - begin).count());
      begin = Clock::now();
      const std::uint64_t dispatched = weightcast::xxh3_64(data, bytes);  // the dispatch
      best_dispatch = std::min(best_dispatch,
                               std::chrono::duration<double>(Clock::now() - begin).count());
      if (plain != dispatched) {
        fmt::print(stderr, "xxh3_bench: digests differ: {:016x} vs {:016x}\n", plain,
                   dispatched);
        return 1;
      }
    }
    const double gb = static_cast<double>(bytes) / 1e9;
    fmt::print("# xxh3_bench: {} bytes, best of {} rounds\n", bytes, rounds);
    fmt::print("XXH3_64bits (libxxhash default)   {:.2f} GB/s\n", gb / best_default);
    fmt::print("weightcast::xxh3_64 (dispatch)    {:.2f} GB/s\n", gb / best_dispatch);
    fmt::print("# ratio dispatch / default: {:.3f}\n", best_default / best_dispatch);
    return 0;
  } catch (const weightcast::Error& e) {
    fmt::print(stderr, "xxh3_bench: error: {}\n", e.what());
    return weightcast::exit_status(e.code());
  }
}
