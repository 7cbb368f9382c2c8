// h2d_bench: pinned host-to-device copy bandwidth, the ceiling for weightcast's upload stage.
//
// Usage: h2d_bench [BYTES_PER_COPY] [ITERATIONS]   (defaults: 256 MiB, 20)
// Copies with cudaMemcpyAsync from a cudaHostAlloc buffer into cudaMalloc memory on a
// non-blocking stream, after a warm-up, timed with CUDA events; prints nccl-tests-style
// columns (1 GB = 1e9 B) and a last line `h2d_gbps <value>` for scripts.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "h2d_bench: %s failed: %s: %s\n", call, cudaGetErrorName(status),
                 cudaGetErrorString(status));
    std::exit(69);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned long long bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256ull << 20;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 20;
  if (bytes == 0 || iterations <= 0) {
    std::fprintf(stderr, "usage: h2d_bench [BYTES_PER_COPY>0] [ITERATIONS>0]\n");
    return 64;
  }
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::memset(host, 0x5a, bytes);  // fault the pages in before timing
  check(cudaMalloc(&device, bytes), "cudaMalloc");
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");

  for (int i = 0; i < 3; ++i) {  // warm-up
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iterations; ++i) {
    check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  }
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");

  const double seconds_per_copy = ms / 1e3 / iterations;
  const double gbps = static_cast<double>(bytes) / seconds_per_copy / 1e9;
  std::printf("%14s %12s %10s\n", "size(B)", "time(us)", "algbw(GB/s)");
  std::printf("%14llu %12.1f %10.2f\n", bytes, seconds_per_copy * 1e6, gbps);
  std::printf("h2d_gbps %.2f\n", gbps);

  cudaEventDestroy(stop);
  cudaEventDestroy(start);
  cudaStreamDestroy(stream);
  cudaFree(device);
  cudaFreeHost(host);
  return 0;
}
