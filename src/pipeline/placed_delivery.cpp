// A placed load's delivery: each rank receives exactly its wants (rank 0's copies, sends and
// expected digests; every rank's receives, casts and digests of what landed).
#include "weightcast/pipeline/detail/placed_delivery.hpp"

#include "weightcast/pipeline/detail/node_ring_delivery.hpp"

#include "weightcast/core/error.hpp"

#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;

std::unique_ptr<Delivery> make_placed_delivery(LoadContext& load,
                                               std::vector<std::byte*> want_data) {
  return std::make_unique<PlacedDelivery>(load, std::move(want_data));
}

PlacedDelivery::PlacedDelivery(LoadContext& load, std::vector<std::byte*> want_data)
    : _load(load),
      _placement(*load.options.placement),
      _me(load.transport.rank()),
      _node_ring(load.transport.node_ring()),
      _want_data(std::move(want_data)) {}

void PlacedDelivery::report(LoadResult& result) const {
  result.expected_digests = expected_digests();
  result.received_digests = received_digests();
  result.received_hashed = received_hashed();
  if (_self_expected) result.self_expected_digests = _self_expected->digests();
}

std::vector<std::vector<std::uint64_t>> PlacedDelivery::expected_digests() const {
  std::vector<std::vector<std::uint64_t>> out;
  if (!_expected) return out;
  const auto& digests = _expected->digests();
  // Spread, rank 0 hashed only its own wants: the others' rows are theirs to give.
  const std::size_t rows = _spread ? 1 : _placement.all.size();
  for (std::size_t r = 0; r < rows; ++r) {
    out.emplace_back();
    for (std::size_t w = 0; w < _placement.all[r].tensors.size(); ++w) {
      out.back().push_back(digests[expected_index(r, w)]);
    }
  }
  return out;
}

std::vector<std::uint8_t> PlacedDelivery::received_hashed() const {
  if (_me == 0 && _expected) return std::vector<std::uint8_t>(_want_data.size(), 1);
  return _hash_received;
}

std::vector<std::uint64_t> PlacedDelivery::received_digests() const {
  std::vector<std::uint64_t> out(_want_data.size(), 0);
  if (_me == 0 && _expected) {
    const auto& expected = _expected->digests();
    for (std::size_t w = 0; w < out.size(); ++w) out[w] = expected[expected_index(0, w)];
    return out;
  }
  if (!_received) return out;
  for (std::size_t w = 0; w < out.size(); ++w) {
    if (_hash_received[w]) out[w] = _received->digests()[w];
  }
  return out;
}

void PlacedDelivery::finish_hashing() {
  if (!_hashing) return;
  _hashing->join();
  _hashing.reset();
  if (_hashing_failure) std::rethrow_exception(_hashing_failure);
}

