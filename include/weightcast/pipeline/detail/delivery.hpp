/**
 * @file delivery.hpp
 * @brief How a load's chunks reach each rank once read: the part of the pipeline that
 *        differs between a broadcast load (every rank gets every byte, or rank 0 hashes and
 *        discards them) and a placed load (each rank gets its wants, as in
 *        docs/DESIGN.md § Placement).
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE: called by the stages on
 * the load's executor, one handler at a time (docs/DESIGN.md § Pipeline). The stages call a
 * delivery in plan order, chunk by chunk: on rank 0 `upload` then `post` then `landed`; on
 * the other ranks `post` then `landed`. A new way of delivering (a node-shared staging ring)
 * is a new implementation, not a branch in the stages.
 *
 * Not to be confused with `weightcast::Delivery` (plan.hpp), the part of a placed chunk one
 * rank receives.
 */
#pragma once

#include "weightcast/pipeline/detail/in_flight.hpp"
#include "weightcast/pipeline/detail/load_context.hpp"
#include "weightcast/pipeline/detail/read_side.hpp"

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <memory>
#include <vector>

namespace weightcast::detail {

class Delivery {
 public:
  virtual ~Delivery() = default;

  /// Before the first chunk: the delivery's own set-up, then the hooks of the tensors (or
  /// wants) that have no bytes to wait for.
  virtual void start() = 0;
  /// Rank 0: how its chunks should be read.
  [[nodiscard]] virtual ReadPolicy read_policy() const = 0;
  /// Rank 0, once the staging ring exists and before the first read.
  virtual void staging_ready(const StagingRing& ring) { static_cast<void>(ring); }

  /**
   * @brief Rank 0: chunk @p c has been read into @p slot (held by @p lease); put it where
   *        this rank keeps it.
   * @return the copies queued on the device, not yet complete, and the lease the slot must
   *         stay held by until they are (empty when the delivery keeps the slot itself).
   */
  virtual boost::asio::awaitable<Uploading> upload(std::size_t c, SlotLease lease,
                                                   const Slot& slot) = 0;
  /// Every rank: posts chunk @p c's broadcast or exchange (@p root: this is rank 0, whose
  /// chunk was uploaded). @return what stays alive until it completes.
  virtual InFlight post(std::size_t c, bool root) = 0;
  /// Every rank: @p landed (chunk `landed.chunk`) has completed here: count it, and tell the
  /// hooks which tensors are ready.
  virtual void landed(InFlight& landed) = 0;

  /// After the load, failed or not: what the result reports of it (digests).
  virtual void report(LoadResult& result) const = 0;
  /// Waits for work the delivery runs off the loader's thread; call after the stages.
  /// @throws what that work threw.
  virtual void finish_hashing() {}
  /// Hands over device memory the transport's sends read, so the caller can keep it past
  /// the pipeline when the transport may still touch it (`Transport::may_still_touch_memory`).
  [[nodiscard]] virtual std::shared_ptr<Arena> take_device_sends() noexcept { return nullptr; }
};

/// Every rank receives every byte into its arena; with `destination: discard` rank 0 hashes
/// the chunks instead and keeps nothing (broadcast_delivery.cpp).
std::unique_ptr<Delivery> make_broadcast_delivery(LoadContext& load);
/// Every rank of one node copies every chunk out of the staging ring they share
/// (`transport: shm`; node_ring_delivery.cpp).
std::unique_ptr<Delivery> make_node_ring_delivery(LoadContext& load);
/// Each rank receives its wants (`LoadOptions::placement`) at @p want_data, one per want
/// (placed_delivery.cpp).
std::unique_ptr<Delivery> make_placed_delivery(LoadContext& load,
                                               std::vector<std::byte*> want_data);

}  // namespace weightcast::detail
