// The nccl data plane: one ncclBroadcast (ncclUint8: every dtype moves as raw bytes) per
// range, grouped per chunk, on a comm stream of the transport's own, after the chunk's H2D;
// a placed chunk's slices as ncclSend/ncclRecv, grouped per chunk the same way.
//
// Non-blocking communicator (NCCL docs, "Creating a communicator with options" and
// "Nonblocking group operation"): every NCCL call may return ncclInProgress while NCCL is
// still enqueueing; the communicator's state must be polled with ncclCommGetAsyncError until
// it is ncclSuccess before its results are used or another call is made on it. That polling
// is what lets a stalled rank be aborted (ncclCommAbort) instead of hanging in a blocking
// call.
#include "weightcast/transport/transport.hpp"

#include "weightcast/device/detail/cuda_check.hpp"
#include "weightcast/device/detail/cuda_resources.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/gpu_info.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
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

/// The communicator: finalised and destroyed when healthy, else aborted (every failure aborts
/// it at once, so a handle still held here has seen none). A borrowed one (the caller's) is
/// never finalised, destroyed or aborted here: its owner (torch's ProcessGroup) still holds it
/// and frees it at its own shutdown, so an abort here would free it twice.
class Communicator {
 public:
  Communicator() = default;
  ~Communicator() {
    if (_comm == nullptr) return;  // never created, or aborted after a failure
    // The caller's (make_nccl_transport of an NcclCommunicator): left as it was.
    if (!_owned) return;
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
    abort();
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm_t* out() noexcept { return &_comm; }
  /// Takes the caller's @p comm, which is never finalised, destroyed or aborted.
  void adopt(ncclComm_t comm) noexcept {
    _comm = comm;
    _owned = false;
  }
  [[nodiscard]] ncclComm_t get() const noexcept { return _comm; }
  [[nodiscard]] bool owned() const noexcept { return _owned; }

  /// @return the communicator's state: ncclSuccess, ncclInProgress or an error.
  [[nodiscard]] ncclResult_t state() const noexcept {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(_comm, &async);
    return status != ncclSuccess ? status : async;
  }

  /// Aborts the communicator: in-flight collectives end, peers see an error instead of
  /// waiting forever. A borrowed one is only let go of (its owner aborts it). Idempotent;
  /// never throws.
  void abort() noexcept {
    if (_comm == nullptr) return;
    if (!_owned) {
      _comm = nullptr;
      return;
    }
    const ncclResult_t status = ncclCommAbort(_comm);
    if (status != ncclSuccess && status != ncclInProgress) {
      spdlog::warn("ncclCommAbort failed: {}", ncclGetErrorString(status));
    }
    _comm = nullptr;
  }

 private:
  ncclComm_t _comm = nullptr;
  bool _owned = true;
};

/// What a transport and its operations in flight share: the comm stream and the
/// communicator. Shared ownership: a `Pending` that outlives its transport (an embedder that
/// destroys the transport first) still holds what its destructor aborts and waits on.
struct CommState {
  CommState(int ordinal, std::chrono::milliseconds timeout) : ordinal(ordinal), timeout(timeout) {
    const detail::CudaDeviceScope device_scope(ordinal);
    stream.emplace();
  }
  // Members release in reverse order: the communicator (finalise or abort) before the stream
  // (which waits for what is left on it), on this device whichever thread drops the last
  // reference. A comm stream that did not drain (`busy`) is left as it is: destroying it
  // would wait for kernels that only the communicator's owner can end.
  ~CommState() {
    release.enter(ordinal);
    if (busy && stream) {
      spdlog::warn("nccl: leaving the comm stream on cuda:{} and what its NCCL work touches "
                   "allocated: that work still runs on the communicator handed in",
                   ordinal);
      static_cast<void>(stream->release());
    }
  }
  CommState(const CommState&) = delete;
  CommState& operator=(const CommState&) = delete;