// Who wants what, which wants are cast, and which are hashed where (`verify: digest`);
// then the wants that have no bytes are ready at once.
void PlacedDelivery::start() {
  if (_node_ring != nullptr && _load.device.wants_pinned_staging()) {
    _pin.emplace(_load.device, *_node_ring);
  }
  const LoadPlacement& placement = _placement;
  std::unordered_map<std::string_view, std::uint32_t> index;
  for (std::uint32_t t = 0; t < _load.catalogue.tensors.size(); ++t) {
    index.emplace(_load.catalogue.tensors[t].name, t);
  }
  const std::size_t ranks = placement.all.size();
  _want_tensor.assign(ranks, {});
  _runs.assign(ranks, {});
  _whole.assign(ranks, {});
  for (std::size_t r = 0; r < ranks; ++r) {
    const bool keep = _me == 0 || static_cast<int>(r) == _me;
    for (const TensorWant& want : placement.all[r].tensors) {
      const std::uint32_t t = index.at(want.tensor);
      _want_tensor[r].push_back(t);
      _whole[r].push_back(wants_whole(_load.catalogue.tensors[t], want) ? 1 : 0);
      if (keep) _runs[r].emplace_back(_load.catalogue.tensors[t], want);
    }
  }
  const RankWants& mine = placement.mine;
  _want_of_tensor.assign(_load.catalogue.tensors.size(), -1);
  _want_left.assign(mine.tensors.size(), 0);
  _cast_to.assign(mine.tensors.size(), std::nullopt);
  _cast.assign(mine.tensors.size(), CastState{});
  _hash_received.assign(mine.tensors.size(), 0);
  _hash_landed.assign(mine.tensors.size(), 0);
  bool any_received = false;
  bool any_read_back = false;
  for (std::uint32_t w = 0; w < mine.tensors.size(); ++w) {
    const TensorWant& want = mine.tensors[w];
    const std::uint32_t t = _want_tensor[_me][w];
    const TensorInfo& info = _load.catalogue.tensors[t];
    _want_of_tensor[t] = static_cast<std::int32_t>(w);
    _want_left[w] = local_bytes(info, want);
    if (want.destination.dtype && *want.destination.dtype != info.dtype) {
      _cast_to[w] = want.destination.dtype;
    }
    // What cannot be hashed afterwards in the checkpoint's dtype is hashed as it lands.
    const bool device_in_place =
        want.destination.data != nullptr && want.destination.memory != MemoryKind::host;
    // With `verify: digest`, host memory is hashed where it landed too, right after each
    // chunk, while the bytes are still in cache, instead of in a pass over every local
    // shard once the load is done (local_digests).
    const bool host = want.destination.data != nullptr ? !device_in_place
                                                       : _load.arena.kind() == MemoryKind::host;
    // Rank 0 hashes every rank's expected bytes in its staging ring, its own included, and
    // copies its own from there within its own process: a second hash of that copy would
    // check only memcpy (or the device upload). Its local shards' digests are the expected
    // ones (received_digests), so each byte is hashed once on rank 0.
    if (_me == 0 && placement.expect_digests) continue;
    _hash_landed[w] = placement.expect_digests && host && !_cast_to[w] ? 1 : 0;
    // An in-place device want is hashed (read back through the device as it lands) only
    // for the verdict: with `verify: none` nothing compares its digest. The read-back is a
    // synchronous D2H copy and a hash of every byte: it runs on a thread of its own
    // (`_hashing`), off the loader's.
    const bool read_back = device_in_place && placement.expect_digests && !_cast_to[w];
    if (_cast_to[w] || read_back || _hash_landed[w]) {
      _hash_received[w] = 1;
      any_received = true;
    }
    if (read_back) any_read_back = true;
  }
  if (any_received) _received.emplace(mine.tensors.size());
  if (any_read_back) _hashing.emplace(1);
  _spread = placement.expect_digests && _load.local_reads && ranks > 1;
  if (_spread && _me != 0) {
    _self_expected.emplace(mine.tensors.size());
    _self_expected_left = _want_left;
  }
  if (_me == 0 && placement.expect_digests) {
    // Index space: a digest per tensor (the whole tensor, shared by every whole want), then
    // one per (rank, want) for the slices.
    _tensor_whole_wanted.assign(_load.catalogue.tensors.size(), 0);
    _expected_base.assign(ranks + 1, _load.catalogue.tensors.size());
    for (std::size_t r = 0; r < ranks; ++r) {
      _expected_base[r + 1] = _expected_base[r] + placement.all[r].tensors.size();
      if (_spread && r != 0) continue;  // they hash their own
      for (std::size_t w = 0; w < _want_tensor[r].size(); ++w) {
        if (_whole[r][w]) _tensor_whole_wanted[_want_tensor[r][w]] = 1;
      }
    }
    _expected.emplace(_expected_base.back());
    _expected_left.assign(_expected_base.back(), 0);
    for (std::uint32_t t = 0; t < _load.catalogue.tensors.size(); ++t) {
      _expected_left[t] = _load.catalogue.tensors[t].bytes;
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t w = 0; w < _want_tensor[r].size(); ++w) {
        if (!_whole[r][w]) _expected_left[_expected_base[r] + w] = _runs[r][w].bytes();
      }
    }
  }
  for (std::uint32_t w = 0; w < _want_left.size(); ++w) {
    if (_want_left[w] == 0) want_ready(w);
  }
}

