// The pipeline's stages: read, completion, upload, upload completion, broadcast and landing, as
// coroutines on one executor, joined by `run` (weightcast/pipeline/detail/pipeline.hpp).
#include "weightcast/pipeline/detail/pipeline.hpp"

#include "weightcast/core/error.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <span>
#include <unistd.h>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using namespace asio::experimental::awaitable_operators;

Pipeline::Pipeline(const asio::any_io_executor& executor, const Catalogue& catalogue,
                   const Plan& plan, const ArenaLayout& layout, Arena& arena, Device& device,
                   Transport& transport, const LoadOptions& options)
    : _executor(executor),
      _catalogue(catalogue),
      _plan(plan),
      _layout(layout),
      _arena(arena),
      _device(device),
      _transport(transport),
      _options(options),
      _landed(catalogue.tensors.size(), 0),
      _to_broadcast(executor, std::max(options.buffer_depth, static_cast<std::uint32_t>(setting::buffer_depth.min))),
      _to_complete(executor, 1),
      _to_land(executor, broadcasts_in_flight - 2),
      _last_progress(_running.now()) {
  _placement = options.placement.get();
}

awaitable<void> Pipeline::run() {
  if (_options.stop.stop_requested()) throw stopped();
  if (_options.stop.stop_possible()) {
    // Runs on the thread that requests the stop: only wake the watchdog, on the executor.
    // The handler may run after this pipeline is gone (a stop as the load ends): it holds
    // a weak reference, and the pipeline is destroyed on the executor too.
    std::function<void()> wake = [executor = _executor, alive = std::weak_ptr(_alive)] {
      asio::post(executor, [alive] {
        if (auto self = alive.lock()) (*self)->_watchdog_timer.cancel();
      });
    };
    _stop_callback.emplace(_options.stop, std::move(wake));
  }
  // Every tensor has a digest, a plan of no chunks (only zero-size tensors) included.
  if (discarding() && _options.digest_discarded) _digests.emplace(_catalogue.tensors.size());
  if (_placement) set_up_placement();
  announce_zero_size_tensors();
  if (_plan.chunks.empty()) co_return;
  if (_transport.rank() == 0) {
    std::uint64_t largest = 0;
    for (const Chunk& chunk : _plan.chunks) largest = std::max(largest, chunk.bytes);
    _files.emplace(_catalogue, _options.direct_io);
    // O_DIRECT reads an aligned superset of each chunk: up to one alignment unit before
    // it and one after (docs/DESIGN.md § Staging: slots are chunk_size + O_DIRECT alignment).
    const std::uint32_t alignment = _files->max_alignment();
    const std::uint64_t slot_bytes = largest + (alignment > 1 ? 2ull * alignment : 0);
    _ring.emplace(_executor, std::min<std::size_t>(_options.buffer_depth, _plan.chunks.size()),
                  slot_bytes, &_device);
    // A placed load over a transport of device memory (nccl): one device region per slot
    // for what its chunk sends (upload_sends), taken once, before the first read.
    if (_placement && _device.name() != "host" && _transport.world_size() > 1) {
      for (std::size_t c = 0; c < _plan.chunks.size(); ++c) {
        _device_send_slot_bytes = std::max(_device_send_slot_bytes, send_bytes(c));
      }
      if (_device_send_slot_bytes > 0) {
        _device_sends = _device.allocate_arena(_device_send_slot_bytes * _ring->slots());
      }
    }
    map_cached_shards();
    _ready.clear();
    for (std::size_t i = 0; i < _ring->slots(); ++i) {
      _ready.push_back(std::make_unique<ReadyChannel>(_executor, 1));
    }
    _requests.resize(_ring->slots());
    _read_begin.resize(_ring->slots());
    _slot_chunk.resize(_ring->slots());
    _slot_head.resize(_ring->slots());
    _slot_source.resize(_ring->slots());
    _to_upload.emplace(_executor, _ring->slots());
    _reader = make_reader(_options.reader, std::max(_options.io_depth, static_cast<std::uint32_t>(setting::io_depth.min)));
    // Registering the slots pins (and so commits) them: only worth it when some chunk is
    // staged; when every read lands in the arena or is sent from a mapping, the slots are
    // never touched.
    const bool staged =
        std::any_of(_plan.chunks.begin(), _plan.chunks.end(), [&](const Chunk& chunk) {
          return !reads_into_arena(chunk) && !mapped(chunk);
        });
    std::vector<std::span<std::byte>> slots;
    for (std::size_t i = 0; staged && i < _ring->slots(); ++i) {
      slots.emplace_back(_ring->slot_data(i), _ring->slot_bytes());
    }
    const bool fixed_buffers = _reader->register_buffers(slots);
    const bool fixed_files = _reader->register_files(_files->fds());
    spdlog::debug("{} reader, {} reads; registered buffers: {}, registered files: {}",
                  _reader->name(), _files->mode(), fixed_buffers, fixed_files);
    co_await (guarded(read_stage()) && guarded(completion_stage()) &&
              guarded(upload_stage()) && guarded(upload_completion_stage()) &&
              guarded(broadcast_stage()) && guarded(landing_stage()) && guarded(watchdog()));
  } else {
    co_await (guarded(broadcast_stage()) && guarded(landing_stage()) && guarded(watchdog()));
  }
}

