/**
 * @file transport.hpp
 * @brief The data plane: broadcasts each chunk from the root rank into every rank's arena.
 *
 * `local` (world size 1) does nothing; `mpi` (host memory, `MPI_Ibcast`) is in
 * transport_mpi.hpp; `tcp` (host memory over TCP from rank 0, no MPI) in transport_tcp.hpp;
 * `nccl` (device memory, docs/DESIGN.md § Transports) broadcasts on a dedicated
 * comm stream. Every rank calls `broadcast` for the same chunks in the same order (the
 * plan), as NCCL and MPI collectives require.
 *
 * The nccl factories exist in every build; without CUDA compiled in they throw
 * `Errc::unavailable`, so callers need no `#ifdef`.
 */
#pragma once

#include "weightcast/device/cuda_stream.hpp"
#include "weightcast/transport/communicators.hpp"
#include "weightcast/core/pending.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

namespace weightcast {

namespace detail {
class NodeRing;
}  // namespace detail

class Transport {
 public:
  virtual ~Transport() = default;
  /// @return "local", "mpi", "nccl", "shm" or "tcp".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// @return this rank, 0 ≤ rank < world size.
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// @return the number of ranks.
  [[nodiscard]] virtual int world_size() const noexcept = 0;
  /// @return true when every rank runs on rank 0's node and a receiver copies what it
  ///         receives out of the sender's memory itself (`mpi` within one node: Open MPI's
  ///         single-copy path). A sender may then send from any memory it can read, a
  ///         read-only file mapping included (docs/DESIGN.md § Placement); elsewhere the
  ///         network stack may have to register it for writing, and `false` says not to.
  [[nodiscard]] virtual bool receivers_read_sender_memory() const noexcept { return false; }
  /// @return the staging ring this node's ranks share (`shm`: rank 0 reads into it, every
  ///         rank copies out of it; docs/DESIGN.md § Staging), else null. The transport owns
  ///         it.
  [[nodiscard]] virtual detail::NodeRing* node_ring() noexcept { return nullptr; }
  /// Orders this transport's later device writes after the work queued so far on the
  /// caller's @p stream, as `Device::order_after` does for uploads: `nccl`'s comm stream
  /// waits on an event recorded on it. Nothing when @p stream is none; others: nothing to
  /// order.
  /// @throws Error as `detail::throw_cuda_error` (`nccl`).
  virtual void order_after(const CallerStream& stream) { static_cast<void>(stream); }
  /// Makes the caller's @p stream wait for every collective issued so far (`nccl`: an event
  /// recorded on the comm stream). Others: nothing to order.
  /// @throws Error as `order_after`.
  virtual void order_before(const CallerStream& stream) { static_cast<void>(stream); }
  /// @return true when device work this transport issued may still write (or read) memory
  ///         after a failure: `nccl` on a communicator handed in, whose comm stream did not
  ///         drain within `timeout` because weightcast does not abort a communicator it does
  ///         not own. The load then keeps the memory that work touches alive (it leaks it,
  ///         with a warning) instead of freeing it under running kernels.
  [[nodiscard]] virtual bool may_still_touch_memory() const noexcept { return false; }
  /// Connects @p root to every other rank for `exchange` now, where the transport would do
  /// it lazily at the first message and allocate device memory then (`nccl`: a 1-byte
  /// ncclSend from the root to each rank, so NCCL's point-to-point buffers are taken before
  /// a placed load's arena). Every rank calls it. Others: nothing to do.
  /// @throws Error as `exchange` does; `timeout` (75) when a peer does not take part.
  virtual void connect_exchange(int root) { static_cast<void>(root); }
  /**
   * @brief Starts broadcasting @p bytes at @p data from @p root to every rank.
   * @param data arena memory: the source on the root, the destination elsewhere.
   * @param bytes length, bytes (0: nothing to do).
   * @param root the rank whose bytes every rank receives, 0 ≤ root < world size.
   * @return null when already complete (`local`; `mpi` with 0 bytes or one rank), else the
   *         broadcast in flight; its `test()` throws as below when the broadcast fails.
   * @throws Error `unavailable` (69) when the collective cannot be started or fails (`mpi`:
   *         `MPI_Ibcast`/`MPI_Testall` returned an error, named; `nccl`: as
   *         `make_nccl_transport` says).
   */
  virtual std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes,
                                             int root) = 0;