// A shard in the page cache is sent from it where the receivers copy out of rank 0's memory
// themselves (Open MPI's single-copy path within one node) and rank 0's memory is the host's.
// Across nodes a network transport may need to register the memory it sends for writing,
// which a read-only mapping refuses; `direct_io: on` asks to bypass the page cache.
ReadPolicy PlacedDelivery::read_policy() const {
  ReadPolicy policy;
  policy.send_from_page_cache = _load.transport.world_size() > 1 &&
                                _load.transport.receivers_read_sender_memory() &&
                                _load.device.name() == "host" &&
                                _load.options.direct_io != DirectIo::on;
  // Local reads over the node ring: rank 0 copies its own boxes and hashes what every rank
  // should get straight out of the page cache's pages; nobody reads its slots.
  policy.send_from_page_cache = policy.send_from_page_cache || _load.local_reads;
  return policy;
}

// A transport of device memory (nccl) sends from one device region per slot, taken once,
// before the first read (upload_sends). Over the node ring nothing is sent: every rank copies
// its own bytes out of the shared slot.
void PlacedDelivery::staging_ready(const StagingRing& ring) {
  if (_load.device.name() == "host" || _load.transport.world_size() <= 1 ||
      _node_ring != nullptr) {
    return;
  }
  for (std::size_t c = 0; c < _load.plan.chunks.size(); ++c) {
    _device_send_slot_bytes = std::max(_device_send_slot_bytes, send_bytes(c));
  }
  if (_device_send_slot_bytes > 0) {
    _device_sends = _load.device.allocate_arena(_device_send_slot_bytes * ring.slots());
  }
}

void PlacedDelivery::expect(std::size_t index, const std::byte* data, std::uint64_t bytes) {
  _expected->update(static_cast<std::uint32_t>(index), data, bytes);
  if ((_expected_left[index] -= bytes) == 0) _expected->finish(static_cast<std::uint32_t>(index));
}

// Delivery `d`'s bytes in local order: straight from the chunk when they are one run, else
// gathered into `buffer` (a strided slice: one message, never one per row).
const std::byte* PlacedDelivery::gather(const weightcast::Delivery& d, const std::byte* source,
                                  std::vector<std::byte>& buffer) const {
  const Piece& piece = _load.plan.pieces[d.piece];
  const detail::ShardRuns& runs = _runs[d.rank][d.want];
  if (d.runs == 1) {
    const std::byte* at = nullptr;
    runs.for_each_stretch(d.local_offset, d.local_offset + 1,
                          [&](std::uint64_t tb, std::uint64_t, std::uint64_t) {
                            at = source + chunk_offset(piece, tb);
                          });
    return at;
  }
  buffer.resize(d.bytes);
  runs.for_each_stretch(d.local_offset, d.local_offset + d.bytes,
                        [&](std::uint64_t tb, std::uint64_t lb, std::uint64_t n) {
                          std::memcpy(buffer.data() + (lb - d.local_offset),
                                      source + chunk_offset(piece, tb), n);
                        });
  return buffer.data();
}

// Casts received bytes [local_offset, + bytes) of want `w` (checkpoint dtype) into its
// destination. Bytes arrive in local order; an element cut by a chunk boundary waits in a
// carry of under 8 bytes for the rest.
void PlacedDelivery::cast_into(std::uint32_t w, const std::byte* data, std::uint64_t local_offset,
                         std::uint64_t bytes) {
  CastState& state = _cast[w];
  if (local_offset != state.next) {
    throw Error(Errc::internal, fmt::format("cast of tensor '{}': bytes at {} arrived, {} "
                                            "expected",
                                            _placement.mine.tensors[w].tensor, local_offset,
                                            state.next));
  }
  state.next += bytes;
  const Dtype from = _load.catalogue.tensors[_want_tensor[_me][w]].dtype;
  const Dtype to = *_cast_to[w];
  const std::uint64_t in = dtype_bits(from) / 8;
  const std::uint64_t out = dtype_bits(to) / 8;
  std::byte* target = _want_data[w];
  std::uint64_t element = (local_offset - state.carried) / in;
  if (state.carried != 0) {
    const std::uint64_t take = std::min(in - state.carried, bytes);
    std::memcpy(state.carry + state.carried, data, take);
    state.carried += take;
    data += take;
    bytes -= take;
    if (state.carried < in) return;
    cast_elements(from, to, state.carry, target + element * out, 1);
    ++element;
    state.carried = 0;
  }
  const std::uint64_t elements = bytes / in;
  cast_elements(from, to, data, target + element * out, elements);
  state.carried = bytes - elements * in;
  std::memcpy(state.carry, data + elements * in, state.carried);
}