  /// After any NCCL or CUDA error on this communicator the only valid call is
  /// ncclCommAbort (NCCL docs, "Error handling and communicator abort"): abort it, which
  /// ends its kernels, then wait for the comm stream, so that nothing NCCL launched still
  /// writes the arena once the error reaches the loader (whose unwinding frees the arena).
  /// A borrowed communicator is not aborted (its owner does that; see `owner_note`): the
  /// comm stream is waited for at most the timeout, as its kernels may wait on a lost peer
  /// until the owner aborts. Idempotent; never throws.
  /// @return whether the comm stream drained.
  bool abort_and_drain() noexcept {
    const detail::CudaDeviceScope device_scope(ordinal, std::nothrow);
    const bool owned = comm.owned();
    comm.abort();
    if (!stream) return true;
    if (owned) {
      const cudaError_t synced = cudaStreamSynchronize(stream->get());
      detail::log_cuda_release(synced, "cudaStreamSynchronize (comm stream, after ncclCommAbort)");
      return synced == cudaSuccess;
    }
    const auto deadline = Clock::now() + timeout;
    cudaError_t status = cudaStreamQuery(stream->get());
    while (status == cudaErrorNotReady && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      status = cudaStreamQuery(stream->get());
    }
    if (status == cudaErrorNotReady) {
      spdlog::warn("nccl: the comm stream still runs NCCL work on the communicator handed in "
                   "after {} ms: its owner must abort the communicator (ncclCommAbort)",
                   timeout.count());
      busy = true;
      return false;
    }
    detail::log_cuda_release(status, "cudaStreamQuery (comm stream, after a failure)");
    return status == cudaSuccess;
  }

  /// Rethrows the exception in flight; for a borrowed communicator an Error gains what its
  /// owner must do, since weightcast leaves the abort to it.
  [[noreturn]] void rethrow() const {
    if (comm.owned()) throw;
    try {
      throw;
    } catch (const Error& e) {
      throw Error(e.code(), std::string(e.what()) + owner_note);
    }
  }

  static constexpr const char* owner_note =
      " (the NCCL communicator was handed in: weightcast does not abort a communicator it "
      "does not own; its owner must abort it before using or destroying it: ncclCommAbort, or "
      "with torch, abort the process group / destroy_process_group())";

  detail::CudaReleaseScope release;  // first: released last
  int ordinal;
  std::chrono::milliseconds timeout;
  /// The comm stream did not drain after a failure (a borrowed communicator): its kernels may
  /// still write the arena and read the send buffers, which the load then keeps
  /// (`Transport::may_still_touch_memory`).
  std::atomic<bool> busy{false};
  std::optional<CudaStream> stream;  // the comm stream; created after cudaSetDevice
  Communicator comm;
};

/// A group of collectives in flight on the comm stream: NCCL has enqueued its kernels, and
/// `_event` was recorded on the comm stream after them.
class NcclGroup final : public Pending {
 public:
  NcclGroup(std::shared_ptr<CommState> state, CudaEvent event, std::uint64_t bytes,
            const char* what)
      : _state(std::move(state)), _event(std::move(event)), _bytes(bytes), _what(what) {}
  ~NcclGroup() override {
    _release.enter(_state->ordinal);
    if (_done) return;
    // Abandoned in flight (a stage failed, the watchdog fired): a collective may wait on a
    // peer forever, so abort the communicator (which ends its kernels), then wait for the
    // comm stream before the arena it writes can be freed.
    spdlog::warn("nccl: {} of {} bytes abandoned in flight: {}", _what, _bytes,
                 _state->comm.owned() ? "aborting the communicator"
                                      : "its owner must abort the communicator handed in");
    if (_state->abort_and_drain()) {
      detail::log_cuda_release(cudaEventSynchronize(_event.get()), "cudaEventSynchronize");
    }
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  bool test() override {
    if (_done) return true;
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    try {
      if (_state->comm.get() == nullptr) {
        throw Error(Errc::unavailable,
                    fmt::format("nccl: {}: the communicator was aborted", _what));
      }
      // An asynchronous error (a peer or the network failed) leaves the kernels waiting
      // forever: it shows in the communicator's state, not in the event.
      const ncclResult_t state = _state->comm.state();
      if (state != ncclSuccess && state != ncclInProgress) {
        detail::throw_nccl_error(state, fmt::format("{} (ncclCommGetAsyncError)", _what).c_str(),
                                 _state->comm.get());
      }
      const cudaError_t status = cudaEventQuery(_event.get());
      if (status == cudaErrorNotReady) return false;
      if (status != cudaSuccess) {
        detail::throw_cuda_error(
            status, fmt::format("{} of {} bytes (cudaEventQuery)", _what, _bytes).c_str());
      }
      _done = true;
      return true;
    } catch (...) {
      _done = true;  // failed: nothing waits for it any more, once the stream is drained
      _state->abort_and_drain();
      _state->rethrow();
    }
  }

 private:
  detail::CudaReleaseScope _release;  // first: released last, after the event
  std::shared_ptr<CommState> _state;
  CudaEvent _event;
  std::uint64_t _bytes;
  const char* _what;
  bool _done = false;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(int rank, int world_size, int local_rank, const NcclUniqueId& unique_id,
                std::chrono::milliseconds timeout)
      : _rank(rank),
        _world_size(world_size),
        _timeout(timeout),
        _state(std::make_shared<CommState>(
            cuda_ordinal_for_local_rank(local_rank, cuda_device_count()), timeout)) {
    ncclUniqueId id;
    static_assert(sizeof(id.internal) == nccl_unique_id_bytes);
    std::memcpy(id.internal, unique_id.data(), unique_id.size());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    // NCCL creates the communicator on the calling thread's current device.
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    try {
      const ncclResult_t init =
          ncclCommInitRankConfig(_state->comm.out(), world_size, id, rank, &config);
      if (init != ncclSuccess && init != ncclInProgress) {
        detail::throw_nccl_error(init, "ncclCommInitRankConfig", _state->comm.get());
      }
      wait_ready("ncclCommInitRankConfig", "the communicator was not ready",
                 "a peer did not join");
      connect();
    } catch (...) {
      // A communicator whose creation failed is only fit for ncclCommAbort.
      _state->abort_and_drain();
      throw;
    }
  }

  // The caller's communicator, as it is, on its CUDA device @p cuda_device (an ordinal).
  NcclTransport(ncclComm_t comm, int rank, int world_size, int cuda_device,
                std::chrono::milliseconds timeout)
      : _rank(rank),
        _world_size(world_size),
        _timeout(timeout),
        _state(std::make_shared<CommState>(cuda_device, timeout)) {
    _state->comm.adopt(comm);
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "nccl"; }
  [[nodiscard]] int rank() const noexcept override { return _rank; }
  [[nodiscard]] int world_size() const noexcept override { return _world_size; }

  // A CUDA event may be waited on from another stream once recorded; destroying it after
  // the wait is queued is allowed (CUDA Runtime API, cudaEventDestroy).
  void order_after(const CallerStream& caller) override {
    if (caller.is_none()) return;
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    CudaEvent queued;
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(queued.get(), detail::cuda_handle(caller)));
    WEIGHTCAST_CUDA_TRY(cudaStreamWaitEvent(stream(), queued.get(), 0));
  }

