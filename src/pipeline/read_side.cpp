// Rank 0's read side: its set-up, the read and completion stages, the shards sent from the page
// cache, and the errors of its reads (weightcast/pipeline/detail/read_side.hpp).
#include "weightcast/pipeline/detail/read_side.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/transport/detail/node_ring.hpp"

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <span>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;

namespace {

// O_DIRECT reads an aligned superset of each chunk: up to one alignment unit before it and
// one after (docs/DESIGN.md § Staging: slots are chunk_size + O_DIRECT alignment).
std::uint64_t slot_bytes_for(const Plan& plan, const ShardFiles& files) {
  std::uint64_t largest = 0;
  for (const Chunk& chunk : plan.chunks) largest = std::max(largest, chunk.bytes);
  const std::uint32_t alignment = files.max_alignment();
  return largest + (alignment > 1 ? 2ull * alignment : 0);
}

// The ring rank 0 reads into: its own, or with `transport: shm` the slots of the node ring,
// which the node's other ranks copy out of (docs/DESIGN.md § Staging). That ring was sized
// before the plan, from chunk_size and buffer_depth with room for O_DIRECT's alignment; a
// shard whose alignment needs more is refused rather than read past a slot.
StagingRing make_ring(LoadContext& load, const ShardFiles& files) {
  const std::size_t slots =
      std::min<std::size_t>(load.options.buffer_depth, load.plan.chunks.size());
  const std::uint64_t slot_bytes = slot_bytes_for(load.plan, files);
  NodeRing* node = load.transport.node_ring();
  if (node == nullptr) return StagingRing(load.executor, slots, slot_bytes, &load.device);
  if (slot_bytes > node->slot_bytes()) {
    throw Error(Errc::config,
                fmt::format("transport: shm: a chunk read with O_DIRECT (alignment {} bytes) "
                            "needs {} bytes of a node ring slot of {}; set direct_io: off",
                            files.max_alignment(), slot_bytes, node->slot_bytes()));
  }
  return StagingRing(load.executor, std::min(slots, node->slots()), node->slot_bytes(),
                     node->slot_data(0));
}

}  // namespace

ReadSide::ReadSide(LoadContext& load, const ReadPolicy& policy)
    : _load(load),
      _policy(policy),
      _files(load.catalogue, load.options.direct_io),
      _ring(make_ring(load, _files)) {}

void ReadSide::open() {
  map_cached_shards();
  _slots.resize(_ring.slots());
  for (Slot& slot : _slots) slot.ready = std::make_unique<Slot::ReadyChannel>(_load.executor, 1);
  _to_upload.emplace(_load.executor, _ring.slots());
  _reader = make_reader(_load.options.reader,
                        std::max(_load.options.io_depth,
                                 static_cast<std::uint32_t>(setting::io_depth.min)));
  // Registering the slots pins (and so commits) them: only worth it when some chunk is
  // staged; when every read lands in the arena or is sent from a mapping, the slots are
  // never touched.
  const bool staged =
      std::any_of(_load.plan.chunks.begin(), _load.plan.chunks.end(), [&](const Chunk& chunk) {
        return !reads_into_arena(chunk) && !mapped(chunk);
      });
  std::vector<std::span<std::byte>> slots;
  for (std::size_t i = 0; staged && i < _ring.slots(); ++i) {
    slots.emplace_back(_ring.slot_data(i), _ring.slot_bytes());
  }
  const bool fixed_buffers = _reader->register_buffers(slots);
  const bool fixed_files = _reader->register_files(_files.fds());
  spdlog::debug("{} reader, {} reads; registered buffers: {}, registered files: {}",
                _reader->name(), _files.mode(), fixed_buffers, fixed_files);
}