// Rank 0: bytes [local_offset, + bytes) of its own want `w`, from the chunk. @return the
// copy in flight (null when done: a cast, a host device); @p data must stay until it is.
std::unique_ptr<Pending> PlacedDelivery::copy_to_mine(std::uint32_t w, const std::byte* data,
                                                std::uint64_t local_offset, std::uint64_t bytes) {
  // Only without expected digests (verify: none): a cast or device want's report digest,
  // of the source bytes. With them, rank 0's own digests are its expected ones.
  if (_hash_received[w]) _received->update(w, data, bytes);
  if (_cast_to[w]) {
    cast_into(w, data, local_offset, bytes);
    return nullptr;
  }
  return _load.device.upload(data, _want_data[w] + local_offset, bytes);
}

// Rank 0: its own wants' bytes to their destinations, every rank's expected digests; the
// slot stays held for the sends (and, under nccl, what they send goes up to the device).
// Copies from the slot are queued and handed to the upload completion stage, which waits
// for them while the next chunk's are queued behind them (as a broadcast load's are): the
// slot stays held in `_held` until the chunk's sends complete, which come after. One from
// the gather scratch is waited for at once, as the next gather reuses (and may reallocate)
// it.
awaitable<Uploading> PlacedDelivery::upload(std::size_t c, SlotLease lease, const Slot& slot) {
  const std::byte* source = slot.source;
  const Chunk& chunk = _load.plan.chunks[c];
  // Over the node ring the other ranks copy their own boxes out of the slot while rank 0
  // copies its own and hashes what it expects; the slot stays held until they are done.
  // With local reads they read theirs from the files themselves.
  const bool published = _node_ring != nullptr && !_load.local_reads;
  if (published) {
    const std::byte* base = _node_ring->slot_data(lease.index());
    _node_ring->publish(lease.index(), c, static_cast<std::uint64_t>(source - base),
                        chunk.bytes);
  }
  try {
    co_return co_await upload_published(c, lease, source);
  } catch (...) {
    // A published slot stays held (the other ranks may still be copying out of it) until
    // the delivery goes, after the pipeline has failed: never read into again meanwhile.
    if (published && lease.holds()) _held.push(HeldSlot{c, std::move(lease), source});
    throw;
  }
}

awaitable<Uploading> PlacedDelivery::upload_published(std::size_t c, SlotLease& lease,
                                                      const std::byte* source) {
  const Chunk& chunk = _load.plan.chunks[c];
  std::vector<std::unique_ptr<Pending>> copies;
  for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
    const Piece& piece = _load.plan.pieces[p];
    if (_expected && _tensor_whole_wanted[piece.tensor]) {
      expect(piece.tensor, source + piece.chunk_offset, piece.bytes);
    }
    if (!_load.plan.chunk_broadcast[c]) continue;
    const std::int32_t w = _want_of_tensor[piece.tensor];
    copies.push_back(copy_to_mine(static_cast<std::uint32_t>(w), source + piece.chunk_offset,
                                  piece.tensor_offset, piece.bytes));
  }
  if (!_load.plan.chunk_broadcast[c]) {
    for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1];
         ++i) {
      const weightcast::Delivery& d = _load.plan.deliveries[i];
      if (_expected && !_whole[d.rank][d.want] && (!_spread || d.rank == 0)) {
        const Piece& piece = _load.plan.pieces[d.piece];
        _runs[d.rank][d.want].for_each_stretch(
            d.local_offset, d.local_offset + d.bytes,
            [&](std::uint64_t tb, std::uint64_t, std::uint64_t n) {
              expect(expected_index(d.rank, d.want), source + chunk_offset(piece, tb), n);
            });
      }
      if (d.rank != 0) continue;
      const std::byte* data = gather(d, source, _scratch);
      auto copy = copy_to_mine(d.want, data, d.local_offset, d.bytes);
      if (d.runs == 1) {
        copies.push_back(std::move(copy));
      } else {
        co_await _load.wait(std::move(copy), LoadContext::upload_poll_cap);
      }
    }
  }
  HeldSlot held{c, std::move(lease), source};
  if (_device_sends) co_await upload_sends(c, held, copies);
  _held.push(std::move(held));
  Uploading uploading;
  uploading.copies = std::move(copies);
  co_return uploading;
}

