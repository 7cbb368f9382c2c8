// The cuda device: cudaMalloc arena, pinned staging, H2D copies on a non-blocking copy stream.
//
// Completion is polled (`Pending::test()` → `cudaEventQuery` on an event recorded after the
// copy) rather than bridged with `cudaLaunchHostFunc`: the loader already polls every
// Pending from its io_context with a backoff capped at 1 ms, a host function would need a
// thread-safe post back into the io_context plus lifetime care when the load is cancelled,
// and a host function in the copy stream serialises that stream behind a CPU callback. An
// event query is one cheap driver call and cannot outlive the Pending that owns the event.
#include "weightcast/device/device.hpp"

#include "weightcast/device/detail/cuda_check.hpp"
#include "weightcast/device/detail/cuda_resources.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/gpu_info.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <optional>
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
using detail::CudaDeviceScope;
using detail::CudaReleaseScope;

// Each of the two pinned bounce halves that read device arenas back for digests, bytes.
constexpr std::uint64_t read_back_half_bytes = 4ull << 20;

/// What `CudaArena::read_back` reuses from call to call: a digest of a checkpoint reads each
/// tensor back in its own call, and a stream plus `cudaHostAlloc` per call (pinning is a
/// syscall that faults every page in) cost milliseconds each, seconds for ~1000 tensors.
/// Two halves: the copy into one runs while the caller consumes the other.
struct ReadBackBuffers {
  explicit ReadBackBuffers(std::uint64_t half_bytes)
      : halves{detail::PinnedBuffer(half_bytes), detail::PinnedBuffer(half_bytes)} {}
  detail::PinnedBuffer halves[2];
  CudaEvent copied[2];
  CudaStream stream;  // declared last: destroyed first, waiting for its copies into `halves`
};

/// Copies [source, + bytes) of device memory to the host through @p buffers (made at the
/// first call, halves of at most @p half_cap bytes) and hands it to @p consume in order.
void read_back_through(int ordinal, std::optional<ReadBackBuffers>& buffers,
                       std::uint64_t half_cap, const std::byte* source, std::uint64_t bytes,
                       const std::function<void(const std::byte*, std::size_t)>& consume) {
  if (bytes == 0) return;
  const CudaDeviceScope device_scope(ordinal);
  if (!buffers) buffers.emplace(std::min(half_cap, read_back_half_bytes));
  ReadBackBuffers& rb = *buffers;
  const std::uint64_t half = rb.halves[0].bytes();
  const auto issue = [&](std::uint64_t at, int b) {
    WEIGHTCAST_CUDA_TRY(cudaMemcpyAsync(rb.halves[b].data(), source + at,
                                        std::min(half, bytes - at), cudaMemcpyDeviceToHost,
                                        rb.stream.get()));
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(rb.copied[b].get(), rb.stream.get()));
  };
  issue(0, 0);
  for (std::uint64_t done = 0, b = 0; done < bytes; b ^= 1) {
    const std::uint64_t n = std::min(half, bytes - done);
    // Half b^1 was consumed in the previous round: refill it while b is consumed.
    if (done + n < bytes) issue(done + n, static_cast<int>(b ^ 1));
    WEIGHTCAST_CUDA_TRY(cudaEventSynchronize(rb.copied[b].get()));
    consume(rb.halves[b].data(), n);
    done += n;
  }
}

class CudaArena final : public Arena {
 public:
  CudaArena(int ordinal, std::uint64_t bytes)
      : _ordinal(ordinal), _memory(allocate(ordinal, bytes)) {}
  // The last reference may be dropped on any thread (a torch tensor's deleter).
  ~CudaArena() override { _release.enter(_ordinal); }
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

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
    // const, but callers may read back from several threads: one at a time.
    const std::lock_guard lock(_read_back_mutex);
    read_back_through(_ordinal, _read_back, this->bytes(), data() + offset, bytes, consume);
  }

 private:
  static detail::DeviceMemory allocate(int ordinal, std::uint64_t bytes) {
    const CudaDeviceScope device_scope(ordinal);
    try {
      return detail::DeviceMemory(bytes);
    } catch (const Error& e) {
      // What the device had: tells "too large for this GPU" from "something else holds it"
      // (another process, or NCCL's buffers when the transport connected first).
      std::size_t free_bytes = 0;
      std::size_t total_bytes = 0;
      std::string memory;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        memory = fmt::format(" ({} bytes free of {})", free_bytes, total_bytes);
      } else {
        static_cast<void>(cudaGetLastError());
      }
      throw Error(e.code(), fmt::format("cuda:{}: cannot allocate an arena of {} bytes{}: {}",
                                        ordinal, bytes, memory, e.what()));
    }
  }

  CudaReleaseScope _release;  // first: released last, after the memory and the read-back stream
  int _ordinal;
  detail::DeviceMemory _memory;
  mutable std::mutex _read_back_mutex;
  // Created at the first read_back; declared after `_memory`: its stream waits for its copies
  // before the arena memory they read is freed.
  mutable std::optional<ReadBackBuffers> _read_back;
};

/// An H2D copy in flight: complete when the event recorded after it has completed.
class CudaCopy final : public Pending {
 public:
  CudaCopy(int ordinal, CudaEvent event, std::uint64_t bytes)
      : _ordinal(ordinal), _event(std::move(event)), _bytes(bytes) {}
  ~CudaCopy() override {
    _release.enter(_ordinal);
    // The copy reads a staging slot: never let the slot go while the DMA may still read it.
    if (!_done) detail::log_cuda_release(cudaEventSynchronize(_event.get()), "cudaEventSynchronize");
  }
  CudaCopy(const CudaCopy&) = delete;
  CudaCopy& operator=(const CudaCopy&) = delete;