// Read stage: lease a slot, queue its read, hand it to the upload stage in plan order.
awaitable<void> Pipeline::read_stage() {
  for (std::size_t c = 0; c < _plan.chunks.size(); ++c) {
    const Chunk& chunk = _plan.chunks[c];
    detail::SlotLease lease = co_await _ring->acquire();
    const std::size_t slot = lease.index();
    _slot_chunk[slot] = c;
    if (mapped(chunk)) {
      // Its bytes are in the page cache, mapped: nothing to read. The lease still bounds
      // the chunks between here and their sends' completion to the ring's depth.
      _slot_source[slot] = _maps[chunk.shard]->data() + chunk.file_offset;
      _ready[slot]->try_send(boost::system::error_code{});
      co_await _to_upload->async_send(boost::system::error_code{}, slot, use_awaitable);
      lease.release();
      continue;
    }
    ReadRequest& request = _requests[slot];
    request = ReadRequest{};
    request.fd = _files->fd(chunk.shard);
    // A buffered chunk may land in the arena itself (alignment 1: the rounding below is then
    // the identity and head is 0); the lease then only bounds the reads in flight.
    request.destination =
        reads_into_arena(chunk) ? _arena.data() + chunk.arena_offset : lease.data();
    // O_DIRECT: offset and length rounded out to the alignment; the chunk's bytes start
    // `head` bytes into the slot. The rounded end may lie past the end of the file: only
    // the chunk's own bytes must arrive.
    const std::uint64_t alignment = _files->alignment(chunk.shard);
    const std::uint64_t begin = chunk.file_offset / alignment * alignment;
    const std::uint64_t end = (chunk.file_offset + chunk.bytes + alignment - 1) / alignment *
                              alignment;
    _slot_head[slot] = chunk.file_offset - begin;
    _slot_source[slot] = lease.data() + _slot_head[slot];
    request.bytes = end - begin;
    request.file_offset = begin;
    request.required_bytes = chunk.file_offset + chunk.bytes - begin;
    request.alignment = static_cast<std::uint32_t>(alignment);
    request.user = slot;
    _read_begin[slot] = Clock::now();
    _reader->submit(&request);
    const bool done_at_submit = discarding() && _reader->completed(request);
    // The lease passes to the upload stage only once the hand-over completes: cancelled
    // while it waits, the lease still owns the slot and returns it.
    co_await _to_upload->async_send(boost::system::error_code{}, slot, use_awaitable);
    lease.release();
    // Discarding, a read that completed inside submit (cached pages) is let through before
    // the next is leased: it is the same slot again, as dd reuses one buffer. Leasing
    // ahead gains nothing there (the copy runs on this thread either way) and cycles every
    // slot through the caches and TLB: more kernel time for the same copy (bench/RESULTS.md
    // History: "the read stage against dd"). Reads that wait for the disk keep the ring full.
    if (done_at_submit) co_await _ring->all_given_back();
  }
}

