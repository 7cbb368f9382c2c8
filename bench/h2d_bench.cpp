// h2d_bench: the GPU-side ceilings and costs tests/gpu/gpu_check.sh reports beside a load.
//
//   h2d_bench h2d [BYTES] [ITERATIONS]      pinned H2D bandwidth (defaults: 256 MiB, 20):
//       cudaMemcpyAsync from cudaHostAlloc memory into cudaMalloc memory on a non-blocking
//       stream, after a warm-up, timed with CUDA events. Last line `h2d_gbps <value>`.
//   h2d_bench pieces CHUNK PIECES CHUNKS    weightcast's cuda Device::upload, as the loader's
//       upload stage drives it: CHUNKS chunks of CHUNK bytes, each as one copy, as PIECES
//       copies, or as PIECES copies in one Device::upload_all (the loader's own call), each
//       chunk's copies waited (polled) before the next is issued, against all chunks queued
//       at once. Lines `upload_gbps <mode> <value>`.
//   h2d_bench nccl GROUPS BYTES             world size 1: GROUPS grouped broadcasts of BYTES
//       through weightcast's nccl transport (a non-blocking communicator: NCCL runs each
//       ncclGroupEnd on a thread of its own), against the same calls on a blocking
//       communicator, and with the bytes as 64 ranges (one ncclBroadcast per piece). Lines
//       `nccl_group_us <mode> <value>` (per group, enqueue to completion).
//   h2d_bench readback TENSORS BYTES        Arena::read_back of TENSORS ranges of BYTES from a
//       cuda arena, one call per range as tensor digests do. Line `readback_us_per_call`.
//
// h2d, pieces and readback then check the bytes they moved: the device memory is read back
// and its XXH3-64 compared with the source's, computed on the host (a pattern that differs at
// every 8 bytes, so a misplaced copy shows). Line `verify <mode> host <hex> device <hex>
// equal` (or `DIFFER`, exit 70).
//
// Every mode starts with its word; an unknown word, a count that is not a whole number above 0
// or an argument too many is refused with the usage (a dropped word used to read the next
// mode's counts as BYTES ITERATIONS and time something else). 1 GB = 1e9 B. Exit 69 when CUDA
// or NCCL is unusable, 64 for bad arguments.
#include "weightcast/device/device.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/transport/transport.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "h2d_bench: %s failed: %s: %s\n", call, cudaGetErrorName(status),
                 cudaGetErrorString(status));
    std::exit(69);
  }
}