  void order_before(const CallerStream& caller) override {
    if (caller.is_none()) return;
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    CudaEvent written;
    WEIGHTCAST_CUDA_TRY(cudaEventRecord(written.get(), stream()));
    WEIGHTCAST_CUDA_TRY(cudaStreamWaitEvent(detail::cuda_handle(caller), written.get(), 0));
  }

  [[nodiscard]] bool may_still_touch_memory() const noexcept override { return _state->busy; }

  // Placement's deliveries: NCCL's documented scatter (NCCL docs, "Point-to-point
  // communication": ncclSend/ncclRecv fused in ncclGroupStart/End, sizes free per rank).
  // Calls within a group to the same peer execute in order, and groups on the one comm
  // stream in stream order, so messages match as the plan posts them: @p tag is MPI's only.
  // Counts are size_t: no split. Device memory at both ends (the loader uploads what rank 0
  // sends). Failures abort and drain as a broadcast's do (enqueue_group, NcclGroup).
  std::unique_ptr<Pending> exchange(std::span<const Message> sends,
                                    std::span<const Message> receives, int /*tag*/) override {
    if (sends.empty() && receives.empty()) return nullptr;
    std::uint64_t total = 0;
    return enqueue_group("ncclSend/ncclRecv", nullptr, total, [&] {
      for (const Message& m : receives) {
        if (m.bytes == 0) continue;
        WEIGHTCAST_NCCL_TRY(ncclRecv(m.data, m.bytes, ncclUint8, m.peer, comm(), stream()),
                            comm());
        total += m.bytes;
      }
      for (const Message& m : sends) {
        if (m.bytes == 0) continue;
        WEIGHTCAST_NCCL_TRY(ncclSend(m.data, m.bytes, ncclUint8, m.peer, comm(), stream()),
                            comm());
        total += m.bytes;
      }
    });
  }

