// The cuda device: cudaMalloc arena, pinned staging, H2D copies on a non-blocking copy stream.
//
// Completion is polled (`Pending::test()` → `cudaEventQuery` on an event recorded after the
// copy) rather than bridged with `cudaLaunchHostFunc`: the loader already polls every
// Pending from its io_context with a backoff capped at 1 ms, a host function would need a
// thread-safe post back into the io_context plus lifetime care when the load is cancelled,
// and a host function in the copy stream serialises that stream behind a CPU callback. An
// event query is one cheap driver call and cannot outlive the Pending that owns the event.
#include "weightcast/device.hpp"

#include "weightcast/detail/cuda_check.hpp"
#include "weightcast/detail/cuda_resources.hpp"
#include "weightcast/error.hpp"
#include "weightcast/gpu_info.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

namespace weightcast {

namespace detail {

void throw_cuda_error(cudaError_t status, const char* call) {
  // A non-sticky error stays the thread's "last error" until read; clear it so the next call
  // does not report it again.
  static_cast<void>(cudaGetLastError());
  Errc code = Errc::internal;
  switch (status) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorMemoryAllocation:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
      code = Errc::unavailable;
      break;
    default:
      break;
  }
  throw Error(code, fmt::format("{} failed: {}: {}", call, cudaGetErrorName(status),
                                cudaGetErrorString(status)));
}

}  // namespace detail

namespace {

using detail::CudaEvent;
using detail::CudaStream;
using detail::set_cuda_device;

// Size of the pinned bounce buffer that reads device arenas back for digests.
constexpr std::uint64_t read_back_chunk_bytes = 8ull << 20;

class CudaArena final : public Arena {
 public:
  CudaArena(int ordinal, std::uint64_t bytes)
      : _ordinal(ordinal), _memory(allocate(ordinal, bytes)) {}

  [[nodiscard]] std::byte* data() const noexcept override { return _memory.data(); }
  [[nodiscard]] std::uint64_t bytes() const noexcept override { return _memory.bytes(); }
  [[nodiscard]] MemoryKind kind() const noexcept override { return MemoryKind::cuda; }

  void read_back(std::uint64_t offset, std::uint64_t bytes,
                 const std::function<void(const std::byte*, std::size_t)>& consume)
      const override {
    WEIGHTCAST_EXPECT(offset <= this->bytes() && bytes <= this->bytes() - offset,
                      Errc::internal,
                      fmt::format("read_back: [{}, +{}) leaves the arena of {} bytes", offset,
                                  bytes, this->bytes()));
    if (bytes == 0) return;
    set_cuda_device(_ordinal);
    // A stream of its own, synchronised after each chunk: correctness over speed here.
    const CudaStream stream;
    const detail::PinnedBuffer bounce(std::min(bytes, read_back_chunk_bytes));
    for (std::uint64_t done = 0; done < bytes;) {
      const std::uint64_t n = std::min(bounce.bytes(), bytes - done);
      WEIGHTCAST_CUDA_TRY(cudaMemcpyAsync(bounce.data(), data() + offset + done, n,
                                          cudaMemcpyDeviceToHost, stream.get()));
      WEIGHTCAST_CUDA_TRY(cudaStreamSynchronize(stream.get()));
      consume(bounce.data(), n);
      done += n;
    }
  }

 private:
  static detail::DeviceMemory allocate(int ordinal, std::uint64_t bytes) {
    try {
      set_cuda_device(ordinal);
      return detail::DeviceMemory(bytes);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("cuda:{}: cannot allocate an arena of {} bytes: {}",
                                        ordinal, bytes, e.what()));
    }
  }

  int _ordinal;
  detail::DeviceMemory _memory;
};

/// An H2D copy in flight: complete when the event recorded after it has completed.
class CudaCopy final : public Pending {
 public:
  CudaCopy(CudaEvent event, std::uint64_t bytes) : _event(std::move(event)), _bytes(bytes) {}
  ~CudaCopy() override {
    // The copy reads a staging slot: never let the slot go while the DMA may still read it.
    if (!_done) detail::log_cuda_release(cudaEventSynchronize(_event.get()), "cudaEventSynchronize");
  }
  CudaCopy(const CudaCopy&) = delete;
  CudaCopy& operator=(const CudaCopy&) = delete;

  bool test() override {
    const cudaError_t status = cudaEventQuery(_event.get());
    if (status == cudaErrorNotReady) return false;
    _done = true;  // failed or not, nothing waits for it any more
    if (status != cudaSuccess) {
      detail::throw_cuda_error(
          status, fmt::format("H2D copy of {} bytes (cudaEventQuery)", _bytes).c_str());
    }
    return true;
  }

 private:
  CudaEvent _event;
  std::uint64_t _bytes;
  bool _done = false;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal)
      : _ordinal(ordinal), _name(fmt::format("cuda:{}", ordinal)), _copy_stream(make_stream(ordinal)) {}
  // Members release in reverse order: the events, then the stream (which waits for its
  // copies first).

  [[nodiscard]] std::string_view name() const noexcept override { return _name; }

  std::shared_ptr<Arena> allocate_arena(std::uint64_t bytes) override {
    return std::make_shared<CudaArena>(_ordinal, bytes);
  }

  std::unique_ptr<Pending> upload(const std::byte* source, std::byte* destination,
                                  std::uint64_t bytes) override {
    if (bytes == 0) return nullptr;
    set_cuda_device(_ordinal);
    WEIGHTCAST_CUDA_TRY(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice,
                                        _copy_stream.get()));
    CudaEvent done;
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(done.get(), _copy_stream.get()));
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(_last_upload.get(), _copy_stream.get()));
    return std::make_unique<CudaCopy>(std::move(done), bytes);
  }

  [[nodiscard]] bool wants_pinned_staging() const noexcept override { return true; }

  void pin(std::byte* host, std::uint64_t bytes) override {
    set_cuda_device(_ordinal);
    // Portable: the registration is valid for every device of the process, not only this one.
    const cudaError_t status = cudaHostRegister(host, bytes, cudaHostRegisterPortable);
    if (status != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      throw Error(Errc::unavailable,
                  fmt::format("cannot pin {} bytes of pinned host memory for {} "
                              "(cudaHostRegister: {}: {})",
                              bytes, _name, cudaGetErrorName(status), cudaGetErrorString(status)));
    }
  }

  void unpin(std::byte* host) noexcept override {
    detail::log_cuda_release(cudaHostUnregister(host), "cudaHostUnregister");
  }

  [[nodiscard]] void* upload_event() const noexcept override { return _last_upload.get(); }

 private:
  static CudaStream make_stream(int ordinal) {
    set_cuda_device(ordinal);
    return CudaStream();
  }

  int _ordinal;
  std::string _name;
  CudaStream _copy_stream;
  CudaEvent _last_upload;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  const CudaProbe probe = probe_cuda();
  if (!probe.error.empty() || probe.device_count == 0) {
    throw Error(Errc::unavailable,
                fmt::format("cuda:{}: no usable CUDA device ({}); use device: host or auto",
                            ordinal, probe.error.empty() ? "none found" : probe.error));
  }
  if (ordinal < 0 || ordinal >= probe.device_count) {
    throw Error(Errc::unavailable,
                fmt::format("cuda:{}: no such device: {} visible (the local rank picks the GPU: "
                            "world.local_rank, else the launcher's; check "
                            "CUDA_VISIBLE_DEVICES)",
                            ordinal, probe.device_count));
  }
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace weightcast
