// The delivery of a load without placement: every rank's arena receives every byte, one grouped
// broadcast per chunk; `destination: discard` hashes instead
// (weightcast/pipeline/detail/broadcast_delivery.hpp).
#include "weightcast/pipeline/detail/broadcast_delivery.hpp"

#include <algorithm>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;

std::unique_ptr<Delivery> make_broadcast_delivery(LoadContext& load) {
  if (load.options.destination == Destination::discard) {
    return std::make_unique<DiscardDelivery>(load);
  }
  return std::make_unique<BroadcastDelivery>(load);
}

BroadcastDelivery::BroadcastDelivery(LoadContext& load)
    : _load(load), _landed(load.catalogue.tensors.size(), 0) {}

void BroadcastDelivery::start() {
  for (std::uint32_t t = 0; t < _load.catalogue.tensors.size(); ++t) {
    if (_load.plan.tensor_piece_counts[t] == 0) tensor_ready(t);
  }
}

ReadPolicy BroadcastDelivery::read_policy() const {
  ReadPolicy policy;
  policy.read_into_arena = _load.device.reads_into_arena();
  return policy;
}

awaitable<Uploading> BroadcastDelivery::upload(std::size_t c, SlotLease lease,
                                               const Slot& slot) {
  Uploading uploading;
  uploading.lease = std::move(lease);
  const Chunk& chunk = _load.plan.chunks[c];
  if (slot.in_arena) {
    // The read put the chunk in its place already.
  } else if (chunk.arena_contiguous) {
    uploading.copies.push_back(
        _load.device.upload(slot.source, _load.arena.data() + chunk.arena_offset, chunk.bytes));
  } else {
    // A cuda device queues every piece's copy on its one copy stream, with one event.
    _piece_copies.clear();
    for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[chunk.first_piece + p];
      _piece_copies.push_back({slot.source + piece.chunk_offset,
                               _load.arena.data() + piece.arena_offset, piece.bytes});
    }
    uploading.copies.push_back(_load.device.upload_all(_piece_copies));
  }
  co_return uploading;
}

// On rank 0 the upload stage hands a chunk over only once its own copies have completed
// (polled), so the broadcast needs no stream wait: waiting on the device's latest upload
// event would also wait for the next chunk's H2D.
InFlight BroadcastDelivery::post(std::size_t c, bool root) {
  static_cast<void>(root);
  const Chunk& chunk = _load.plan.chunks[c];
  _ranges.clear();
  if (chunk.arena_contiguous) {
    _ranges.push_back({_load.arena.data() + chunk.arena_offset, chunk.bytes});
  } else {
    // Pieces that follow each other in the arena but for the alignment padding before a
    // tensor go as one range (one ncclBroadcast, one MPI_Ibcast) instead of one each:
    // the padding belongs to no tensor, as a tensor with bytes starts at an aligned
    // offset and the gap ends at the first one.
    const std::uint64_t align = std::max<std::uint64_t>(_load.options.tensor_alignment, 1);
    for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[chunk.first_piece + p];
      std::byte* at = _load.arena.data() + piece.arena_offset;
      if (!_ranges.empty()) {
        Transport::Range& last = _ranges.back();
        const std::byte* end = last.data + last.bytes;
        if (at >= end) {
          const auto gap = static_cast<std::uint64_t>(at - end);
          if (gap == 0 || (gap < align && piece.arena_offset % align == 0)) {
            last.bytes += gap + piece.bytes;
            continue;
          }
        }
      }
      _ranges.push_back({at, piece.bytes});
    }
  }
  InFlight posted;
  posted.chunk = c;
  posted.pending = _load.transport.broadcast_group(_ranges, 0, nullptr);
  return posted;
}

// The chunk's bytes are in the arena; tensors whose last piece it carried are ready.
void BroadcastDelivery::landed(InFlight& landed) {
  const std::size_t c = landed.chunk;
  const Chunk& chunk = _load.plan.chunks[c];
  _load.progressed();
  _load.stage_event(Stage::broadcast, c, landed.begin);
  for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
    const std::uint32_t t = _load.plan.pieces[chunk.first_piece + p].tensor;
    if (++_landed[t] == _load.plan.tensor_piece_counts[t]) tensor_ready(t);
  }
  _load.report_progress(c);
}

std::byte* BroadcastDelivery::tensor_data(std::uint32_t t) const {
  if (_load.catalogue.tensors[t].bytes == 0) return nullptr;
  return _load.arena.data() + _load.layout.tensor_offsets[t];
}

void BroadcastDelivery::tensor_ready(std::uint32_t t) {
  if (!_load.options.on_tensor_ready) return;
  _load.options.on_tensor_ready(
      TensorView{&_load.catalogue.tensors[t], tensor_data(t), _load.arena.kind()});
}

DiscardDelivery::DiscardDelivery(LoadContext& load) : BroadcastDelivery(load) {}

void DiscardDelivery::start() {
  // Every tensor has a digest, a plan of no chunks (only zero-size tensors) included.
  if (_load.options.digest_discarded) _digests.emplace(_load.catalogue.tensors.size());
  BroadcastDelivery::start();
}

// A read that completed inside its submit (cached pages) is copied on this thread anyway:
// the same slot again beats cycling every slot through the caches (ReadSide::read_stage).
ReadPolicy DiscardDelivery::read_policy() const {
  ReadPolicy policy;
  policy.reuse_cached_slot = true;
  return policy;
}

// Hashes the pieces as they pass (unless verify: none); nothing is kept.
awaitable<Uploading> DiscardDelivery::upload(std::size_t c, SlotLease lease, const Slot& slot) {
  Uploading uploading;
  uploading.lease = std::move(lease);
  const Chunk& chunk = _load.plan.chunks[c];
  for (std::uint32_t p = 0; _digests && p < chunk.piece_count; ++p) {
    const Piece& piece = _load.plan.pieces[chunk.first_piece + p];
    _digests->update(piece.tensor, slot.source + piece.chunk_offset, piece.bytes);
    if (piece.tensor_offset + piece.bytes == _load.catalogue.tensors[piece.tensor].bytes) {
      _digests->finish(piece.tensor);
    }
  }
  co_return uploading;
}

// Nothing travels: discard is a load of one rank (check_destination).
InFlight DiscardDelivery::post(std::size_t c, bool root) {
  static_cast<void>(root);
  InFlight posted;
  posted.chunk = c;
  return posted;
}

void DiscardDelivery::report(LoadResult& result) const {
  if (_digests) result.digests = _digests->digests();
}

std::byte* DiscardDelivery::tensor_data(std::uint32_t t) const {
  static_cast<void>(t);
  return nullptr;
}

}  // namespace weightcast::detail