  std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes, int root) override {
    const Range range{data, bytes};
    return broadcast_group(std::span<const Range>(&range, 1), root, nullptr);
  }

  std::unique_ptr<Pending> broadcast_group(std::span<const Range> ranges, int root,
                                           void* ready_event) override {
    std::uint64_t total = 0;
    return enqueue_group("ncclBroadcast", ready_event, total, [&] {
      for (const Range& range : ranges) {
        if (range.bytes == 0) continue;
        // In place: on the root send and receive buffers are the same (NCCL docs,
        // "In-place Operations").
        WEIGHTCAST_NCCL_TRY(ncclBroadcast(range.data, range.data, range.bytes, ncclUint8, root,
                                          comm(), stream()),
                            comm());
        total += range.bytes;
      }
    });
  }

 private:
  int _rank;
  int _world_size;
  std::chrono::milliseconds _timeout;
  std::shared_ptr<CommState> _state;

  [[nodiscard]] ncclComm_t comm() const noexcept { return _state->comm.get(); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return _state->stream->get(); }

  // One group of NCCL calls (@p calls: ncclBroadcast, ncclSend/ncclRecv ... on comm() and
  // stream(), adding their bytes to @p bytes) after @p ready_event, as one Pending. Any
  // failure, from the calls, ncclGroupEnd, the enqueue poll or CUDA, aborts the communicator
  // and drains the comm stream before it is thrown.
  template <class Calls>
  std::unique_ptr<Pending> enqueue_group(const char* what, void* ready_event,
                                         const std::uint64_t& bytes, Calls&& calls) {
    WEIGHTCAST_EXPECT(comm() != nullptr, Errc::unavailable,
                      "nccl: the communicator was aborted (one handed in: let go of) after an "
                      "earlier failure");
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    try {
      // Non-blocking communicator: no NCCL call and no CUDA work on the comm stream while
      // the previous group is still being enqueued (ncclInProgress). wait_ready below
      // leaves the communicator ready after every group, so this normally returns at once.
      wait_ready(what, "the previous group was not enqueued", "a peer stopped taking part");
      // CUDA stream order: the group reads (on the root) what the copy stream wrote.
      if (ready_event != nullptr) {
        WEIGHTCAST_CUDA_TRY(
            cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(ready_event), 0));
      }
      CudaEvent done;
      WEIGHTCAST_NCCL_TRY(ncclGroupStart(), comm());
      try {
        calls();
      } catch (...) {
        // Every ncclGroupStart needs its ncclGroupEnd, but what this rank's half group
        // launches would leave its peers waiting: the abort below ends it whatever
        // ncclGroupEnd says; its result is logged, the first error is the one thrown.
        const ncclResult_t end = ncclGroupEnd();
        if (end != ncclSuccess && end != ncclInProgress) {
          spdlog::warn("nccl: ncclGroupEnd after a failed {}: {}", what,
                       ncclGetErrorString(end));
        }
        throw;
      }
      const ncclResult_t end = ncclGroupEnd();
      if (end != ncclSuccess && end != ncclInProgress) {
        detail::throw_nccl_error(end, fmt::format("ncclGroupEnd ({})", what).c_str(), comm());
      }
      // ncclInProgress: the kernels are being enqueued in the background (NCCL docs,
      // "Nonblocking group operation"); only once the communicator is ncclSuccess are they
      // in the stream, so only then may the completion event be recorded after them.
      wait_ready(what, "the group was not enqueued", "a peer stopped taking part");
      WEIGHTCAST_CUDA_TRY(cudaEventRecord(done.get(), stream()));
      return std::make_unique<NcclGroup>(_state, std::move(done), bytes, what);
    } catch (...) {
      _state->abort_and_drain();
      _state->rethrow();
    }
  }

  // Connects the ranks now, with a 1-byte broadcast: NCCL connects peers lazily at the first
  // collective (NCCL_RUNTIME_CONNECT, on by default since 2.22) and allocates its
  // connection buffers then, on the device. The transport exists before the load allocates
  // its arena, so they are taken now, and an arena near the GPU's memory fails to allocate
  // with its size and the device's free memory, instead of the first chunk's broadcast
  // failing out of memory. Broadcast runs only the ring algorithm (NCCL docs, "Collective
  // Operations"), so this connects every channel it uses. Bounded by the timeout.
  void connect() {
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    detail::DeviceMemory byte(1);
    std::uint64_t bytes = 0;
    auto pending = enqueue_group("ncclBroadcast (connecting the ranks)", nullptr, bytes, [&] {
      WEIGHTCAST_NCCL_TRY(
          ncclBroadcast(byte.data(), byte.data(), 1, ncclUint8, 0, comm(), stream()), comm());
      bytes = 1;
    });
    wait_connected(std::move(pending), "connecting the ranks");
  }

 public:
  // Point-to-point channels are connected at the first ncclSend/ncclRecv between two ranks,
  // and their buffers allocated then, on the device (as broadcast's, above): a placed load
  // connects @p root to every other rank with a 1-byte send each, before its arena.
  void connect_exchange(int root) override {
    if (_world_size < 2) return;
    WEIGHTCAST_EXPECT(root >= 0 && root < _world_size, Errc::internal,
                      fmt::format("nccl: connect_exchange: root {} of {}", root, _world_size));
    const detail::CudaDeviceScope device_scope(_state->ordinal);
    detail::DeviceMemory bytes(static_cast<std::uint64_t>(_world_size));
    std::uint64_t total = 0;
    auto pending = enqueue_group("ncclSend/ncclRecv (connecting the root to each rank)", nullptr,
                                 total, [&] {
      if (_rank == root) {
        for (int peer = 0; peer < _world_size; ++peer) {
          if (peer == root) continue;
          WEIGHTCAST_NCCL_TRY(
              ncclSend(bytes.data() + peer, 1, ncclUint8, peer, comm(), stream()), comm());
          ++total;
        }
      } else {
        WEIGHTCAST_NCCL_TRY(ncclRecv(bytes.data(), 1, ncclUint8, root, comm(), stream()),
                            comm());
        total = 1;
      }
    });
    wait_connected(std::move(pending), "connecting the root to each rank point to point");
  }

 private:
  // Waits, at most the timeout, for a connecting group; on a timeout aborts and drains before
  // the buffer it writes is freed.
  void wait_connected(std::unique_ptr<Pending> pending, std::string_view what) {
    const auto deadline = Clock::now() + _timeout;
    while (!pending->test()) {
      if (Clock::now() >= deadline) {
        _state->abort_and_drain();  // before the group's buffer is freed
        throw Error(Errc::timeout,
                    fmt::format("nccl: rank {} of {}: {} did not complete after {} ms "
                                "(timeout): a peer did not take part",
                                _rank, _world_size, what, _timeout.count()));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Polls the communicator until it leaves ncclInProgress, at most the timeout (NCCL 2.14+
  // non-blocking mode: poll ncclCommGetAsyncError until it is not ncclInProgress before the
  // next call or any use of the results; NVIDIA/nccl#715). Spins briefly first: enqueueing a
  // group normally takes microseconds, and a millisecond sleep per chunk would cost more
  // than a broadcast of 16 MiB over NVLink. Throws `timeout` when it stays in progress, the
  // NCCL error (names @p call) when it fails; the caller aborts.
  void wait_ready(const char* call, std::string_view what, std::string_view why) {
    const auto deadline = Clock::now() + _timeout;
    for (std::uint64_t polls = 0;; ++polls) {
      const ncclResult_t state = _state->comm.state();
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) detail::throw_nccl_error(state, call, comm());
      if (Clock::now() >= deadline) {
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
  // The arena goes on cuda_device and NCCL's kernels run on the communicator's own device: a
  // mismatch would have NCCL read and write another GPU's memory.
  const auto comm = static_cast<ncclComm_t>(communicator.comm);
  int device = -1;
  WEIGHTCAST_NCCL_TRY(ncclCommCuDevice(comm, &device), comm);
  if (device != communicator.cuda_device) {
    throw Error(Errc::config,
                fmt::format("transport nccl: rank {} of {}: the communicator handed in is on "
                            "CUDA device {} (ncclCommCuDevice), but NcclCommunicator::cuda_device "
                            "says {}: give the device the communicator was created on (torch: "
                            "the process group's device, torch.cuda.current_device() at its "
                            "creation)",
                            rank, size, device, communicator.cuda_device));
  }
  return std::make_unique<NcclTransport>(static_cast<ncclComm_t>(communicator.comm), rank, size,
                                         communicator.cuda_device, timeout);
}

}  // namespace weightcast