// Completion stage: wake on the reader's eventfd, reap, signal each slot's reader.
awaitable<void> Pipeline::completion_stage() {
  int fd = ::dup(_reader->completion_fd());
  if (fd < 0) throw system_error(Errc::internal, errno, "dup(eventfd)");
  asio::posix::stream_descriptor event(_executor, fd);
  std::vector<ReadRequest*> finished;
  std::size_t reaped = 0;
  // Reads still to complete per shard: once a shard's last one has, one fstat says whether
  // the file changed while it was read (they may complete out of order).
  std::vector<std::size_t> reads_left(_catalogue.shards.size(), 0);
  std::size_t reads = 0;
  for (const Chunk& chunk : _plan.chunks) {
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
      const std::uint32_t shard = _plan.chunks[_slot_chunk[request->user]].shard;
      if (--reads_left[shard] == 0) _files->check_unchanged(shard);
      _ready[request->user]->try_send(boost::system::error_code{});
      _last_progress = _running.now();
      stage_event(Stage::read, _slot_chunk[request->user], _read_begin[request->user]);
    }
  }
}

// Upload stage: wait for the slot's read, queue each piece's copy into the arena, and hand
// the chunk to the completion stage without waiting for its copies: the next chunk's copies
// are queued behind them on the copy stream (up to three chunks: one being waited for, one
// in `_to_complete`, one being handed over), so the copy engine never idles while a poll
// notices a completion.
awaitable<void> Pipeline::upload_stage() {
  for (std::size_t c = 0; c < _plan.chunks.size(); ++c) {
    const std::size_t slot = co_await _to_upload->async_receive(use_awaitable);
    detail::SlotLease lease(&*_ring, slot);
    co_await _ready[slot]->async_receive(use_awaitable);
    const auto upload_begin = Clock::now();
    const Chunk& chunk = _plan.chunks[c];
    const std::byte* source = _slot_source[slot];
    std::vector<std::unique_ptr<Pending>> copies;
    if (_placement) {
      co_await upload_placed(c, source);
      HeldSlot held{std::move(lease), source};
      if (_device_sends) co_await upload_sends(c, held);
      _held.push_back(std::move(held));
    } else if (reads_into_arena(chunk)) {
      // The read put the chunk in its place already.
    } else if (discarding()) {
      // destination: discard: hash the pieces as they pass (unless verify: none); nothing
      // is kept.
      for (std::uint32_t p = 0; _digests && p < chunk.piece_count; ++p) {
        const Piece& piece = _plan.pieces[chunk.first_piece + p];
        _digests->update(piece.tensor, source + piece.chunk_offset, piece.bytes);
        if (piece.tensor_offset + piece.bytes == _catalogue.tensors[piece.tensor].bytes) {
          _digests->finish(piece.tensor);
        }
      }
    } else if (chunk.arena_contiguous) {
      copies.push_back(
          _device.upload(source, _arena.data() + chunk.arena_offset, chunk.bytes));
    } else {
      // A cuda device queues every piece's copy on its one copy stream, with one event.
      _piece_copies.clear();
      for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
        const Piece& piece = _plan.pieces[chunk.first_piece + p];
        _piece_copies.push_back(
            {source + piece.chunk_offset, _arena.data() + piece.arena_offset, piece.bytes});
      }
      copies.push_back(_device.upload_all(_piece_copies));
    }
    _uploading.push_back(Uploading{std::move(lease), std::move(copies), upload_begin});
    co_await _to_complete.async_send(boost::system::error_code{}, c, use_awaitable);
  }
}

// Upload completion stage: waits, in plan order, for each chunk's copies, frees its slot and
// hands the chunk to the broadcast stage, which posts it with no stream wait.
awaitable<void> Pipeline::upload_completion_stage() {
  for (std::size_t c = 0; c < _plan.chunks.size(); ++c) {
    const std::size_t issued = co_await _to_complete.async_receive(use_awaitable);
    if (issued != c) throw Error(Errc::internal, "chunks reached upload completion out of order");
    // A reference into a deque stays valid while the upload stage pushes behind it.
    Uploading& uploading = _uploading.front();
    for (auto& copy : uploading.copies) co_await wait(std::move(copy), upload_poll_cap);
    _last_progress = _running.now();
    stage_event(Stage::upload, c, uploading.begin);
    // The lease ends here: the slot is free again only now that its upload is complete.
    _uploading.pop_front();
    co_await _to_broadcast.async_send(boost::system::error_code{}, c, use_awaitable);
  }
}