awaitable<void> ReadSide::read_stage() {
  const Plan& plan = _load.plan;
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    SlotLease lease = co_await _ring.acquire();
    const std::size_t index = lease.index();
    Slot& slot = _slots[index];
    slot.chunk = c;
    slot.in_arena = false;
    if (mapped(chunk)) {
      // Its bytes are in the page cache, mapped: nothing to read. The lease still bounds
      // the chunks between here and their sends' completion to the ring's depth.
      slot.source = _maps[chunk.shard]->data() + chunk.file_offset;
      slot.ready->try_send(boost::system::error_code{});
      co_await _to_upload->async_send(boost::system::error_code{}, index, use_awaitable);
      lease.release();
      continue;
    }
    ReadRequest& request = slot.request;
    request = ReadRequest{};
    request.fd = _files.fd(chunk.shard);
    // A buffered chunk may land in the arena itself (alignment 1: the rounding below is then
    // the identity and head is 0); the lease then only bounds the reads in flight.
    slot.in_arena = reads_into_arena(chunk);
    request.destination = slot.in_arena ? _load.arena.data() + chunk.arena_offset : lease.data();
    // O_DIRECT: offset and length rounded out to the alignment; the chunk's bytes start
    // `head` bytes into the slot. The rounded end may lie past the end of the file: only
    // the chunk's own bytes must arrive.
    const std::uint64_t alignment = _files.alignment(chunk.shard);
    const std::uint64_t begin = chunk.file_offset / alignment * alignment;
    const std::uint64_t end = (chunk.file_offset + chunk.bytes + alignment - 1) / alignment *
                              alignment;
    const std::uint64_t head = chunk.file_offset - begin;
    slot.source = lease.data() + head;
    request.bytes = end - begin;
    request.file_offset = begin;
    request.required_bytes = chunk.file_offset + chunk.bytes - begin;
    request.alignment = static_cast<std::uint32_t>(alignment);
    request.user = index;
    slot.read_begin = Clock::now();
    _reader->submit(&request);
    const bool done_at_submit = _policy.reuse_cached_slot && _reader->completed(request);
    // The lease passes to the upload stage only once the hand-over completes: cancelled
    // while it waits, the lease still owns the slot and returns it.
    co_await _to_upload->async_send(boost::system::error_code{}, index, use_awaitable);
    lease.release();
    // Discarding, a read that completed inside submit (cached pages) is let through before
    // the next is leased: it is the same slot again, as dd reuses one buffer. Leasing
    // ahead gains nothing there (the copy runs on this thread either way) and cycles every
    // slot through the caches and TLB: more kernel time for the same copy (bench/RESULTS.md
    // History: "the read stage against dd"). Reads that wait for the disk keep the ring full.
    if (done_at_submit) co_await _ring.all_given_back();
  }
}

awaitable<void> ReadSide::completion_stage() {
  int fd = ::dup(_reader->completion_fd());
  if (fd < 0) throw system_error(Errc::internal, errno, "dup(eventfd)");
  asio::posix::stream_descriptor event(_load.executor, fd);
  std::vector<ReadRequest*> finished;
  std::size_t reaped = 0;
  // Reads still to complete per shard: once a shard's last one has, one fstat says whether
  // the file changed while it was read (they may complete out of order).
  std::vector<std::size_t> reads_left(_load.catalogue.shards.size(), 0);
  std::size_t reads = 0;
  for (const Chunk& chunk : _load.plan.chunks) {
    if (mapped(chunk)) continue;
    ++reads_left[chunk.shard];
    ++reads;
  }
  while (reaped < reads) {
    co_await event.async_wait(asio::posix::stream_descriptor::wait_read, use_awaitable);
    finished.clear();
    reaped += _reader->reap(finished);
    for (ReadRequest* request : finished) {
      if (request->error != 0 || request->end_of_file) throw read_error(*request);
      Slot& slot = _slots[request->user];
      const std::uint32_t shard = _load.plan.chunks[slot.chunk].shard;
      if (--reads_left[shard] == 0) _files.check_unchanged(shard);
      slot.ready->try_send(boost::system::error_code{});
      _load.progressed();
      _load.stage_event(Stage::read, slot.chunk, slot.read_begin);
    }
  }
}

awaitable<SlotLease> ReadSide::next_read() {
  const std::size_t index = co_await _to_upload->async_receive(use_awaitable);
  // Owned from here: cancelled while the read is awaited, the lease returns the slot.
  SlotLease lease(&_ring, index);
  co_await _slots[index].ready->async_receive(use_awaitable);
  co_return lease;
}

std::string ReadSide::io_mode() const {
  std::vector<std::uint8_t> read(_load.catalogue.shards.size(), 0);
  bool any_mapped = false;
  for (const Chunk& chunk : _load.plan.chunks) {
    any_mapped = any_mapped || mapped(chunk);
    if (!mapped(chunk)) read[chunk.shard] = 1;
  }
  if (!any_mapped) return _files.mode();
  const bool any_read = std::find(read.begin(), read.end(), 1) != read.end();
  return any_read ? _files.mode() + "+mapped" : "mapped";
}