void check_nccl(ncclResult_t status, const char* call) {
  if (status != ncclSuccess && status != ncclInProgress) {
    std::fprintf(stderr, "h2d_bench: %s failed: %s\n", call, ncclGetErrorString(status));
    std::exit(69);
  }
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Fills @p bytes at @p data with a pattern that differs at every 8 bytes (splitmix64 of the
// offset), so a copy landing at the wrong offset, or twice, changes the digest.
void fill_pattern(std::byte* data, std::uint64_t bytes, std::uint64_t seed) {
  for (std::uint64_t i = 0; i < bytes; i += 8) {
    std::uint64_t z = seed * 0x100000000ull + i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(data + i, &z, std::min<std::uint64_t>(8, bytes - i));
  }
}

// Prints the verify line; @return 0 when the digests are equal, 70 when they differ.
int verdict(const char* mode, std::uint64_t host, std::uint64_t device) {
  const bool equal = host == device;
  std::printf("verify %s host %s device %s %s\n", mode, weightcast::digest_hex(host).c_str(),
              weightcast::digest_hex(device).c_str(), equal ? "equal" : "DIFFER");
  return equal ? 0 : 70;
}

// Polls a Pending as the loader does: 10 µs first, doubling up to 100 µs (upload_poll_cap).
void wait(std::unique_ptr<weightcast::Pending> pending) {
  if (!pending) return;
  auto interval = std::chrono::microseconds(10);
  while (!pending->test()) {
    std::this_thread::sleep_for(interval);
    interval = std::min(interval * 2, std::chrono::microseconds(100));
  }
}

int pinned_h2d(unsigned long long bytes, int iterations) {
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  fill_pattern(static_cast<std::byte*>(host), bytes, 1);  // faults the pages in before timing
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
  // The copies' bytes: the device buffer read back against the host source.
  const std::uint64_t want = weightcast::xxh3_64(host, bytes);
  std::vector<std::byte> back(bytes);
  check(cudaMemcpy(back.data(), device, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  const int status = verdict("h2d", want, weightcast::xxh3_64(back.data(), bytes));
  cudaEventDestroy(stop);
  cudaEventDestroy(start);
  cudaStreamDestroy(stream);
  cudaFree(device);
  cudaFreeHost(host);
  return status;
}

int pieces(std::uint64_t chunk, std::uint64_t piece_count, std::uint64_t chunks) {
  auto device = weightcast::make_cuda_device(0);
  auto arena = device->allocate_arena(chunk * chunks);
  // Page-aligned, as the staging ring's slots are (cudaHostRegister pins whole pages).
  const std::uint64_t staging_bytes = (chunk * 2 + 4095) / 4096 * 4096;
  std::unique_ptr<std::byte, decltype(&std::free)> staging_memory(
      static_cast<std::byte*>(std::aligned_alloc(4096, staging_bytes)), &std::free);
  if (!staging_memory) return 69;
  fill_pattern(staging_memory.get(), staging_bytes, 2);
  std::span<std::byte> staging(staging_memory.get(), staging_bytes);
  device->pin(staging.data(), staging.size());
  const std::uint64_t piece = chunk / piece_count;
  const auto run = [&](const char* mode, bool split, bool serial, bool grouped = false) {
    const auto start = Clock::now();
    std::vector<std::unique_ptr<weightcast::Pending>> queued;
    for (std::uint64_t c = 0; c < chunks; ++c) {
      const std::byte* source = staging.data() + (c % 2) * chunk;
      std::byte* target = arena->data() + c * chunk;
      std::vector<std::unique_ptr<weightcast::Pending>> copies;
      if (split && grouped) {
        // The loader's upload stage: a chunk's pieces as one Device::upload_all.
        std::vector<weightcast::Device::Copy> group;
        for (std::uint64_t p = 0; p < piece_count; ++p) {
          const std::uint64_t n = p + 1 == piece_count ? chunk - p * piece : piece;
          group.push_back({source + p * piece, target + p * piece, n});
        }
        copies.push_back(device->upload_all(group));
      } else if (split) {
        for (std::uint64_t p = 0; p < piece_count; ++p) {
          const std::uint64_t n = p + 1 == piece_count ? chunk - p * piece : piece;
          copies.push_back(device->upload(source + p * piece, target + p * piece, n));
        }
      } else {
        copies.push_back(device->upload(source, target, chunk));
      }
      for (auto& copy : copies) {
        if (serial) {
          wait(std::move(copy));
        } else {
          queued.push_back(std::move(copy));
        }
      }
    }
    for (auto& copy : queued) wait(std::move(copy));
    const double seconds = seconds_since(start);
    std::printf("upload_gbps %s %.2f\n", mode, static_cast<double>(chunk * chunks) / seconds / 1e9);
  };
  run("warmup", false, true);
  run("one_copy_per_chunk_waited", false, true);
  run("pieces_per_chunk_waited", true, true);
  run("pieces_upload_all_waited", true, true, true);
  run("one_copy_per_chunk_queued", false, false);
  run("pieces_per_chunk_queued", true, false);
  run("pieces_upload_all_queued", true, false, true);
  // Chunk c of the arena holds staging chunk c % 2 (every run writes all of it): the arena
  // read back against the same sequence hashed on the host.
  std::vector<std::byte> expected(chunk * chunks);
  for (std::uint64_t c = 0; c < chunks; ++c) {
    std::memcpy(expected.data() + c * chunk, staging.data() + (c % 2) * chunk, chunk);
  }
  std::vector<std::byte> back;
  back.reserve(chunk * chunks);
  arena->read_back(0, chunk * chunks, [&](const std::byte* data, std::size_t n) {
    back.insert(back.end(), data, data + n);
  });
  device->unpin(staging.data());
  return verdict("pieces", weightcast::xxh3_64(expected.data(), expected.size()),
                 weightcast::xxh3_64(back.data(), back.size()));
}

int nccl(int groups, std::uint64_t bytes) {
  auto device = weightcast::make_cuda_device(0);
  auto transport = weightcast::make_nccl_transport(0, 1, 0, weightcast::nccl_unique_id(),
                                                   std::chrono::seconds(60));
  auto arena = device->allocate_arena(bytes);
  // One range per group, or the chunk as 64 pieces (a chunk of small tensors at 256-byte
  // arena alignment: one ncclBroadcast per piece inside the group).
  const auto time_weightcast = [&](std::uint64_t piece_count) {
    std::vector<weightcast::Transport::Range> ranges;
    const std::uint64_t piece = bytes / piece_count;
    for (std::uint64_t p = 0; p < piece_count; ++p) {
      const std::uint64_t n = p + 1 == piece_count ? bytes - p * piece : piece;
      ranges.push_back({arena->data() + p * piece, n});
    }
    const auto start = Clock::now();
    for (int g = 0; g < groups; ++g) wait(transport->broadcast_group(ranges, 0, nullptr));
    return seconds_since(start) / groups * 1e6;
  };
  time_weightcast(1);  // warm-up
  const double nonblocking_us = time_weightcast(1);
  const double pieces_us = time_weightcast(64);

  // The same group on a blocking communicator: ncclGroupEnd enqueues on the calling thread.
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, 1, id, 0), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  const auto time_blocking = [&] {
    const auto start = Clock::now();
    for (int g = 0; g < groups; ++g) {
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      check_nccl(ncclBroadcast(arena->data(), arena->data(), bytes, ncclUint8, 0, comm, stream),
                 "ncclBroadcast");
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    return seconds_since(start) / groups * 1e6;
  };
  time_blocking();
  const double blocking_us = time_blocking();
  std::printf("nccl_group_us nonblocking_weightcast %.1f\n", nonblocking_us);
  std::printf("nccl_group_us nonblocking_weightcast_64_pieces %.1f\n", pieces_us);
  std::printf("nccl_group_us blocking %.1f\n", blocking_us);
  std::printf("nccl_group_ratio nonblocking/blocking %.2f\n", nonblocking_us / blocking_us);
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  check_nccl(ncclCommDestroy(comm), "ncclCommDestroy");
  return 0;
}

int readback(std::uint64_t tensors, std::uint64_t bytes) {
  auto device = weightcast::make_cuda_device(0);
  auto arena = device->allocate_arena(tensors * bytes);
  std::vector<std::byte> source(tensors * bytes);
  fill_pattern(source.data(), source.size(), 3);
  check(cudaMemcpy(arena->data(), source.data(), source.size(), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::uint64_t sum = 0;
  const auto start = Clock::now();
  for (std::uint64_t t = 0; t < tensors; ++t) {
    arena->read_back(t * bytes, bytes, [&](const std::byte* data, std::size_t n) {
      sum += static_cast<std::uint64_t>(data[0]) + n;
    });
  }
  const double seconds = seconds_since(start);
  std::printf("readback %llu calls of %llu B in %.3f s (check %llu)\n",
              static_cast<unsigned long long>(tensors), static_cast<unsigned long long>(bytes),
              seconds, static_cast<unsigned long long>(sum));
  std::printf("readback_us_per_call %.1f\n", seconds / tensors * 1e6);
  // Untimed: every range read back again, its bytes kept, against the source's digest.
  std::vector<std::byte> back;
  back.reserve(source.size());
  for (std::uint64_t t = 0; t < tensors; ++t) {
    arena->read_back(t * bytes, bytes, [&](const std::byte* data, std::size_t n) {
      back.insert(back.end(), data, data + n);
    });
  }
  return verdict("readback", weightcast::xxh3_64(source.data(), source.size()),
                 weightcast::xxh3_64(back.data(), back.size()));
}

constexpr const char* usage =
    "usage: h2d_bench h2d [BYTES_PER_COPY [ITERATIONS]] | pieces [CHUNK [PIECES [CHUNKS]]] | "
    "nccl [GROUPS [BYTES]] | readback [TENSORS [BYTES]]   (counts: whole numbers > 0)\n";

// Argument @p i as a whole number > 0, @p fallback when absent; 0 when it is not one.
std::uint64_t arg(char** argv, int i, int argc, std::uint64_t fallback) {
  if (i >= argc) return fallback;
  const char* text = argv[i];
  if (*text < '0' || *text > '9') return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  return errno == 0 && *end == '\0' ? value : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  const auto bad = [] {
    std::fputs(usage, stderr);
    return 64;
  };
  try {
    if (mode == "h2d") {
      if (argc > 4) return bad();
      const std::uint64_t bytes = arg(argv, 2, argc, 256ull << 20);
      const std::uint64_t iterations = arg(argv, 3, argc, 20);
      if (bytes == 0 || iterations == 0 || iterations > 1000000) return bad();
      return pinned_h2d(bytes, static_cast<int>(iterations));
    }
    if (mode == "pieces") {
      if (argc > 5) return bad();
      const std::uint64_t chunk = arg(argv, 2, argc, 16ull << 20);
      const std::uint64_t n = arg(argv, 3, argc, 64);
      const std::uint64_t chunks = arg(argv, 4, argc, 64);
      if (chunk == 0 || n == 0 || n > chunk || chunks == 0) return bad();
      return pieces(chunk, n, chunks);
    }
    if (mode == "nccl") {
      if (argc > 4) return bad();
      const std::uint64_t groups = arg(argv, 2, argc, 200);
      const std::uint64_t bytes = arg(argv, 3, argc, 16ull << 20);
      if (groups == 0 || groups > 1000000 || bytes == 0) return bad();
      return nccl(static_cast<int>(groups), bytes);
    }
    if (mode == "readback") {
      if (argc > 4) return bad();
      const std::uint64_t tensors = arg(argv, 2, argc, 1000);
      const std::uint64_t bytes = arg(argv, 3, argc, 65536);
      if (tensors == 0 || bytes == 0) return bad();
      return readback(tensors, bytes);
    }
  } catch (const weightcast::Error& e) {
    std::fprintf(stderr, "h2d_bench %s: %s\n", argv[1], e.what());
    return 69;
  }
  return bad();
}