// The bytes chunk `c` sends per rank, and under nccl the most of any chunk: what each slot's
// device region holds.
std::uint64_t PlacedDelivery::send_bytes(std::size_t c) const {
  if (_load.plan.chunk_broadcast[c]) return _load.plan.chunks[c].bytes;
  std::uint64_t total = 0;
  for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1]; ++i) {
    if (_load.plan.deliveries[i].rank != 0) total += _load.plan.deliveries[i].bytes;
  }
  return total;
}

// Rank 0 under nccl, which sends device memory only: what chunk `c` sends goes up from the
// slot into the slot's device region (`_device_sends`) — the whole chunk for a broadcast,
// else each delivery's bytes (gathered on the host when strided) packed in plan order. The
// copies (those from the slot added to @p copies, waited for by the upload completion
// stage) complete before the chunk is posted, so the sends need no stream wait.
awaitable<void> PlacedDelivery::upload_sends(std::size_t c, HeldSlot& held,
                                             std::vector<std::unique_ptr<Pending>>& copies) {
  if (_load.transport.world_size() == 1) co_return;
  held.device = _device_sends->data() + held.lease.index() * _device_send_slot_bytes;
  if (_load.plan.chunk_broadcast[c]) {
    copies.push_back(_load.device.upload(held.source, held.device, _load.plan.chunks[c].bytes));
    co_return;
  }
  std::uint64_t at = 0;
  for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1]; ++i) {
    const weightcast::Delivery& d = _load.plan.deliveries[i];
    if (d.rank == 0) continue;
    const std::byte* data = gather(d, held.source, _scratch);
    auto copy = _load.device.upload(data, held.device + at, d.bytes);
    if (d.runs == 1) {
      copies.push_back(std::move(copy));
    } else {
      co_await _load.wait(std::move(copy), LoadContext::upload_poll_cap);  // the scratch is reused next
    }
    at += d.bytes;
  }
}

// A rank other than 0 over the node ring: its boxes of chunk `c`, as copies out of the slot
// into their destinations (or cast windows, from @p destination), in the order an exchange
// would land them; a strided slice is copied row by row straight to its place.
template <class Destination>
std::vector<RingCopy> PlacedDelivery::ring_copies(std::size_t c, Destination&& destination,
                                                  std::vector<std::uint32_t>* wants) {
  std::vector<RingCopy> copies;
  const Chunk& chunk = _load.plan.chunks[c];
  if (_load.plan.chunk_broadcast[c]) {
    for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[p];
      const auto w = static_cast<std::uint32_t>(_want_of_tensor[piece.tensor]);
      copies.push_back({piece.chunk_offset, destination(w, piece.tensor_offset, piece.bytes),
                        piece.bytes, lands_on_device(w)});
      if (wants != nullptr) wants->push_back(w);
    }
    return copies;
  }
  for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1]; ++i) {
    const weightcast::Delivery& d = _load.plan.deliveries[i];
    if (d.rank != _me) continue;
    std::byte* to = destination(d.want, d.local_offset, d.bytes);
    const bool to_device = lands_on_device(d.want);
    const Piece& piece = _load.plan.pieces[d.piece];
    _runs[d.rank][d.want].for_each_stretch(
        d.local_offset, d.local_offset + d.bytes,
        [&](std::uint64_t tb, std::uint64_t lb, std::uint64_t n) {
          copies.push_back({chunk_offset(piece, tb), to + (lb - d.local_offset), n, to_device});
          if (wants != nullptr) wants->push_back(d.want);
        });
  }
  return copies;
}

