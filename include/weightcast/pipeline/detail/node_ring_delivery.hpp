/**
 * @file node_ring_delivery.hpp
 * @brief The delivery of `transport: shm`: every rank of the node copies each chunk out of the
 *        staging ring they share (transport/detail/node_ring.hpp), in parallel; no byte goes
 *        through a transport (docs/DESIGN.md § Pipeline).
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE (delivery.hpp). Replicated
 * loads only: every rank gets every byte into its arena, as `BroadcastDelivery`, whose landing
 * (progress, hooks) it shares. Rank 0's `upload` publishes the slot to the other ranks, copies
 * its own arena's bytes and keeps the slot; its `post` returns the wait for every consumer's
 * release, so the slot goes back to the ring (and a new read) only once nobody reads it. On
 * another rank `post` is the wait for the slot holding the chunk, and its completion is the
 * copy into the arena and the release.
 */
#pragma once

#include "weightcast/pipeline/detail/broadcast_delivery.hpp"
#include "weightcast/transport/detail/node_ring.hpp"

#include <deque>

namespace weightcast::detail {

class NodeRingDelivery final : public BroadcastDelivery {
 public:
  /// @p load's transport must have a node ring (`Transport::node_ring`).
  explicit NodeRingDelivery(LoadContext& load);
  /// Every chunk is staged in the shared ring: never read into rank 0's arena or sent from a
  /// mapping, since the other ranks copy out of the slot.
  [[nodiscard]] ReadPolicy read_policy() const override { return {}; }
  boost::asio::awaitable<Uploading> upload(std::size_t c, SlotLease lease,
                                           const Slot& slot) override;
  InFlight post(std::size_t c, bool root) override;

 private:
  NodeRing& _ring;
  std::deque<SlotLease> _held;  // rank 0: published slots not yet posted, plan order
};

}  // namespace weightcast::detail
