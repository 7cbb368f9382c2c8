/**
 * @file in_flight.hpp
 * @brief The pipeline's bookkeeping of chunks between two stages: copies queued on the device
 *        (`Uploading`), rank 0's slots held for a placed chunk's sends (`HeldSlot`), and
 *        broadcasts or exchanges posted (`InFlight`), each kept in plan order (`PlanOrder`).
 *
 * Internal (includes Boost.Asio through the staging ring; never installed). NOT THREAD SAFE:
 * the stages share these on one executor that runs one handler at a time. Each record owns
 * what its operation in flight may still read or write — the slot's lease, packed slices,
 * cast windows — so dropping it early would hand that memory to the next chunk while the
 * device or the transport still uses it (docs/DESIGN.md § Staging).
 */
#pragma once

#include "weightcast/core/error.hpp"
#include "weightcast/core/pending.hpp"
#include "weightcast/io/detail/staging_ring.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

namespace weightcast::detail {

/// A chunk's broadcast (or a placed chunk's exchange), posted on this rank and not yet seen
/// to complete.
struct InFlight {
  std::size_t chunk = 0;
  std::unique_ptr<Pending> pending;             ///< null: already complete (or nothing to send)
  std::chrono::steady_clock::time_point begin;  ///< when it was posted
  // A placed plan only: rank 0's slot the sends read from, the packed slices they send, and
  // on a receiving rank the windows that cast wants land in before their cast, packed in
  // `window_memory` (a chunk's windows are disjoint parts of it: at most its bytes).
  SlotLease lease;
  std::vector<std::vector<std::byte>> buffers;
  struct Window {
    std::uint32_t want;
    std::uint64_t local_offset;
    std::uint64_t bytes;
    std::uint64_t at;  ///< Offset in window_memory.
  };
  std::vector<Window> windows;
  std::vector<std::byte> window_memory;

  /**
   * @brief A window for @p bytes bytes of want @p want at its local offset @p local_offset,
   *        packed after the windows handed out before it.
   * @param capacity the chunk's window bytes on this rank, known before the first window:
   *        the first one takes memory from @p spare (landed chunks' windows) and grows it to
   *        this, so no later window reallocates what an earlier one points into.
   * @return where the window's bytes land.
   * @throws Error `internal` when the windows pass @p capacity (a bug in the caller's sum).
   */
  std::byte* add_window(std::uint32_t want, std::uint64_t local_offset, std::uint64_t bytes,
                        std::uint64_t capacity, std::vector<std::vector<std::byte>>& spare);
  /// Gives the window memory back to @p spare once the windows' bytes have been used.
  void recycle_windows(std::vector<std::vector<std::byte>>& spare);

 private:
  std::uint64_t _window_used = 0;
};

/// A chunk whose copies are queued on the device, not yet seen complete (the upload stage
/// hands it to the upload completion stage).
struct Uploading {
  std::size_t chunk = 0;
  SlotLease lease;  ///< Empty for a placed chunk (its slot is held in a `HeldSlot`).
  std::vector<std::unique_ptr<Pending>> copies;
  std::chrono::steady_clock::time_point begin;
};

/// Rank 0's slot between a placed chunk's upload (its own copies) and its sends.
struct HeldSlot {
  std::size_t chunk = 0;
  SlotLease lease;
  const std::byte* source = nullptr;  ///< The chunk's first byte in the slot.
  /// Transport nccl (device memory only): the bytes rank 0 sends, uploaded from the slot —
  /// the whole chunk for a broadcast, else each delivery's in plan order, packed. Null
  /// under mpi, which sends from the slot.
  std::byte* device = nullptr;
};

/**
 * @brief Records handed from one stage to the next, which must come out in plan order.
 *
 * Every stage handles chunks in plan order, so the oldest record is always the next chunk's;
 * one that is not is a bug, reported as `internal` with @p out_of_order rather than letting
 * a chunk's bytes be taken for another's. @tparam T has a `chunk` member.
 */
template <class T>
class PlanOrder {
 public:
  /// @param out_of_order the message of the `internal` error (a string literal).
  explicit PlanOrder(const char* out_of_order) noexcept : _out_of_order(out_of_order) {}

  void push(T record) { _records.push_back(std::move(record)); }
  /// @return the oldest record, left in place (a reference stays valid while others are
  ///         pushed behind it). @throws Error `internal` unless it is chunk @p chunk's.
  T& front(std::size_t chunk) {
    if (_records.empty() || _records.front().chunk != chunk) {
      throw Error(Errc::internal, _out_of_order);
    }
    return _records.front();
  }
  /// @return the oldest record, removed. @throws Error `internal` unless it is chunk @p chunk's.
  T take(std::size_t chunk) {
    T record = std::move(front(chunk));
    _records.pop_front();
    return record;
  }
  [[nodiscard]] bool empty() const noexcept { return _records.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return _records.size(); }

 private:
  std::deque<T> _records;
  const char* _out_of_order;
};

}  // namespace weightcast::detail