  bool test() override {
    const CudaDeviceScope device_scope(_ordinal);
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
  CudaReleaseScope _release;  // first: released last
  int _ordinal;
  CudaEvent _event;
  std::uint64_t _bytes;
  bool _done = false;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal)
      : _ordinal(ordinal), _name(fmt::format("cuda:{}", ordinal)), _copy_stream(make_stream(ordinal)) {}
  // Members release in reverse order: the events, then the stream (which waits for its
  // copies first), on this device whichever thread drops the device.
  ~CudaDevice() override { _release.enter(_ordinal); }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return _name; }

  std::shared_ptr<Arena> allocate_arena(std::uint64_t bytes) override {
    return std::make_shared<CudaArena>(_ordinal, bytes);
  }

  std::unique_ptr<Pending> upload(const std::byte* source, std::byte* destination,
                                  std::uint64_t bytes) override {
    if (bytes == 0) return nullptr;
    const CudaDeviceScope device_scope(_ordinal);
    CudaEvent done;
    WEIGHTCAST_CUDA_TRY(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyHostToDevice,
                                        _copy_stream.get()));
    try {
      WEIGHTCAST_CUDA_TRY(cudaEventRecord(done.get(), _copy_stream.get()));
      WEIGHTCAST_CUDA_TRY(cudaEventRecord(_last_upload.get(), _copy_stream.get()));
    } catch (...) {
      // The copy is queued but no Pending will own it: wait for it here, or the caller frees
      // the staging slot it reads (and maybe the arena it writes) while the DMA still runs.
      detail::log_cuda_release(cudaStreamSynchronize(_copy_stream.get()),
                               "cudaStreamSynchronize (after a failed upload)");
      throw;
    }
    return std::make_unique<CudaCopy>(_ordinal, std::move(done), bytes);
  }

  // Every copy on the copy stream, one event after the last: stream order completes them
  // all by then.
  std::unique_ptr<Pending> upload_all(std::span<const Copy> copies) override {
    std::uint64_t bytes = 0;
    for (const Copy& copy : copies) bytes += copy.bytes;
    if (bytes == 0) return nullptr;
    const CudaDeviceScope device_scope(_ordinal);
    CudaEvent done;
    bool queued = false;
    try {
      for (const Copy& copy : copies) {
        if (copy.bytes == 0) continue;
        WEIGHTCAST_CUDA_TRY(cudaMemcpyAsync(copy.destination, copy.source, copy.bytes,
                                            cudaMemcpyHostToDevice, _copy_stream.get()));
        queued = true;
      }
      WEIGHTCAST_CUDA_TRY(cudaEventRecord(done.get(), _copy_stream.get()));
      WEIGHTCAST_CUDA_TRY(cudaEventRecord(_last_upload.get(), _copy_stream.get()));
    } catch (...) {
      // As upload: no Pending will own what is queued, so wait for it before the sources go.
      if (queued) {
        detail::log_cuda_release(cudaStreamSynchronize(_copy_stream.get()),
                                 "cudaStreamSynchronize (after a failed upload)");
      }
      throw;
    }
    return std::make_unique<CudaCopy>(_ordinal, std::move(done), bytes);
  }

  [[nodiscard]] bool wants_pinned_staging() const noexcept override { return true; }

  void pin(std::byte* host, std::uint64_t bytes) override {
    const CudaDeviceScope device_scope(_ordinal);
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
    const CudaDeviceScope device_scope(_ordinal, std::nothrow);
    detail::log_cuda_release(cudaHostUnregister(host), "cudaHostUnregister");
  }

  [[nodiscard]] void* upload_event() const noexcept override { return _last_upload.get(); }

  void order_after(const CallerStream& stream) override {
    if (stream.is_none()) return;
    const CudaDeviceScope device_scope(_ordinal);
    CudaEvent queued;
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(queued.get(), detail::cuda_handle(stream)));
    WEIGHTCAST_CUDA_TRY(cudaStreamWaitEvent(_copy_stream.get(), queued.get(), 0));
  }

  void order_before(const CallerStream& stream) override {
    if (stream.is_none()) return;
    const CudaDeviceScope device_scope(_ordinal);
    CudaEvent written;
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(written.get(), _copy_stream.get()));
    WEIGHTCAST_CUDA_TRY(cudaStreamWaitEvent(detail::cuda_handle(stream), written.get(), 0));
  }

  void read_back(const std::byte* data, std::uint64_t bytes,
                 const std::function<void(const std::byte*, std::size_t)>& consume)
      const override {
    const std::lock_guard lock(_read_back_mutex);
    read_back_through(_ordinal, _read_back, read_back_half_bytes, data, bytes, consume);
  }

 private:
  static CudaStream make_stream(int ordinal) {
    const CudaDeviceScope device_scope(ordinal);
    return CudaStream();
  }

  CudaReleaseScope _release;  // first: released last
  int _ordinal;
  std::string _name;
  CudaStream _copy_stream;
  CudaEvent _last_upload;
  mutable std::mutex _read_back_mutex;
  mutable std::optional<ReadBackBuffers> _read_back;  // made at the first read_back
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
                fmt::format("cuda:{}: no such device: {} visible (make_device picks the GPU "
                            "from the local rank, cuda_ordinal_for_local_rank; check "
                            "CUDA_VISIBLE_DEVICES)",
                            ordinal, probe.device_count));
  }
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace weightcast