// Broadcast stage: every rank posts one grouped broadcast per chunk, in plan order, from
// rank 0's arena, and hands it to the landing stage. Posting waits for that hand-over, so
// at most `broadcasts_in_flight` are posted at once: the next chunk's broadcast is already
// queued when one completes, and no rank idles between chunks while a poll notices the
// completion (MPI and NCCL both allow several collectives in flight, posted in the same
// order on every rank).
awaitable<void> Pipeline::broadcast_stage() {
  const bool root = _transport.rank() == 0;
  for (std::size_t c = 0; c < _plan.chunks.size(); ++c) {
    if (root) {
      const std::size_t uploaded = co_await _to_broadcast.async_receive(use_awaitable);
      if (uploaded != c) throw Error(Errc::internal, "chunks reached broadcast out of order");
    }
    const Chunk& chunk = _plan.chunks[c];
    const auto broadcast_begin = Clock::now();
    if (_placement) {
      InFlight posted = post_placed(c, root);
      posted.begin = broadcast_begin;
      _posted.push_back(std::move(posted));
      co_await _to_land.async_send(boost::system::error_code{}, c, use_awaitable);
      continue;
    }
    // On rank 0 the upload stage hands a chunk over only once its own copies have completed
    // (polled), so the broadcast needs no stream wait: waiting on the device's latest upload
    // event would also wait for the next chunk's H2D.
    _ranges.clear();
    if (chunk.arena_contiguous) {
      _ranges.push_back({_arena.data() + chunk.arena_offset, chunk.bytes});
    } else {
      // Pieces that follow each other in the arena but for the alignment padding before a
      // tensor go as one range (one ncclBroadcast, one MPI_Ibcast) instead of one each:
      // the padding belongs to no tensor, as a tensor with bytes starts at an aligned
      // offset and the gap ends at the first one.
      const std::uint64_t align = std::max<std::uint64_t>(_options.tensor_alignment, 1);
      for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
        const Piece& piece = _plan.pieces[chunk.first_piece + p];
        std::byte* at = _arena.data() + piece.arena_offset;
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
    std::unique_ptr<Pending> pending;
    if (!discarding()) pending = _transport.broadcast_group(_ranges, 0, nullptr);
    InFlight posted;
    posted.pending = std::move(pending);
    posted.begin = broadcast_begin;
    _posted.push_back(std::move(posted));
    co_await _to_land.async_send(boost::system::error_code{}, c, use_awaitable);
  }
}

// Landing stage: waits for each posted broadcast in plan order and marks its chunk landed.
// It runs beside the broadcast stage so that a completion is seen as soon as it happens,
// not when rank 0's next chunk is ready to post; polling it also drives the transport's
// progress (MPI progresses a non-blocking collective only inside MPI calls) while rank 0
// waits on its reads.
awaitable<void> Pipeline::landing_stage() {
  for (std::size_t c = 0; c < _plan.chunks.size(); ++c) {
    const std::size_t posted = co_await _to_land.async_receive(use_awaitable);
    if (posted != c || _posted.empty()) {
      throw Error(Errc::internal, "broadcasts landed out of order");
    }
    // The slot, packed slices and windows stay alive until the exchange has completed.
    InFlight in_flight = std::move(_posted.front());
    _posted.pop_front();
    _landing = c;
    co_await wait(std::move(in_flight.pending), landing_poll_cap());
    _landing.reset();
    if (_placement) {
      placed_landed(c, in_flight);
    } else {
      chunk_landed(c, in_flight.begin);
    }
  }
  // The last stage to finish ends the watchdog (`||` would not cancel it on failure:
  // it waits for one success; `&&` cancels every operand as soon as one fails).
  _finished = true;
  _watchdog_timer.cancel();
}

// Records the first stage failure. When one stage throws, the awaitable operators cancel
// the others and rethrow whichever operand comes first, which may be a cancellation.
awaitable<void> Pipeline::guarded(awaitable<void> stage) {
  try {
    co_await std::move(stage);
  } catch (...) {
    if (!_first_failure) _first_failure = std::current_exception();
    throw;
  }
}

}  // namespace weightcast::detail