// Rank 0 of a placed load over MPI within one node, with a host device, sends each chunk
// from the memory it is in, and the receivers copy their slices out of it themselves (Open
// MPI's single-copy CMA path). A shard already in the page cache (read buffered, and at
// least `mapped_fraction` resident) is then sent from a mapping of the cache's own pages
// instead of being copied into a slot first: rank 0 copies only its own local shards, and
// the receivers copy theirs in parallel (io/detail/mapped_shard.hpp and
// docs/DESIGN.md § Placement). The delivery says when that holds (ReadPolicy); a shard
// read with O_DIRECT, or that cannot be mapped, is read.
void ReadSide::map_cached_shards() {
  const Catalogue& catalogue = _load.catalogue;
  _maps.resize(catalogue.shards.size());
  _mapped_left.assign(catalogue.shards.size(), 0);
  if (!_policy.send_from_page_cache) return;
  std::vector<std::uint8_t> has_chunks(catalogue.shards.size(), 0);
  for (const Chunk& chunk : _load.plan.chunks) has_chunks[chunk.shard] = 1;
  for (std::uint32_t f = 0; f < catalogue.shards.size(); ++f) {
    const ShardInfo& shard = catalogue.shards[f];
    if (has_chunks[f] == 0 || _files.direct(f) || shard.file_bytes == 0 ||
        _files.resident_fraction(f) < mapped_fraction) {
      continue;
    }
    try {
      _maps[f] = std::make_unique<MappedShard>(_files.fd(f), shard.file_bytes, shard.name);
    } catch (const Error& e) {
      spdlog::debug("{}; reading it instead", e.what());
    }
  }
  for (const Chunk& chunk : _load.plan.chunks) {
    if (mapped(chunk)) ++_mapped_left[chunk.shard];
  }
}

void ReadSide::sent(std::size_t c) {
  const Chunk& chunk = _load.plan.chunks[c];
  if (!mapped(chunk)) return;
  MappedShard& map = *_maps[chunk.shard];
  map.release(chunk.file_offset, chunk.bytes);
  // Pages past a new end read as zeros (mapped_shard.hpp), and a receiver's single-copy read
  // of one fails: fail at the first chunk that may have met one, with the message of a read
  // that found the file ended; a zeroed page of a file as long as ever was an I/O error.
  struct stat st {};
  const ShardInfo& shard = _load.catalogue.shards[chunk.shard];
  const bool stat_ok = ::fstat(_files.fd(chunk.shard), &st) == 0;
  const auto size = stat_ok ? static_cast<std::uint64_t>(st.st_size) : shard.file_bytes;
  const std::string& tensor =
      _load.catalogue.tensors[_load.plan.pieces[chunk.first_piece].tensor].name;
  if (size < shard.file_bytes) throw shrank(chunk.shard, size, tensor);
  if (map.truncated() != 0) {
    throw Error(Errc::io, fmt::format("{}: a page of the shard could not be read (an I/O "
                                      "error under its mapping) while sending tensor '{}'",
                                      shard.name, tensor));
  }
  if (--_mapped_left[chunk.shard] == 0) _files.check_unchanged(chunk.shard);
}

// Shard @p f now ends at @p end, found while reading @p tensor (or sending it from the
// page cache): where the file ends, in its header (a shard cut to 0 bytes) or inside a
// tensor, which may be an earlier one than the one being read.
Error ReadSide::shrank(std::uint32_t f, std::uint64_t end, std::string tensor) const {
  const ShardInfo& shard = _load.catalogue.shards[f];
  if (end < shard.data_offset) {
    return Error(Errc::io,
                 fmt::format("{}: file ended at offset {}, inside its header, while reading "
                             "tensor '{}' (expected {} bytes): the shard shrank after its "
                             "header was read",
                             shard.name, end, tensor, shard.file_bytes));
  }
  std::string reading;
  for (const TensorInfo& info : _load.catalogue.tensors) {
    if (info.shard == f && info.file_offset <= end && end < info.file_offset + info.bytes &&
        info.name != tensor) {
      reading = fmt::format(", while reading tensor '{}'", tensor);
      tensor = info.name;
      break;
    }
  }
  return Error(Errc::io,
               fmt::format("{}: file ended at offset {} inside tensor '{}'{} (expected {} "
                           "bytes): the shard shrank after its header was read",
                           shard.name, end, tensor, reading, shard.file_bytes));
}

Error ReadSide::read_error(const ReadRequest& request) const {
  const Plan& plan = _load.plan;
  const Chunk& chunk = plan.chunks[_slots[request.user].chunk];
  const ShardInfo& shard = _load.catalogue.shards[chunk.shard];
  // The first byte that did not arrive; an O_DIRECT request may begin before the chunk.
  const std::uint64_t offset =
      std::max(request.file_offset + request.bytes_done, chunk.file_offset);
  std::string tensor = "?";
  for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
    const Piece& piece = plan.pieces[chunk.first_piece + p];
    if (offset < chunk.file_offset + piece.chunk_offset + piece.bytes) {
      tensor = _load.catalogue.tensors[piece.tensor].name;
      break;
    }
  }
  if (request.end_of_file) {
    // A read that starts past the new end returns nothing at its own offset (for O_DIRECT
    // an aligned one): the file's size says where it really ends.
    std::uint64_t end = offset;
    struct stat st {};
    if (::fstat(request.fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) < end) {
      end = static_cast<std::uint64_t>(st.st_size);
    }
    return shrank(chunk.shard, end, tensor);
  }
  return system_error(Errc::io, request.error,
                      fmt::format("{}: read failed at offset {} (tensor '{}')", shard.name,
                                  offset, tensor));
}

}  // namespace weightcast::detail