// Every rank posts a placed chunk: a broadcast when every rank wants it whole, else rank
// 0's sends (each rank's slice of the chunk as one message) and this rank's receives.
InFlight PlacedDelivery::post(std::size_t c, bool root) {
  InFlight posted;
  posted.chunk = c;
  const Chunk& chunk = _load.plan.chunks[c];
  const std::byte* source = nullptr;
  std::byte* device = nullptr;  // nccl: what rank 0 sends, on the device (upload_sends)
  if (root) {
    HeldSlot held = _held.take(c);
    posted.lease = std::move(held.lease);
    source = held.source;
    device = held.device;
  }
  // A cast want lands in a window first; the cast follows once the chunk has landed.
  // Sized to this rank's cast bytes of the chunk, known before any window is handed out.
  const std::uint64_t window_bytes = root ? 0 : cast_bytes(c);
  auto destination = [&](std::uint32_t w, std::uint64_t local_offset, std::uint64_t bytes) {
    if (!_cast_to[w]) return _want_data[w] + local_offset;
    return posted.add_window(w, local_offset, bytes, window_bytes, _spare_windows);
  };
  if (_node_ring != nullptr) {
    if (root) {
      // With local reads nobody else reads rank 0's slot (nothing was published).
      if (!_load.local_reads) {
        posted.pending = node_ring_released(*_node_ring, posted.lease.index());
      }
    } else if (_load.local_reads && _self_expected) {
      // The file's bytes of each copy stream into its want's expected digest as they are
      // read, in local order (the copies are in each want's local order).
      std::vector<std::uint32_t> wants;
      std::vector<RingCopy> copies = ring_copies(c, destination, &wants);
      std::vector<std::uint64_t> sizes;
      for (const RingCopy& copy : copies) sizes.push_back(copy.bytes);
      posted.pending = local_read(
          _load, *_load.local_files, c, std::move(copies),
          [this, wants = std::move(wants), sizes = std::move(sizes)](std::size_t i,
                                                                     const std::byte* bytes) {
            expect_mine(wants[i], bytes, sizes[i]);
          });
    } else if (_load.local_reads) {
      posted.pending = local_read(_load, *_load.local_files, c, ring_copies(c, destination));
    } else {
      posted.pending = node_ring_receive(_load, *_node_ring, c, ring_copies(c, destination));
    }
    return posted;
  }
  if (_load.plan.chunk_broadcast[c]) {
    if (_load.transport.world_size() == 1) return posted;
    _ranges.clear();
    for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[p];
      if (root) {
        std::byte* from = device != nullptr ? device : const_cast<std::byte*>(source);
        _ranges.push_back({from + piece.chunk_offset, piece.bytes});
      } else {
        const auto w = static_cast<std::uint32_t>(_want_of_tensor[piece.tensor]);
        _ranges.push_back({destination(w, piece.tensor_offset, piece.bytes), piece.bytes});
      }
    }
    posted.pending = _load.transport.broadcast_group(_ranges, 0, nullptr);
    return posted;
  }
  _sends.clear();
  _receives.clear();
  std::uint64_t device_at = 0;
  for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1]; ++i) {
    const weightcast::Delivery& d = _load.plan.deliveries[i];
    if (root) {
      if (d.rank == 0) continue;
      if (device != nullptr) {
        _sends.push_back({d.rank, device + device_at, d.bytes});
        device_at += d.bytes;
        continue;
      }
      std::vector<std::byte> packed;
      const std::byte* data = gather(d, source, packed);
      if (!packed.empty()) posted.buffers.push_back(std::move(packed));
      _sends.push_back({d.rank, const_cast<std::byte*>(data), d.bytes});
    } else if (d.rank == _me) {
      _receives.push_back({0, destination(d.want, d.local_offset, d.bytes), d.bytes});
    }
  }
  posted.pending = _load.transport.exchange(_sends, _receives, static_cast<int>(c % 32768));
  return posted;
}

// The bytes of chunk `c` that this rank receives for cast wants (their windows'), as
// post hands them out.
std::uint64_t PlacedDelivery::cast_bytes(std::size_t c) const {
  std::uint64_t total = 0;
  if (_load.plan.chunk_broadcast[c]) {
    const Chunk& chunk = _load.plan.chunks[c];
    for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[p];
      const std::int32_t w = _want_of_tensor[piece.tensor];
      if (w >= 0 && _cast_to[static_cast<std::uint32_t>(w)]) total += piece.bytes;
    }
    return total;
  }
  for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1]; ++i) {
    const weightcast::Delivery& d = _load.plan.deliveries[i];
    if (d.rank == _me && _cast_to[d.want]) total += d.bytes;
  }
  return total;
}