  /// One arena range of a grouped broadcast.
  struct Range {
    std::byte* data = nullptr;  ///< Arena memory: source on the root, destination elsewhere.
    std::uint64_t bytes = 0;    ///< Length, bytes.
  };
  /**
   * @brief Broadcasts several ranges (the pieces of one chunk) from @p root as one operation.
   *
   * The default calls `broadcast` for each range. `nccl` issues one `ncclBroadcast` per range
   * inside `ncclGroupStart/End` (NCCL docs, "Group Calls": aggregated operations launch
   * together) on its comm stream.
   * @param ready_event a `cudaEvent_t` (from `Device::upload_event()`) the broadcast must
   *        follow in CUDA stream order, or null. Transports that work on host memory ignore it
   *        (their uploads have completed when this is called).
   * @return null when already complete, else the whole group in flight.
   * @throws Error as `broadcast` does.
   */
  virtual std::unique_ptr<Pending> broadcast_group(std::span<const Range> ranges, int root,
                                                   void* ready_event);

  /// One point-to-point message of an `exchange` (placement: a rank's slice of a chunk).
  struct Message {
    int peer = 0;               ///< The rank it goes to (a send) or comes from (a receive).
    std::byte* data = nullptr;  ///< Source (send) or destination (receive), contiguous.
    std::uint64_t bytes = 0;    ///< Length, bytes (> 0); any size (split below `int` counts).
  };
  /**
   * @brief Starts sending @p sends and receiving @p receives as one operation: the
   *        deliveries of one chunk of a placed plan (placement.hpp).
   *
   * Messages between two ranks match in the order both post them (MPI's non-overtaking
   * rule; NCCL's in-order send/recv), so every rank posts the plan's chunks in plan order.
   * `mpi`: `MPI_Isend`/`MPI_Irecv` on host memory, on the session's communicator, a message
   * over `INT_MAX` bytes split into several; a peer's messages of at most 64 KiB go first,
   * together as one message of an hindexed datatype (at most 32,767 a message), so a chunk of
   * many small slices is a few requests, not one per slice. `nccl`: `ncclSend`/`ncclRecv` inside one
   * `ncclGroupStart/End` on the comm stream (NCCL docs, "Point-to-point communication": a
   * group's calls to one peer run in order; NCCL ≥ 2.7), device memory at both ends, a peer
   * may be this rank itself; it fails, aborts and drains as `broadcast_group` does
   * (`make_nccl_transport`). The default throws.
   * @param tag distinguishes one chunk's messages from the next (0 ≤ tag < 32768).
   * @return null when there is nothing to do, else the whole exchange in flight.
   * @throws Error `unavailable` (69) naming the call when a send or receive cannot be
   *         started or fails (`nccl`: also `timeout` (75) and `internal` (70) as
   *         `broadcast_group`); `config` (78) from a transport that cannot exchange slices
   *         (`local`: world size 1 has no peer).
   */
  virtual std::unique_ptr<Pending> exchange(std::span<const Message> sends,
                                            std::span<const Message> receives, int tag);
};

/// @return the world-size-1 transport: broadcast is a no-op (returns null). Never throws.
std::unique_ptr<Transport> make_local_transport();

/// Size of an `ncclUniqueId` (`NCCL_UNIQUE_ID_BYTES` in nccl.h), bytes.
inline constexpr std::size_t nccl_unique_id_bytes = 128;
/// An `ncclUniqueId` as raw bytes: what the control plane carries from rank 0 to every rank.
using NcclUniqueId = std::array<std::byte, nccl_unique_id_bytes>;

/**
 * @brief A fresh `ncclUniqueId` (`ncclGetUniqueId`); call it on rank 0 only, then send it to
 *        every rank before any of them calls `make_nccl_transport`.
 * @throws Error `unavailable` (69) when the build has no CUDA or NCCL fails (names the NCCL
 *         error and `ncclGetLastError`; `internal` (70) for NCCL's invalid argument or usage,
 *         `detail::throw_nccl_error`).
 */
NcclUniqueId nccl_unique_id();

