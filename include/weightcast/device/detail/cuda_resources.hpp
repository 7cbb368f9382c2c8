/**
 * @file cuda_resources.hpp
 * @brief Move-only owners of CUDA streams, events, device memory and pinned host buffers.
 *
 * Internal; only for translation units built with CUDA (`WEIGHTCAST_HAVE_CUDA`). Constructors
 * throw as `throw_cuda_error` does (69 for out of memory or no device, else 70), naming the
 * CUDA call. Destructors never throw: a failed release is logged. Never keep one in a
 * static: the CUDA runtime may already be torn down when static destructors run (CUDA
 * Programming Guide, "Initialization").
 */
#pragma once

#include "weightcast/device/detail/cuda_check.hpp"

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace weightcast::detail {

/// Logs a failed release (destructors must not throw).
inline void log_cuda_release(cudaError_t status, const char* call) noexcept {
  if (status != cudaSuccess) {
    spdlog::warn("{} failed: {}: {}", call, cudaGetErrorName(status), cudaGetErrorString(status));
    static_cast<void>(cudaGetLastError());
  }
}

/// Makes @p ordinal the calling thread's current CUDA device (the runtime's current device
/// is per host thread, and `load_async` runs the loader on a thread of its own).
inline void set_cuda_device(int ordinal) { WEIGHTCAST_CUDA_TRY(cudaSetDevice(ordinal)); }

/// A non-blocking CUDA stream: it does not synchronise with the legacy default stream.
class CudaStream {
 public:
  CudaStream() {
    WEIGHTCAST_CUDA_TRY(cudaStreamCreateWithFlags(&_stream, cudaStreamNonBlocking));
  }
  ~CudaStream() {
    if (_stream == nullptr) return;
    // Work still queued would outlive the memory it touches: wait for it first.
    log_cuda_release(cudaStreamSynchronize(_stream), "cudaStreamSynchronize");
    log_cuda_release(cudaStreamDestroy(_stream), "cudaStreamDestroy");
  }
  CudaStream(CudaStream&& other) noexcept : _stream(std::exchange(other._stream, nullptr)) {}
  CudaStream& operator=(CudaStream&&) = delete;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  [[nodiscard]] cudaStream_t get() const noexcept { return _stream; }

 private:
  cudaStream_t _stream = nullptr;
};

/// A CUDA event without timing (`cudaEventDisableTiming`: cheaper to record and query).
class CudaEvent {
 public:
  CudaEvent() { WEIGHTCAST_CUDA_TRY(cudaEventCreateWithFlags(&_event, cudaEventDisableTiming)); }
  ~CudaEvent() {
    if (_event != nullptr) log_cuda_release(cudaEventDestroy(_event), "cudaEventDestroy");
  }
  CudaEvent(CudaEvent&& other) noexcept : _event(std::exchange(other._event, nullptr)) {}
  CudaEvent& operator=(CudaEvent&&) = delete;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  [[nodiscard]] cudaEvent_t get() const noexcept { return _event; }

 private:
  cudaEvent_t _event = nullptr;
};

/// Device memory from `cudaMalloc` (aligned to at least 256 bytes, CUDA Programming Guide).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(std::uint64_t bytes) : _bytes(bytes) {
    if (bytes > 0) WEIGHTCAST_CUDA_TRY(cudaMalloc(&_data, bytes));
  }
  ~DeviceMemory() {
    if (_data != nullptr) log_cuda_release(cudaFree(_data), "cudaFree");
  }
  DeviceMemory(DeviceMemory&& other) noexcept
      : _data(std::exchange(other._data, nullptr)), _bytes(std::exchange(other._bytes, 0)) {}
  DeviceMemory& operator=(DeviceMemory&&) = delete;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(_data); }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return _bytes; }

 private:
  void* _data = nullptr;
  std::uint64_t _bytes = 0;
};

/// Page-locked host memory from `cudaHostAlloc`.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::uint64_t bytes) : _bytes(bytes) {
    if (bytes > 0) WEIGHTCAST_CUDA_TRY(cudaHostAlloc(&_data, bytes, cudaHostAllocDefault));
  }
  ~PinnedBuffer() {
    if (_data != nullptr) log_cuda_release(cudaFreeHost(_data), "cudaFreeHost");
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : _data(std::exchange(other._data, nullptr)), _bytes(std::exchange(other._bytes, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&&) = delete;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(_data); }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return _bytes; }

 private:
  void* _data = nullptr;
  std::uint64_t _bytes = 0;
};

}  // namespace weightcast::detail
