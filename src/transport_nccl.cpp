// The nccl data plane: one ncclBroadcast (ncclUint8: every dtype moves as raw bytes) per
// range, grouped per chunk, on a comm stream of the transport's own, after the chunk's H2D.
//
// Non-blocking communicator (NCCL docs, "Creating a communicator with options" and
// "Nonblocking group operation"): every NCCL call may return ncclInProgress while NCCL is
// still enqueueing; the communicator's state must be polled with ncclCommGetAsyncError until
// it is ncclSuccess before its results are used or another call is made on it. That polling
// is what lets a stalled rank be aborted (ncclCommAbort) instead of hanging in a blocking
// call.
#include "weightcast/transport.hpp"

#include "weightcast/detail/cuda_check.hpp"
#include "weightcast/detail/cuda_resources.hpp"
#include "weightcast/error.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace weightcast {

namespace detail {

void throw_nccl_error(ncclResult_t status, const char* call, ncclComm_t comm) {
  const Errc code = status == ncclInvalidArgument || status == ncclInvalidUsage
                        ? Errc::internal
                        : Errc::unavailable;
  const char* last = ncclGetLastError(comm);
  throw Error(code, fmt::format("{} failed: {}{}{}", call, ncclGetErrorString(status),
                                last != nullptr && *last != '\0' ? "; last NCCL error: " : "",
                                last != nullptr ? last : ""));
}

}  // namespace detail

namespace {

using detail::CudaEvent;
using detail::CudaStream;
using Clock = std::chrono::steady_clock;

/// The communicator, aborted unless it was finalised cleanly.
class Communicator {
 public:
  Communicator() = default;
  ~Communicator() {
    if (_comm == nullptr) return;
    // The caller's (make_nccl_transport of an NcclCommunicator): left as it was, unless a
    // failure makes an abort the only way to end what is in flight.
    if (!_owned && _healthy) return;
    if (_healthy) {
      // ncclCommFinalize flushes outstanding work; on a non-blocking communicator it may
      // return ncclInProgress: poll, bounded, then destroy (NCCL docs, "Finalizing a
      // communicator"). Any trouble: abort instead, which never waits for peers.
      ncclResult_t state = ncclCommFinalize(_comm);
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(_comm, &state) != ncclSuccess) state = ncclInternalError;
      }
      if (state == ncclSuccess) {
        // After ncclCommFinalize has completed, ncclCommDestroy frees local resources without
        // blocking (NCCL 2.14 release notes, NVIDIA/nccl#715); on a non-blocking communicator
        // the freeing may go on in a background thread. Whatever it returns (an error too:
        // the reclaim may have run), the handle is consumed: never pass it to NCCL again (no
        // ncclCommAbort after a destroy).
        const ncclResult_t destroyed = ncclCommDestroy(_comm);
        _comm = nullptr;
        if (destroyed != ncclSuccess && destroyed != ncclInProgress) {
          spdlog::warn("ncclCommDestroy failed: {}", ncclGetErrorString(destroyed));
        }
        return;
      }
      spdlog::warn("nccl: communicator did not finalise cleanly ({}); aborting it",
                   ncclGetErrorString(state));
    }
    abort();
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm_t* out() noexcept { return &_comm; }
  /// Takes the caller's @p comm, which is never finalised or destroyed (only aborted).
  void adopt(ncclComm_t comm) noexcept {
    _comm = comm;
    _owned = false;
  }
  [[nodiscard]] ncclComm_t get() const noexcept { return _comm; }

  /// @return the communicator's state: ncclSuccess, ncclInProgress or an error.
  [[nodiscard]] ncclResult_t state() const noexcept {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(_comm, &async);
    return status != ncclSuccess ? status : async;
  }

  /// Aborts the communicator: in-flight collectives end, peers see an error instead of
  /// waiting forever. Idempotent; never throws.
  void abort() noexcept {
    if (_comm == nullptr) return;
    const ncclResult_t status = ncclCommAbort(_comm);
    if (status != ncclSuccess && status != ncclInProgress) {
      spdlog::warn("ncclCommAbort failed: {}", ncclGetErrorString(status));
    }
    _comm = nullptr;
    _healthy = false;
  }
  void mark_failed() noexcept { _healthy = false; }

 private:
  ncclComm_t _comm = nullptr;
  bool _healthy = true;
  bool _owned = true;
};