/**
 * @brief Joins the NCCL communicator of @p world_size ranks named by @p unique_id.
 *
 * Non-blocking communicator (`ncclCommInitRankConfig` with `config.blocking = 0`): creation
 * is polled with `ncclCommGetAsyncError` until it leaves `ncclInProgress`, at most
 * @p timeout, so a rank whose peers never come fails instead of hanging; and a watchdog can
 * `ncclCommAbort` a collective in flight (NCCL docs, "Error handling and communicator
 * abort"). Broadcasts run on a non-blocking comm stream of the transport's own;
 * `broadcast_group` returns once NCCL has enqueued the group's kernels (it polls the
 * communicator out of `ncclInProgress`, at most @p timeout; a `LoadOptions::stop` is seen
 * once it returns), and the returned `Pending` completes with a CUDA event recorded after
 * them.
 * Before returning, the constructor connects the ranks with a 1-byte broadcast (NCCL connects
 * lazily at the first collective and allocates its connection buffers on the device then):
 * create the transport before the arena, so that an arena too large for what is left fails
 * to allocate, naming the device's free memory, instead of the first chunk's broadcast.
 * Any NCCL or CUDA failure — a call, `ncclGroupEnd`, `ncclCommGetAsyncError`, a CUDA event,
 * a timeout — and destroying a broadcast still in flight abort the communicator
 * (`ncclCommAbort`, the only call NCCL allows after an error) and wait for the comm stream
 * before the error is thrown: once a call or `Pending::test()` has thrown, or a `Pending` is
 * destroyed, no NCCL kernel writes the arena any more, so the caller may free it. A pending
 * broadcast shares ownership of the communicator and the comm stream, so it may outlive the
 * transport.
 * @param rank this rank, 0 ≤ rank < @p world_size.
 * @param local_rank this process's rank on its node; the CUDA device is
 *        `cuda_ordinal_for_local_rank(local_rank, cudaGetDeviceCount())` (gpu_info.hpp: the
 *        only visible device, else the local rank's), the same device `make_device` picks.
 * @param timeout bound on communicator creation and on enqueueing each broadcast group.
 * @throws Error `unavailable` (69) when the build has no CUDA, the device cannot be used (as
 *         `cuda_ordinal_for_local_rank` says) or NCCL fails (names the NCCL error and
 *         `ncclGetLastError`); `timeout` (75) when the communicator is not ready, or the
 *         ranks not connected, within @p timeout (the communicator is aborted);
 *         `internal` (70) when @p rank is not in 0..@p world_size - 1, or for NCCL's invalid
 *         argument or usage and CUDA errors other than a missing or exhausted device
 *         (`detail::throw_nccl_error`, `detail::throw_cuda_error`). The transport's
 *         `broadcast_group` throws the same way, and `unavailable` once the communicator has
 *         been aborted after an earlier failure.
 */
std::unique_ptr<Transport> make_nccl_transport(int rank, int world_size, int local_rank,
                                               const NcclUniqueId& unique_id,
                                               std::chrono::milliseconds timeout);

/// @return the rank and the size of the caller's NCCL @p communicator (`ncclCommUserRank`,
///         `ncclCommCount`: local calls).
/// @throws Error `unavailable` (69) when the build has no CUDA or NCCL fails (a null or
///         invalid communicator).
std::pair<int, int> nccl_rank_and_size(const NcclCommunicator& communicator);

/**
 * @brief Broadcasts on the caller's NCCL @p communicator as it is (none is created): its rank
 *        and size are the transport's, its CUDA device (`NcclCommunicator::cuda_device`) the
 *        one the arena must be on. Works with a blocking or a non-blocking communicator; a
 *        non-blocking one is polled as `make_nccl_transport` above says, bounded by @p timeout.
 *
 * The communicator is never finalised, destroyed or aborted here: its owner (torch's
 * ProcessGroup) frees it at its own shutdown, and an abort here would free it twice. After a
 * failure, and when the transport is destroyed with a broadcast in flight, the transport lets
 * go of it, waits at most @p timeout for its comm stream, and the error ends with what the
 * owner must do: abort it (`ncclCommAbort`: NCCL docs, "Error handling and communicator
 * abort", the only way to end a collective that waits for a lost peer) before any other use.
 * @throws Error as `make_nccl_transport` above; `unavailable` (69) for a null communicator;
 *         `config` (78) when `ncclCommCuDevice` is not `communicator.cuda_device` (the arena
 *         would be on another GPU than NCCL's kernels).
 */
std::unique_ptr<Transport> make_nccl_transport(const NcclCommunicator& communicator,
                                               std::chrono::milliseconds timeout);

}  // namespace weightcast
