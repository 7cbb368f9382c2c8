// The delivery of `transport: shm`: the node's ranks copy each chunk out of the shared staging
// ring themselves (weightcast/pipeline/detail/node_ring_delivery.hpp).
#include "weightcast/pipeline/detail/node_ring_delivery.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <cstring>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;

namespace {

// The chunk's pieces, as copies out of its slot into their places in the arena.
std::vector<RingCopy> arena_copies(const LoadContext& load, std::size_t c) {
  const Chunk& chunk = load.plan.chunks[c];
  if (chunk.arena_contiguous) return {{0, load.arena.data() + chunk.arena_offset, chunk.bytes}};
  std::vector<RingCopy> copies;
  for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
    const Piece& piece = load.plan.pieces[chunk.first_piece + p];
    copies.push_back({piece.chunk_offset, load.arena.data() + piece.arena_offset, piece.bytes});
  }
  return copies;
}

void copy_out(const std::vector<RingCopy>& copies, const std::byte* source) {
  for (const RingCopy& copy : copies) {
    std::memcpy(copy.to, source + copy.chunk_offset, copy.bytes);
  }
}

// Rank 0: complete once every consumer has released the slot. A poll, not a wait: rank 0's
// thread also reads and copies (the landing stage polls it up to every millisecond).
class Released final : public Pending {
 public:
  Released(const NodeRing& ring, std::size_t slot) : _ring(ring), _slot(slot) {}
  bool test() override { return _ring.readers(_slot) == 0; }

 private:
  const NodeRing& _ring;
  std::size_t _slot;
};

// Another rank: waits for the slot holding chunk `c`, then copies out of it and releases the
// slot. Each test sleeps at most `step` on the ring's futex, so the landing stage's loop (and
// with it the watchdog and a stop request: the control plane stops the load when a rank is
// lost or aborts) runs at least that often; the thread has nothing else to do meanwhile.
class Received final : public Pending {
 public:
  Received(const LoadContext& load, NodeRing& ring, std::size_t c, std::vector<RingCopy> copies)
      : _load(load), _ring(ring), _chunk(c), _copies(std::move(copies)) {}
  bool test() override {
    if (_load.options.stop.stop_requested()) return false;  // the watchdog ends the load
    const auto found = _ring.find(_chunk, step);
    if (!found) return false;
    const Chunk& chunk = _load.plan.chunks[_chunk];
    if (found->bytes != chunk.bytes) {
      _ring.release(found->slot);
      throw Error(Errc::internal,
                  fmt::format("node ring: chunk {} has {} bytes in slot {}, the plan says {}",
                              _chunk, found->bytes, found->slot, chunk.bytes));
    }
    copy_out(_copies, found->data);
    _ring.release(found->slot);
    return true;
  }

 private:
  static constexpr std::chrono::milliseconds step{100};
  const LoadContext& _load;
  NodeRing& _ring;
  std::size_t _chunk;
  std::vector<RingCopy> _copies;
};

NodeRing& ring_of(LoadContext& load) {
  NodeRing* ring = load.transport.node_ring();
  WEIGHTCAST_EXPECT(ring != nullptr, Errc::internal,
                    "the node ring delivery needs transport shm's ring");
  return *ring;
}

}  // namespace

std::unique_ptr<Pending> node_ring_receive(const LoadContext& load, NodeRing& ring,
                                           std::size_t c, std::vector<RingCopy> copies) {
  return std::make_unique<Received>(load, ring, c, std::move(copies));
}

std::unique_ptr<Pending> node_ring_released(const NodeRing& ring, std::size_t slot) {
  return std::make_unique<Released>(ring, slot);
}

NodeRingDelivery::NodeRingDelivery(LoadContext& load)
    : BroadcastDelivery(load), _ring(ring_of(load)) {}

// Publishes first, so the other ranks copy while rank 0 copies its own; the slot stays leased
// until every one of them has released it (`post`).
awaitable<Uploading> NodeRingDelivery::upload(std::size_t c, SlotLease lease, const Slot& slot) {
  const Chunk& chunk = _load.plan.chunks[c];
  const std::byte* base = _ring.slot_data(lease.index());
  _ring.publish(lease.index(), c, static_cast<std::uint64_t>(slot.source - base), chunk.bytes);
  copy_out(arena_copies(_load, c), slot.source);
  _held.push_back(std::move(lease));
  co_return Uploading{};
}

InFlight NodeRingDelivery::post(std::size_t c, bool root) {
  InFlight posted;
  posted.chunk = c;
  if (root) {
    WEIGHTCAST_EXPECT(!_held.empty(), Errc::internal, "node ring: a chunk posted before its upload");
    posted.lease = std::move(_held.front());
    _held.pop_front();
    posted.pending = node_ring_released(_ring, posted.lease.index());
  } else {
    posted.pending = node_ring_receive(_load, _ring, c, arena_copies(_load, c));
  }
  return posted;
}

std::unique_ptr<Delivery> make_node_ring_delivery(LoadContext& load) {
  return std::make_unique<NodeRingDelivery>(load);
}

}  // namespace weightcast::detail
