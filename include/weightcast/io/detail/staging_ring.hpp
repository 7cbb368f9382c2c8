/**
 * @file staging_ring.hpp
 * @brief The staging ring: `buffer_depth` host slots handed out as RAII leases.
 *
 * Internal (includes Boost.Asio). A lease is awaited from the ring's list of free slots;
 * when every slot is leased, the read stage waits — the ring is the backpressure that bounds
 * rank 0's host memory to `slots × slot_bytes` (docs/DESIGN.md § Staging). Slots are page-aligned
 * (O_DIRECT needs aligned buffers).
 *
 * The free list is plain bookkeeping, not an Asio channel: a slot must go back whatever
 * state the waiters are in. (Boost 1.81's channel leaves its send side blocked once a
 * waiting receive is cancelled, so a slot given back after a cancelled acquire() — any
 * stage failing while slots are leased — could not be returned.)
 */
#pragma once

#include "weightcast/device/detail/host_mapping.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weightcast {
class Device;
}  // namespace weightcast

namespace weightcast::detail {

class StagingRing;

/// Exclusive use of one slot; returns it to the ring when destroyed.
class SlotLease {
 public:
  SlotLease() = default;
  SlotLease(StagingRing* ring, std::size_t index) noexcept : _ring(ring), _index(index) {}
  SlotLease(SlotLease&& other) noexcept : _ring(other._ring), _index(other._index) {
    other._ring = nullptr;
  }
  SlotLease& operator=(SlotLease&& other) noexcept;
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease();

  /// @return the slot's index in the ring, 0 ≤ index < `StagingRing::slots()`.
  [[nodiscard]] std::size_t index() const noexcept { return _index; }
  /// @return whether this lease holds a slot (not default-constructed, moved from or released).
  [[nodiscard]] bool holds() const noexcept { return _ring != nullptr; }
  /// @return the slot's first byte (page-aligned). Only for a lease that holds a slot (not
  ///         a default-constructed, moved-from or released one).
  [[nodiscard]] std::byte* data() const noexcept;
  /// Gives up ownership without returning the slot. @return the slot index.
  std::size_t release() noexcept {
    _ring = nullptr;
    return _index;
  }

 private:
  StagingRing* _ring = nullptr;
  std::size_t _index = 0;
};

class StagingRing {
 public:
  /**
   * @param slots number of slots (`buffer_depth`, ≥ 1; 0 is taken as 1).
   * @param slot_bytes bytes per slot, rounded up to the page size (0: one page).
   * @param device when not null and it `wants_pinned_staging()` (cuda), the slots are pinned
   *        with `device->pin`. If pinning is refused (`ulimit -l`, the driver), the ring
   *        retries with half the slots down to one, then stages from pageable memory; each
   *        step logs a notice about pinned host memory. `slots()` says how many remain.
   *        The device must outlive the ring.
   * @throws Error `unavailable` (69) when the memory cannot be mapped (names the slots and
   *         their size), or the ring (`slots` × `slot_bytes` rounded up to the page size)
   *         passes 2^64 bytes (ENOMEM, names both as given). A refused `pin` is never thrown:
   *         it is the fallback above.
   */
  StagingRing(const boost::asio::any_io_executor& executor, std::size_t slots,
              std::uint64_t slot_bytes, weightcast::Device* device = nullptr);
  /**
   * @brief A ring over memory someone else owns and maps: the node ring's slots (`transport:
   *        shm`, transport/detail/node_ring.hpp), which every rank of the node reads.
   * @param slots number of slots (≥ 1) at @p memory, each @p slot_bytes (a multiple of the
   *        page size) after the previous; the memory must outlive the ring. Never pinned.
   */
  StagingRing(const boost::asio::any_io_executor& executor, std::size_t slots,
              std::uint64_t slot_bytes, std::byte* memory);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  /**
   * @brief Waits for a free slot: the one given back last (its pages are the likeliest to
   *        be in the CPU's caches and TLB).
   * @throws boost::system::system_error `operation_aborted` when the awaiting coroutine is
   *         cancelled while it waits.
   */
  boost::asio::awaitable<SlotLease> acquire();

  /**
   * @brief Waits until no slot is leased. One coroutine at a time may wait on the ring
   *        (`acquire` or this).
   * @throws boost::system::system_error `operation_aborted` when the awaiting coroutine is
   *         cancelled while it waits.
   */
  boost::asio::awaitable<void> all_given_back();

  /// @return the first byte of slot @p index (< `slots()`; not checked).
  [[nodiscard]] std::byte* slot_data(std::size_t index) const noexcept {
    return _base + index * _slot_bytes;
  }
  /// @return bytes per slot: the asked size rounded up to the page size.
  [[nodiscard]] std::uint64_t slot_bytes() const noexcept { return _slot_bytes; }
  /// @return the number of slots (fewer than asked when pinning all of them was refused).
  [[nodiscard]] std::size_t slots() const noexcept { return _slots; }
  /// @return host memory held by the ring, bytes.
  [[nodiscard]] std::uint64_t total_bytes() const noexcept { return _slots * _slot_bytes; }
  /// @return true when the slots are pinned (page-locked) for the device.
  [[nodiscard]] bool pinned() const noexcept { return _pinned_by != nullptr; }

 private:
  friend class SlotLease;
  void give_back(std::size_t index) noexcept;
  void pin_slots(weightcast::Device& device);

  std::size_t _slots;
  std::uint64_t _slot_bytes;
  HostMapping _memory;  // 2 MiB aligned; empty over memory someone else owns
  std::byte* _base = nullptr;  // slot 0: `_memory`'s, or the owner's
  weightcast::Device* _pinned_by = nullptr;  // unpins in the destructor
  std::vector<std::size_t> _free;            // free slot indices, the last given back last
  std::vector<bool> _leased;                 // per slot: a lease holds it
  boost::asio::steady_timer _slot_freed;     // the waits sleep on it; give_back() wakes it
  boost::asio::awaitable<void> wait_for_give_back();
};

}  // namespace weightcast::detail