// A placed chunk has landed on this rank: casts from their windows, wants completed.
void PlacedDelivery::landed(InFlight& landed) {
  const std::size_t c = landed.chunk;
  for (const InFlight::Window& window : landed.windows) {
    const std::byte* data = landed.window_memory.data() + window.at;
    if (_hash_received[window.want]) _received->update(window.want, data, window.bytes);
    cast_into(window.want, data, window.local_offset, window.bytes);
  }
  landed.recycle_windows(_spare_windows);
  _load.progressed();
  _load.stage_event(Stage::broadcast, c, landed.begin);
  const Chunk& chunk = _load.plan.chunks[c];
  if (_load.plan.chunk_broadcast[c]) {
    for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[p];
      const auto w = static_cast<std::uint32_t>(_want_of_tensor[piece.tensor]);
      hash_landed(w, piece.tensor_offset, piece.bytes);
      land(w, piece.bytes);
    }
  } else {
    for (auto i = _load.plan.chunk_first_delivery[c]; i < _load.plan.chunk_first_delivery[c + 1]; ++i) {
      const weightcast::Delivery& d = _load.plan.deliveries[i];
      if (d.rank != _me) continue;
      hash_landed(d.want, d.local_offset, d.bytes);
      land(d.want, d.bytes);
    }
  }
  _load.report_progress(c);
}

// A receiving rank's want is hashed from where it landed: host memory directly
// (`_hash_landed`), an in-place device want (nccl) read back through the device, as no host
// copy of it passed this rank. Rank 0 hashed its own from the source (expect or
// copy_to_mine); a cast want is hashed from its window (landed). Deliveries land in
// each want's local order, as the streaming digest needs.
// The read-back runs on `_hashing`'s one thread, in landing order (a want's digest is
// streamed in its local order); its want's `finish` is queued behind it (want_ready).
// StreamingDigests' entries are independent, so the loader's thread hashes other wants
// meanwhile.
void PlacedDelivery::hash_landed(std::uint32_t w, std::uint64_t local_offset, std::uint64_t bytes) {
  if (_me == 0 || !_hash_received[w] || _cast_to[w] || bytes == 0) return;
  if (_hash_landed[w]) {
    _received->update(w, _want_data[w] + local_offset, bytes);
    return;
  }
  const std::byte* data = _want_data[w] + local_offset;
  asio::post(*_hashing, [this, w, data, bytes] {
    if (_hashing_failure) return;
    try {
      _load.device.read_back(data, bytes, [&](const std::byte* back, std::size_t n) {
        _received->update(w, back, n);
      });
    } catch (...) {
      _hashing_failure = std::current_exception();
    }
  });
}

void PlacedDelivery::expect_mine(std::uint32_t w, const std::byte* data, std::uint64_t bytes) {
  if (bytes == 0) return;
  _self_expected->update(w, data, bytes);
  if ((_self_expected_left[w] -= bytes) == 0) _self_expected->finish(w);
}

bool PlacedDelivery::lands_on_device(std::uint32_t w) const {
  if (_cast_to[w]) return false;  // its window
  const TensorWant& want = _placement.mine.tensors[w];
  const MemoryKind memory = want.destination.data != nullptr ? want.destination.memory
                                                             : _load.arena.kind();
  return memory != MemoryKind::host;
}

void PlacedDelivery::land(std::uint32_t w, std::uint64_t bytes) {
  if ((_want_left[w] -= bytes) == 0) want_ready(w);
}

void PlacedDelivery::want_ready(std::uint32_t w) {
  if (_received && _hash_received[w]) {
    if (_hashing && _me != 0 && !_cast_to[w] && !_hash_landed[w]) {
      asio::post(*_hashing, [this, w] { _received->finish(w); });
    } else {
      _received->finish(w);
    }
  }
  if (!_load.options.on_tensor_ready) return;
  const TensorWant& want = _placement.mine.tensors[w];
  const MemoryKind memory = want.destination.data != nullptr ? want.destination.memory
                                                             : _load.arena.kind();
  _load.options.on_tensor_ready(
      TensorView{&_load.catalogue.tensors[_want_tensor[_me][w]], _want_data[w], memory, &want});
}

}  // namespace weightcast::detail