/// A group of broadcasts in flight on the comm stream: NCCL has enqueued its kernels, and
/// `_event` was recorded on the comm stream after them.
class NcclBroadcast final : public Pending {
 public:
  NcclBroadcast(Communicator& comm, CudaEvent event, std::uint64_t bytes)
      : _comm(comm), _event(std::move(event)), _bytes(bytes) {}
  ~NcclBroadcast() override {
    if (_done) return;
    // Abandoned in flight (a stage failed, the watchdog fired): a broadcast may wait on a
    // peer forever, so abort the communicator (which ends its kernels), then wait for the
    // event before the arena it writes can be freed.
    spdlog::warn("nccl: broadcast of {} bytes abandoned in flight: aborting the communicator",
                 _bytes);
    _comm.abort();
    detail::log_cuda_release(cudaEventSynchronize(_event.get()), "cudaEventSynchronize");
  }
  NcclBroadcast(const NcclBroadcast&) = delete;
  NcclBroadcast& operator=(const NcclBroadcast&) = delete;

  bool test() override {
    if (_comm.get() == nullptr) {
      _done = true;
      throw Error(Errc::unavailable, "nccl: the communicator was aborted");
    }
    // An asynchronous error (a peer or the network failed) leaves the kernels waiting
    // forever: it shows in the communicator's state, not in the event.
    const ncclResult_t state = _comm.state();
    if (state != ncclSuccess && state != ncclInProgress) {
      _done = true;
      _comm.mark_failed();
      detail::throw_nccl_error(state, "ncclBroadcast (ncclCommGetAsyncError)", _comm.get());
    }
    const cudaError_t status = cudaEventQuery(_event.get());
    if (status == cudaErrorNotReady) return false;
    _done = true;
    if (status != cudaSuccess) {
      _comm.mark_failed();
      detail::throw_cuda_error(
          status, fmt::format("ncclBroadcast of {} bytes (cudaEventQuery)", _bytes).c_str());
    }
    return true;
  }

 private:
  Communicator& _comm;
  CudaEvent _event;
  std::uint64_t _bytes;
  bool _done = false;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(int rank, int world_size, int local_rank, const NcclUniqueId& unique_id,
                std::chrono::milliseconds timeout)
      : _rank(rank), _world_size(world_size), _local_rank(local_rank), _timeout(timeout) {
    detail::set_cuda_device(local_rank);
    _stream.emplace();
    ncclUniqueId id;
    static_assert(sizeof(id.internal) == nccl_unique_id_bytes);
    std::memcpy(id.internal, unique_id.data(), unique_id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t init = ncclCommInitRankConfig(_comm.out(), world_size, id, rank, &config);
    if (init != ncclSuccess && init != ncclInProgress) {
      // A communicator whose creation failed is only fit for ncclCommAbort (the destructor's).
      _comm.mark_failed();
      detail::throw_nccl_error(init, "ncclCommInitRankConfig", _comm.get());
    }
    wait_ready("ncclCommInitRankConfig", "the communicator was not ready",
               "a peer did not join");
  }
  // The caller's communicator, as it is.
  NcclTransport(ncclComm_t comm, int rank, int world_size, int local_rank,
                std::chrono::milliseconds timeout)
      : _rank(rank), _world_size(world_size), _local_rank(local_rank), _timeout(timeout) {
    detail::set_cuda_device(local_rank);
    _stream.emplace();
    _comm.adopt(comm);
  }
  // Members release in reverse order: the communicator (finalise or abort) before the stream.

  [[nodiscard]] std::string_view name() const noexcept override { return "nccl"; }
  [[nodiscard]] int rank() const noexcept override { return _rank; }
  [[nodiscard]] int world_size() const noexcept override { return _world_size; }

  std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes, int root) override {
    const Range range{data, bytes};
    return broadcast_group(std::span<const Range>(&range, 1), root, nullptr);
  }

