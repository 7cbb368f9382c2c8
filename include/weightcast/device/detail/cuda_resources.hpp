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

#include "weightcast/device/cuda_stream.hpp"
#include "weightcast/device/detail/cuda_check.hpp"

#include <cuda.h>
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <utility>

namespace weightcast::detail {

/// Logs a failed release (destructors must not throw).
inline void log_cuda_release(cudaError_t status, const char* call) noexcept {
  if (status != cudaSuccess) {
    spdlog::warn("{} failed: {}: {}", call, cudaGetErrorName(status), cudaGetErrorString(status));
    static_cast<void>(cudaGetLastError());
  }
}

/// @return the `cudaStream_t` for @p stream: `cudaStreamLegacy` for the legacy default stream
///         (never 0, whose meaning depends on how the code naming it was compiled).
inline cudaStream_t cuda_handle(const CallerStream& stream) noexcept {
  return reinterpret_cast<cudaStream_t>(stream.handle());
}

/**
 * @brief Makes @p ordinal the calling thread's CUDA device for the scope's life, and gives the
 *        thread back the context it had current before (none included) at the end.
 *
 * Every CUDA or NCCL call weightcast makes runs inside one. The runtime's current device is
 * per host thread, and weightcast calls CUDA on threads it does not own: the caller's (the
 * blocking `load`, `read_back`), or whichever thread drops the last reference to an arena
 * (a torch tensor's deleter). Without a device set, the runtime's implicit initialisation
 * makes a context on GPU 0 there (about 0.5 GiB on every rank) and the call acts on the
 * wrong device; a bare `cudaSetDevice` would change the caller's device under it. Saving and
 * restoring the driver's current context (`cuCtxGetCurrent`/`cuCtxSetCurrent`, reached
 * through `cudaGetDriverEntryPointByVersion`, so nothing links libcuda) leaves a thread that
 * had no context with none, where restoring a device number would make one on GPU 0 (since
 * CUDA 12, `cudaSetDevice` initialises the device's primary context).
 */
class CudaDeviceScope {
 public:
  /// @throws Error as `throw_cuda_error` when @p ordinal cannot be made current; `unavailable`
  ///         (69) when there is no CUDA runtime to load (`cuda_runtime`).
  explicit CudaDeviceScope(int ordinal) {
    // The noexcept steps below call the runtime: make sure there is one to call first.
    static_cast<void>(cuda_runtime());
    if (already_on(ordinal)) return;
    save();
    const cudaError_t status = cudaSetDevice(ordinal);
    if (status != cudaSuccess) {
      restore();
      throw_cuda_error(status, "cudaSetDevice");
    }
  }
  /// For destructors: never throws; a failure is logged and the scope does nothing.
  CudaDeviceScope(int ordinal, std::nothrow_t) noexcept {
    // No runtime loaded: nothing was made on any device, so there is nothing to switch to.
    if (find_cuda_runtime() == nullptr) return;
    if (already_on(ordinal)) return;
    save();
    log_cuda_release(cudaSetDevice(ordinal), "cudaSetDevice");
  }
  ~CudaDeviceScope() { restore(); }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  struct ContextCalls {
    CUresult (*get)(CUcontext*) = nullptr;
    CUresult (*set)(CUcontext) = nullptr;
  };
  static const ContextCalls& context_calls() noexcept {
    static const ContextCalls calls = [] {
      ContextCalls found;
      void* get = nullptr;
      void* set = nullptr;
      cudaDriverEntryPointQueryResult got{};
      cudaDriverEntryPointQueryResult put{};
      if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
                                           &got) == cudaSuccess &&
          cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                           &put) == cudaSuccess &&
          got == cudaDriverEntryPointSuccess && put == cudaDriverEntryPointSuccess) {
        found.get = reinterpret_cast<CUresult (*)(CUcontext*)>(get);
        found.set = reinterpret_cast<CUresult (*)(CUcontext)>(set);
      } else {
        static_cast<void>(cudaGetLastError());
      }
      return found;
    }();
    return calls;
  }
  // The common case, and the polls' (an event query per chunk and poll): the thread is on
  // the device already, so there is nothing to switch or give back. `cudaGetDevice` reads the
  // thread's state and makes no context.
  static bool already_on(int ordinal) noexcept {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return false;
    }
    return current == ordinal;
  }
  void save() noexcept {
    const ContextCalls& calls = context_calls();
    _saved = calls.get != nullptr && calls.get(&_previous) == CUDA_SUCCESS;
  }
  void restore() noexcept {
    if (!_saved) return;
    _saved = false;
    if (context_calls().set(_previous) != CUDA_SUCCESS) {
      spdlog::warn("cuCtxSetCurrent failed: the thread's CUDA context was not given back");
    }
  }

  CUcontext _previous = nullptr;
  bool _saved = false;
};

/// For an owner of CUDA resources whose destructor may run on any thread: its first member.
/// The owner's destructor calls `enter(ordinal)`; the members after this one are then
/// released on that device, and this one, released last, gives the thread its context back.
class CudaReleaseScope {
 public:
  CudaReleaseScope() = default;
  CudaReleaseScope(const CudaReleaseScope&) = delete;
  CudaReleaseScope& operator=(const CudaReleaseScope&) = delete;
  void enter(int ordinal) noexcept { _scope.emplace(ordinal, std::nothrow); }

 private:
  std::optional<CudaDeviceScope> _scope;
};

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
  /// Gives up the stream without waiting for it or destroying it (a deliberate leak, for a
  /// stream whose work may never end).
  [[nodiscard]] cudaStream_t release() noexcept { return std::exchange(_stream, nullptr); }

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