  std::unique_ptr<Pending> broadcast_group(std::span<const Range> ranges, int root,
                                           void* ready_event) override {
    WEIGHTCAST_EXPECT(_comm.get() != nullptr, Errc::unavailable,
                      "nccl: the communicator was aborted after an earlier failure");
    detail::set_cuda_device(_local_rank);
    // Non-blocking communicator: no NCCL call and no CUDA work on the comm stream while the
    // previous group is still being enqueued (ncclInProgress). wait_ready below leaves the
    // communicator ready after every group, so this normally returns at the first poll.
    wait_ready("ncclGroupEnd (previous broadcast)", "the previous broadcast was not enqueued",
               "a peer stopped taking part");
    // CUDA stream order: the broadcast reads (on the root) what the copy stream wrote.
    if (ready_event != nullptr) {
      WEIGHTCAST_CUDA_TRY(
          cudaStreamWaitEvent(_stream->get(), static_cast<cudaEvent_t>(ready_event), 0));
    }
    CudaEvent done;
    std::uint64_t total = 0;
    WEIGHTCAST_NCCL_TRY(ncclGroupStart(), _comm.get());
    try {
      for (const Range& range : ranges) {
        if (range.bytes == 0) continue;
        // In place: on the root send and receive buffers are the same (NCCL docs,
        // "In-place Operations").
        WEIGHTCAST_NCCL_TRY(ncclBroadcast(range.data, range.data, range.bytes, ncclUint8, root,
                                          _comm.get(), _stream->get()),
                            _comm.get());
        total += range.bytes;
      }
    } catch (...) {
      static_cast<void>(ncclGroupEnd());
      _comm.mark_failed();
      throw;
    }
    const ncclResult_t end = ncclGroupEnd();
    if (end != ncclSuccess && end != ncclInProgress) {
      _comm.mark_failed();
      detail::throw_nccl_error(end, "ncclGroupEnd", _comm.get());
    }
    // ncclInProgress: the kernels are being enqueued in the background (NCCL docs,
    // "Nonblocking group operation"); only once the communicator is ncclSuccess are they in
    // the stream, so only then may the completion event be recorded after them.
    wait_ready("ncclGroupEnd", "the broadcast was not enqueued", "a peer stopped taking part");
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(done.get(), _stream->get()));
    return std::make_unique<NcclBroadcast>(_comm, std::move(done), total);
  }

 private:
  int _rank;
  int _world_size;
  int _local_rank;
  std::chrono::milliseconds _timeout;
  std::optional<CudaStream> _stream;  // the comm stream; after set_cuda_device
  Communicator _comm;

  // Polls the communicator until it leaves ncclInProgress, at most the timeout (NCCL 2.14+
  // non-blocking mode: poll ncclCommGetAsyncError until it is not ncclInProgress before the
  // next call or any use of the results; NVIDIA/nccl#715). Spins briefly first: enqueueing a
  // group normally takes microseconds, and a millisecond sleep per chunk would cost more
  // than a broadcast of 16 MiB over NVLink. Throws `timeout` (the communicator aborted) when
  // it stays in progress, the NCCL error (names @p call) when it fails.
  void wait_ready(const char* call, std::string_view what, std::string_view why) {
    const auto deadline = Clock::now() + _timeout;
    for (std::uint64_t polls = 0;; ++polls) {
      const ncclResult_t state = _comm.state();
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        _comm.mark_failed();
        detail::throw_nccl_error(state, call, _comm.get());
      }
      if (Clock::now() >= deadline) {
        _comm.abort();
        throw Error(Errc::timeout,
                    fmt::format("nccl: rank {} of {}: {} after {} ms (timeout, {}): {}", _rank,
                                _world_size, what, _timeout.count(), call, why));
      }
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }
};

}  // namespace

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  WEIGHTCAST_NCCL_TRY(ncclGetUniqueId(&id), nullptr);
  NcclUniqueId bytes;
  std::memcpy(bytes.data(), id.internal, bytes.size());
  return bytes;
}

std::unique_ptr<Transport> make_nccl_transport(int rank, int world_size, int local_rank,
                                               const NcclUniqueId& unique_id,
                                               std::chrono::milliseconds timeout) {
  WEIGHTCAST_EXPECT(world_size >= 1 && rank >= 0 && rank < world_size, Errc::internal,
                    fmt::format("nccl: rank {} of world size {}", rank, world_size));
  return std::make_unique<NcclTransport>(rank, world_size, local_rank, unique_id, timeout);
}

std::pair<int, int> nccl_rank_and_size(const NcclCommunicator& communicator) {
  WEIGHTCAST_EXPECT(communicator.comm != nullptr, Errc::unavailable,
                    "transport nccl: the communicator handed in is null");
  const auto comm = static_cast<ncclComm_t>(communicator.comm);
  int rank = 0;
  int size = 0;
  WEIGHTCAST_NCCL_TRY(ncclCommUserRank(comm, &rank), comm);
  WEIGHTCAST_NCCL_TRY(ncclCommCount(comm, &size), comm);
  return {rank, size};
}

std::unique_ptr<Transport> make_nccl_transport(const NcclCommunicator& communicator,
                                               std::chrono::milliseconds timeout) {
  const auto [rank, size] = nccl_rank_and_size(communicator);
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(communicator.comm), rank, size,
                                         communicator.cuda_device, timeout);
}

}  // namespace weightcast
