// The pipeline: read, upload and broadcast stages as coroutines on one io_context.
#include "weightcast/distributed/asio.hpp"
#include "weightcast/pipeline/loader.hpp"

#include "weightcast/core/detail/running_time.hpp"
#include "weightcast/checkpoint/detail/shard_files.hpp"
#include "weightcast/io/detail/mapped_shard.hpp"
#include "weightcast/io/detail/staging_ring.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/io/reader.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>
#include <unordered_map>
#include <span>
#include <cerrno>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcast {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using namespace asio::experimental::awaitable_operators;
using Clock = std::chrono::steady_clock;

void check_destination(Destination destination, int world_size) {
  // Discarding keeps nothing, so there is nothing for other ranks to receive either.
  WEIGHTCAST_EXPECT(destination != Destination::discard || world_size == 1, Errc::config,
                    fmt::format("destination: discard: needs world size 1 (got {}); it checks "
                                "and times rank 0's reads only",
                                world_size));
}

void check_load_options(const LoadOptions& options) {
  // The config's own bounds (config.cpp), for an embedder that sets LoadOptions directly.
  auto in_range = [](std::string_view what, std::uint64_t value, std::uint64_t lo,
                     std::uint64_t hi) {
    WEIGHTCAST_EXPECT(value >= lo && value <= hi, Errc::config,
                      fmt::format("LoadOptions::{} is {}: must be {} to {}", what, value, lo, hi));
  };
  in_range("chunk_bytes", options.chunk_bytes, 1, 4ull << 30);
  in_range("buffer_depth", options.buffer_depth, 1, 1024);
  in_range("io_depth", options.io_depth, 1, 4096);
  in_range("tensor_alignment", options.tensor_alignment, 1, 1ull << 30);
  WEIGHTCAST_EXPECT(std::has_single_bit(options.tensor_alignment), Errc::config,
                    fmt::format("LoadOptions::tensor_alignment is {}: must be a power of two",
                                options.tensor_alignment));
  const auto ms = options.timeout.count();
  WEIGHTCAST_EXPECT(ms > 0 && ms <= 7LL * 24 * 3600 * 1000, Errc::config,
                    fmt::format("LoadOptions::timeout is {} ms: must be more than 0 and at most "
                                "7 days",
                                ms));
}

LoadOptions LoadOptions::from_config(const Config& config) {
  LoadOptions options;
  options.chunk_bytes = config.chunk_bytes;
  options.buffer_depth = config.buffer_depth;
  options.io_depth = config.io_depth;
  options.timeout = config.timeout;
  options.direct_io = config.direct_io;
  options.reader = config.reader;
  options.destination = config.destination;
  options.digest_discarded = config.verify == Verify::digest;
  return options;
}

TensorView LoadResult::tensor(std::size_t index) const {
  const TensorInfo& info = catalogue.tensors.at(index);
  // A discarded load has no arena: its views have no data.
  std::byte* data = info.bytes == 0 || arena->data() == nullptr
                        ? nullptr
                        : arena->data() + layout.tensor_offsets.at(index);
  return TensorView{&info, data, arena->kind()};
}

std::string_view to_string(Stage stage) noexcept {
  switch (stage) {
    case Stage::read: return "read";
    case Stage::upload: return "upload";
    case Stage::broadcast: return "broadcast";
  }
  return "read";
}

TensorView LoadResult::local(std::size_t index) const {
  const TensorWant& want = wants.tensors.at(index);
  // By index: a search by name for each want would make N wants cost O(N²).
  const TensorInfo& info = catalogue.tensors.at(want_tensors.at(index));
  const MemoryKind memory = want.destination.data != nullptr ? want.destination.memory
                                                             : arena->kind();
  return TensorView{&info, want_data.at(index), memory, &want};
}

std::vector<std::uint64_t> local_digests(const LoadResult& result) {
  std::vector<std::uint64_t> digests;
  digests.reserve(result.wants.tensors.size());
  for (std::size_t w = 0; w < result.wants.tensors.size(); ++w) {
    const TensorView view = result.local(w);
    const TensorWant& want = *view.want;
    const bool cast = want.destination.dtype && *want.destination.dtype != view.info->dtype;
    const std::uint64_t bytes = local_bytes(*view.info, want);
    const bool hashed = w < result.received_hashed.size() && result.received_hashed[w] != 0;
    if (hashed || cast) {
      digests.push_back(result.received_digests.at(w));
    } else if (want.destination.data != nullptr && view.memory != MemoryKind::host) {
      // Device memory outside the arena is hashed only as it lands, and only with expected
      // digests (`verify: digest`).
      throw Error(Errc::usage,
                  fmt::format("local_digests: tensor '{}' landed in device memory outside the "
                              "arena, which is hashed only as it lands, for a load with "
                              "LoadPlacement::expect_digests (verify: digest)",
                              want.tensor));
    } else if (want.destination.data != nullptr || bytes == 0) {
      digests.push_back(xxh3_64(view.data, bytes));
    } else {
      StreamingDigests one(1);
      result.arena->read_back(static_cast<std::uint64_t>(view.data - result.arena->data()),
                              bytes, [&](const std::byte* data, std::size_t n) {
                                one.update(0, data, n);
                              });
      one.finish(0);
      digests.push_back(one.digests()[0]);
    }
  }
  return digests;
}

std::optional<TensorView> LoadResult::find(std::string_view name) const {
  for (std::size_t w = 0; w < wants.tensors.size(); ++w) {
    if (wants.tensors[w].tensor == name) return local(w);
  }
  if (placed) return std::nullopt;
  for (std::size_t i = 0; i < catalogue.tensors.size(); ++i) {
    if (catalogue.tensors[i].name == name) return tensor(i);
  }
  return std::nullopt;
}

namespace {

/// One-shot signal per staging slot: the read into it has finished.
using ReadyChannel = asio::experimental::channel<void(boost::system::error_code)>;
/// Slot or chunk indices handed from one stage to the next, in plan order.
using IndexChannel = asio::experimental::channel<void(boost::system::error_code, std::size_t)>;

/// A chunk's broadcast, posted on this rank and not yet seen to complete (the chunks are
/// posted and land in plan order, so the queue's order says which chunk it is).
struct InFlight {
  std::unique_ptr<Pending> pending;  ///< null: already complete (or nothing to send)
  Clock::time_point begin;           ///< when it was posted
  // A placed plan only: rank 0's slot the sends read from, the packed slices they send, and
  // on a receiving rank the windows that cast wants land in before their cast, packed in
  // `window_memory` (a chunk's windows are disjoint parts of it: at most its bytes).
  detail::SlotLease lease;
  std::vector<std::vector<std::byte>> buffers;
  struct Window {
    std::uint32_t want;
    std::uint64_t local_offset;
    std::uint64_t bytes;
    std::uint64_t at;  ///< Offset in window_memory.
  };
  std::vector<Window> windows;
  std::vector<std::byte> window_memory;
};

/// Rank 0's slot between a placed chunk's upload (its own copies) and its sends.
/// A chunk whose copies are queued on the device, not yet seen complete (upload_stage hands
/// it to upload_completion_stage).
struct Uploading {
  detail::SlotLease lease;  ///< Empty for a placed chunk (its slot is held in `_held`).
  std::vector<std::unique_ptr<Pending>> copies;
  std::chrono::steady_clock::time_point begin;
};

struct HeldSlot {
  detail::SlotLease lease;
  const std::byte* source = nullptr;  ///< The chunk's first byte in the slot.
  /// Transport nccl (device memory only): the bytes rank 0 sends, uploaded from the slot —
  /// the whole chunk for a broadcast, else each delivery's in plan order, packed. Null
  /// under mpi, which sends from the slot.
  std::byte* device = nullptr;
};

class Pipeline {
 public:
  Pipeline(const asio::any_io_executor& executor, const Catalogue& catalogue, const Plan& plan,
           const ArenaLayout& layout, Arena& arena, Device& device, Transport& transport,
           const LoadOptions& options)
      : _executor(executor),
        _catalogue(catalogue),
        _plan(plan),
        _layout(layout),
        _arena(arena),
        _device(device),
        _transport(transport),
        _options(options),
        _landed(catalogue.tensors.size(), 0),
        _to_broadcast(executor, std::max<std::uint32_t>(options.buffer_depth, 1)),
        _to_complete(executor, 1),
        _to_land(executor, broadcasts_in_flight - 2),
        _last_progress(_running.now()) {
    _placement = options.placement.get();
  }

  awaitable<void> run() {
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
      _reader = make_reader(_options.reader, std::max<std::uint32_t>(_options.io_depth, 1));
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

  /// @return the first failure of any stage (the cause; later ones are its cancellations).
  [[nodiscard]] std::exception_ptr first_failure() const noexcept { return _first_failure; }

  [[nodiscard]] std::uint64_t staging_bytes() const noexcept {
    return _ring ? _ring->total_bytes() : 0;
  }
  [[nodiscard]] std::string reader_name() const {
    return _reader ? std::string(_reader->name()) : std::string();
  }
  /// "buffered", "direct" or "direct+buffered" (ShardFiles::mode), "+mapped" where some
  /// shards were sent from the page cache (map_cached_shards), "mapped" where all were.
  [[nodiscard]] std::string io_mode() const {
    if (!_files) return std::string();
    std::vector<std::uint8_t> read(_catalogue.shards.size(), 0);
    bool any_mapped = false;
    for (const Chunk& chunk : _plan.chunks) {
      any_mapped = any_mapped || mapped(chunk);
      if (!mapped(chunk)) read[chunk.shard] = 1;
    }
    if (!any_mapped) return _files->mode();
    const bool any_read = std::find(read.begin(), read.end(), 1) != read.end();
    return any_read ? _files->mode() + "+mapped" : "mapped";
  }
  /// @return the streamed digests (`destination: discard`), empty otherwise.
  [[nodiscard]] std::vector<std::uint64_t> digests() const {
    return _digests ? _digests->digests() : std::vector<std::uint64_t>{};
  }

  /// Frees the reader before the ring: in-flight reads must finish before slots go away.
  void shut_down() noexcept { _reader.reset(); }

  // ---- placement (a placed plan): each rank receives exactly its wants ----

  /// Where this rank's wants land (`LoadResult::want_data`); call before `run`.
  void use_destinations(std::vector<std::byte*> want_data) { _want_data = std::move(want_data); }

  /// Rank 0, `LoadPlacement::expect_digests`: per rank, per want, the digest of what it
  /// should have received.
  [[nodiscard]] std::vector<std::vector<std::uint64_t>> expected_digests() const {
    std::vector<std::vector<std::uint64_t>> out;
    if (!_expected) return out;
    const auto& digests = _expected->digests();
    for (std::size_t r = 0; r < _placement->all.size(); ++r) {
      out.emplace_back();
      for (std::size_t w = 0; w < _placement->all[r].tensors.size(); ++w) {
        out.back().push_back(digests[expected_index(r, w)]);
      }
    }
    return out;
  }
  /// Per want of this rank: whether `received_digests` holds its digest.
  [[nodiscard]] std::vector<std::uint8_t> received_hashed() const {
    if (_me == 0 && _expected) return std::vector<std::uint8_t>(_want_data.size(), 1);
    return _hash_received;
  }
  /// Per want of this rank: the digest of the bytes received (hashed as they landed), or 0.
  /// Rank 0 with expected digests: its own expected ones, of the bytes it copied from.
  [[nodiscard]] std::vector<std::uint64_t> received_digests() const {
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

 private:
  void set_up_placement() {
    const LoadPlacement& placement = *_placement;
    _me = _transport.rank();
    std::unordered_map<std::string_view, std::uint32_t> index;
    for (std::uint32_t t = 0; t < _catalogue.tensors.size(); ++t) {
      index.emplace(_catalogue.tensors[t].name, t);
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
        _whole[r].push_back(wants_whole(_catalogue.tensors[t], want) ? 1 : 0);
        if (keep) _runs[r].emplace_back(_catalogue.tensors[t], want);
      }
    }
    const RankWants& mine = placement.mine;
    _want_of_tensor.assign(_catalogue.tensors.size(), -1);
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
      const TensorInfo& info = _catalogue.tensors[t];
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
                                                         : _arena.kind() == MemoryKind::host;
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
    if (_me == 0 && placement.expect_digests) {
      // Index space: a digest per tensor (the whole tensor, shared by every whole want), then
      // one per (rank, want) for the slices.
      _tensor_whole_wanted.assign(_catalogue.tensors.size(), 0);
      _expected_base.assign(ranks + 1, _catalogue.tensors.size());
      for (std::size_t r = 0; r < ranks; ++r) {
        _expected_base[r + 1] = _expected_base[r] + placement.all[r].tensors.size();
        for (std::size_t w = 0; w < _want_tensor[r].size(); ++w) {
          if (_whole[r][w]) _tensor_whole_wanted[_want_tensor[r][w]] = 1;
        }
      }
      _expected.emplace(_expected_base.back());
      _expected_left.assign(_expected_base.back(), 0);
      for (std::uint32_t t = 0; t < _catalogue.tensors.size(); ++t) {
        _expected_left[t] = _catalogue.tensors[t].bytes;
      }
      for (std::size_t r = 0; r < ranks; ++r) {
        for (std::size_t w = 0; w < _want_tensor[r].size(); ++w) {
          if (!_whole[r][w]) _expected_left[_expected_base[r] + w] = _runs[r][w].bytes();
        }
      }
    }
  }

  [[nodiscard]] std::size_t expected_index(std::size_t rank, std::size_t want) const {
    return _whole[rank][want] ? _want_tensor[rank][want] : _expected_base[rank] + want;
  }

  void expect(std::size_t index, const std::byte* data, std::uint64_t bytes) {
    _expected->update(static_cast<std::uint32_t>(index), data, bytes);
    if ((_expected_left[index] -= bytes) == 0) _expected->finish(static_cast<std::uint32_t>(index));
  }

  // The chunk offset of tensor byte `tensor_byte` of piece `piece`.
  [[nodiscard]] std::uint64_t chunk_offset(const Piece& piece, std::uint64_t tensor_byte) const {
    return piece.chunk_offset + (tensor_byte - piece.tensor_offset);
  }

  // Delivery `d`'s bytes in local order: straight from the chunk when they are one run, else
  // gathered into `buffer` (a strided slice: one message, never one per row).
  const std::byte* gather(const Delivery& d, const std::byte* source,
                          std::vector<std::byte>& buffer) const {
    const Piece& piece = _plan.pieces[d.piece];
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
  void cast_into(std::uint32_t w, const std::byte* data, std::uint64_t local_offset,
                 std::uint64_t bytes) {
    CastState& state = _cast[w];
    if (local_offset != state.next) {
      throw Error(Errc::internal, fmt::format("cast of tensor '{}': bytes at {} arrived, {} "
                                              "expected",
                                              _placement->mine.tensors[w].tensor, local_offset,
                                              state.next));
    }
    state.next += bytes;
    const Dtype from = _catalogue.tensors[_want_tensor[_me][w]].dtype;
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
  std::unique_ptr<Pending> copy_to_mine(std::uint32_t w, const std::byte* data,
                                        std::uint64_t local_offset, std::uint64_t bytes) {
    // Only without expected digests (verify: none): a cast or device want's report digest,
    // of the source bytes. With them, rank 0's own digests are its expected ones.
    if (_hash_received[w]) _received->update(w, data, bytes);
    if (_cast_to[w]) {
      cast_into(w, data, local_offset, bytes);
      return nullptr;
    }
    return _device.upload(data, _want_data[w] + local_offset, bytes);
  }

  // Rank 0's upload stage for a placed chunk: its own wants' bytes to their destinations,
  // every rank's expected digests; the slot stays held for the sends.
  // Copies from the slot are all queued, then waited for together; one from the gather
  // scratch is waited for at once, as the next gather reuses (and may reallocate) it.
  awaitable<void> upload_placed(std::size_t c, const std::byte* source) {
    const Chunk& chunk = _plan.chunks[c];
    std::vector<std::unique_ptr<Pending>> copies;
    for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
      const Piece& piece = _plan.pieces[p];
      if (_expected && _tensor_whole_wanted[piece.tensor]) {
        expect(piece.tensor, source + piece.chunk_offset, piece.bytes);
      }
      if (!_plan.chunk_broadcast[c]) continue;
      const std::int32_t w = _want_of_tensor[piece.tensor];
      copies.push_back(copy_to_mine(static_cast<std::uint32_t>(w), source + piece.chunk_offset,
                                    piece.tensor_offset, piece.bytes));
    }
    if (_plan.chunk_broadcast[c]) {
      for (auto& copy : copies) co_await wait(std::move(copy), upload_poll_cap);
      co_return;
    }
    for (auto i = _plan.chunk_first_delivery[c]; i < _plan.chunk_first_delivery[c + 1]; ++i) {
      const Delivery& d = _plan.deliveries[i];
      if (_expected && !_whole[d.rank][d.want]) {
        const Piece& piece = _plan.pieces[d.piece];
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
        co_await wait(std::move(copy), upload_poll_cap);
      }
    }
    for (auto& copy : copies) co_await wait(std::move(copy), upload_poll_cap);
  }

  // The bytes chunk `c` sends per rank, and under nccl the most of any chunk: what each slot's
  // device region holds.
  [[nodiscard]] std::uint64_t send_bytes(std::size_t c) const {
    if (_plan.chunk_broadcast[c]) return _plan.chunks[c].bytes;
    std::uint64_t total = 0;
    for (auto i = _plan.chunk_first_delivery[c]; i < _plan.chunk_first_delivery[c + 1]; ++i) {
      if (_plan.deliveries[i].rank != 0) total += _plan.deliveries[i].bytes;
    }
    return total;
  }

  // Rank 0 under nccl, which sends device memory only: what chunk `c` sends goes up from the
  // slot into the slot's device region (`_device_sends`) — the whole chunk for a broadcast,
  // else each delivery's bytes (gathered on the host when strided) packed in plan order. The
  // copies complete before the chunk is posted, so the sends need no stream wait.
  awaitable<void> upload_sends(std::size_t c, HeldSlot& held) {
    if (_transport.world_size() == 1) co_return;
    held.device = _device_sends->data() + held.lease.index() * _device_send_slot_bytes;
    if (_plan.chunk_broadcast[c]) {
      co_await wait(_device.upload(held.source, held.device, _plan.chunks[c].bytes),
                    upload_poll_cap);
      co_return;
    }
    std::uint64_t at = 0;
    std::vector<std::unique_ptr<Pending>> copies;  // from the slot: waited for together
    for (auto i = _plan.chunk_first_delivery[c]; i < _plan.chunk_first_delivery[c + 1]; ++i) {
      const Delivery& d = _plan.deliveries[i];
      if (d.rank == 0) continue;
      const std::byte* data = gather(d, held.source, _scratch);
      auto copy = _device.upload(data, held.device + at, d.bytes);
      if (d.runs == 1) {
        copies.push_back(std::move(copy));
      } else {
        co_await wait(std::move(copy), upload_poll_cap);  // the scratch is reused next
      }
      at += d.bytes;
    }
    for (auto& copy : copies) co_await wait(std::move(copy), upload_poll_cap);
  }

  // Every rank posts a placed chunk: a broadcast when every rank wants it whole, else rank
  // 0's sends (each rank's slice of the chunk as one message) and this rank's receives.
  InFlight post_placed(std::size_t c, bool root) {
    InFlight posted;
    const Chunk& chunk = _plan.chunks[c];
    const std::byte* source = nullptr;
    std::byte* device = nullptr;  // nccl: what rank 0 sends, on the device (upload_sends)
    if (root) {
      if (_held.empty()) throw Error(Errc::internal, "a placed chunk reached its post unread");
      posted.lease = std::move(_held.front().lease);
      source = _held.front().source;
      device = _held.front().device;
      _held.pop_front();
    }
    // A cast want lands in a window first; the cast follows once the chunk has landed.
    // Window memory is reused from chunks that landed (at most `broadcasts_in_flight`
    // exist): a fresh allocation per chunk would zero and fault in its bytes each time. Sized
    // to this rank's cast bytes of the chunk, known before any window is handed out.
    std::uint64_t window_at = 0;
    const std::uint64_t window_bytes = root ? 0 : cast_bytes(c);
    auto destination = [&](std::uint32_t w, std::uint64_t local_offset, std::uint64_t bytes) {
      if (!_cast_to[w]) return _want_data[w] + local_offset;
      if (posted.windows.empty()) {
        if (!_spare_windows.empty()) {
          posted.window_memory = std::move(_spare_windows.back());
          _spare_windows.pop_back();
        }
        if (posted.window_memory.size() < window_bytes) posted.window_memory.resize(window_bytes);
      }
      if (window_at + bytes > posted.window_memory.size()) {
        throw Error(Errc::internal, fmt::format("chunk {}'s cast windows exceed {} bytes", c,
                                                window_bytes));
      }
      posted.windows.push_back({w, local_offset, bytes, window_at});
      window_at += bytes;
      return posted.window_memory.data() + posted.windows.back().at;
    };
    if (_plan.chunk_broadcast[c]) {
      if (_transport.world_size() == 1) return posted;
      _ranges.clear();
      for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
        const Piece& piece = _plan.pieces[p];
        if (root) {
          std::byte* from = device != nullptr ? device : const_cast<std::byte*>(source);
          _ranges.push_back({from + piece.chunk_offset, piece.bytes});
        } else {
          const auto w = static_cast<std::uint32_t>(_want_of_tensor[piece.tensor]);
          _ranges.push_back({destination(w, piece.tensor_offset, piece.bytes), piece.bytes});
        }
      }
      posted.pending = _transport.broadcast_group(_ranges, 0, nullptr);
      return posted;
    }
    _sends.clear();
    _receives.clear();
    std::uint64_t device_at = 0;
    for (auto i = _plan.chunk_first_delivery[c]; i < _plan.chunk_first_delivery[c + 1]; ++i) {
      const Delivery& d = _plan.deliveries[i];
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
    posted.pending = _transport.exchange(_sends, _receives, static_cast<int>(c % 32768));
    return posted;
  }

  // The bytes of chunk `c` that this rank receives for cast wants (their windows'), as
  // post_placed hands them out.
  [[nodiscard]] std::uint64_t cast_bytes(std::size_t c) const {
    std::uint64_t total = 0;
    if (_plan.chunk_broadcast[c]) {
      const Chunk& chunk = _plan.chunks[c];
      for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
        const Piece& piece = _plan.pieces[p];
        const std::int32_t w = _want_of_tensor[piece.tensor];
        if (w >= 0 && _cast_to[static_cast<std::uint32_t>(w)]) total += piece.bytes;
      }
      return total;
    }
    for (auto i = _plan.chunk_first_delivery[c]; i < _plan.chunk_first_delivery[c + 1]; ++i) {
      const Delivery& d = _plan.deliveries[i];
      if (d.rank == _me && _cast_to[d.want]) total += d.bytes;
    }
    return total;
  }

  // A placed chunk has landed on this rank: casts from their windows, wants completed.
  void placed_landed(std::size_t c, InFlight& landed) {
    if (mapped(_plan.chunks[c])) mapped_chunk_sent(_plan.chunks[c]);
    for (const InFlight::Window& window : landed.windows) {
      const std::byte* data = landed.window_memory.data() + window.at;
      if (_hash_received[window.want]) _received->update(window.want, data, window.bytes);
      cast_into(window.want, data, window.local_offset, window.bytes);
    }
    if (!landed.window_memory.empty()) _spare_windows.push_back(std::move(landed.window_memory));
    _last_progress = _running.now();
    stage_event(Stage::broadcast, c, landed.begin);
    const Chunk& chunk = _plan.chunks[c];
    if (_plan.chunk_broadcast[c]) {
      for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
        const Piece& piece = _plan.pieces[p];
        const auto w = static_cast<std::uint32_t>(_want_of_tensor[piece.tensor]);
        hash_landed(w, piece.tensor_offset, piece.bytes);
        land(w, piece.bytes);
      }
    } else {
      for (auto i = _plan.chunk_first_delivery[c]; i < _plan.chunk_first_delivery[c + 1]; ++i) {
        const Delivery& d = _plan.deliveries[i];
        if (d.rank != _me) continue;
        hash_landed(d.want, d.local_offset, d.bytes);
        land(d.want, d.bytes);
      }
    }
    report_progress(c);
  }

  // A receiving rank's want is hashed from where it landed: host memory directly
  // (`_hash_landed`), an in-place device want (nccl) read back through the device, as no host
  // copy of it passed this rank. Rank 0 hashed its own from the source (expect or
  // copy_to_mine); a cast want is hashed from its window, above. Deliveries land in each want's local order, as the
  // streaming digest needs.
  // The read-back runs on `_hashing`'s one thread, in landing order (a want's digest is
  // streamed in its local order); its want's `finish` is queued behind it (want_ready).
  // StreamingDigests' entries are independent, so the loader's thread hashes other wants
  // meanwhile.
  void hash_landed(std::uint32_t w, std::uint64_t local_offset, std::uint64_t bytes) {
    if (_me == 0 || !_hash_received[w] || _cast_to[w] || bytes == 0) return;
    if (_hash_landed[w]) {
      _received->update(w, _want_data[w] + local_offset, bytes);
      return;
    }
    const std::byte* data = _want_data[w] + local_offset;
    asio::post(*_hashing, [this, w, data, bytes] {
      if (_hashing_failure) return;
      try {
        _device.read_back(data, bytes, [&](const std::byte* back, std::size_t n) {
          _received->update(w, back, n);
        });
      } catch (...) {
        _hashing_failure = std::current_exception();
      }
    });
  }

 public:
  /// Waits for the device read-backs still hashing (`hash_landed`); call after `run` and
  /// before `received_digests`. @throws what a read-back threw (`Arena::read_back`'s errors).
  void finish_hashing() {
    if (!_hashing) return;
    _hashing->join();
    _hashing.reset();
    if (_hashing_failure) std::rethrow_exception(_hashing_failure);
  }

 private:

  void land(std::uint32_t w, std::uint64_t bytes) {
    if ((_want_left[w] -= bytes) == 0) want_ready(w);
  }

  void want_ready(std::uint32_t w) {
    if (_received && _hash_received[w]) {
      if (_hashing && _me != 0 && !_cast_to[w] && !_hash_landed[w]) {
        asio::post(*_hashing, [this, w] { _received->finish(w); });
      } else {
        _received->finish(w);
      }
    }
    if (!_options.on_tensor_ready) return;
    const TensorWant& want = _placement->mine.tensors[w];
    const MemoryKind memory = want.destination.data != nullptr ? want.destination.memory
                                                               : _arena.kind();
    _options.on_tensor_ready(
        TensorView{&_catalogue.tensors[_want_tensor[_me][w]], _want_data[w], memory, &want});
  }

  struct CastState {
    std::uint64_t next = 0;     // the local byte expected next
    std::uint64_t carried = 0;  // bytes of a cut element in `carry`
    std::byte carry[8]{};
  };

  // Read stage: lease a slot, queue its read, hand it to the upload stage in plan order.
  awaitable<void> read_stage() {
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
      // slot through the caches and TLB: more kernel time for the same copy (bench/RESULTS.md,
      // issue 20). Reads that wait for the disk keep the whole ring in flight.
      if (done_at_submit) co_await _ring->all_given_back();
    }
  }

  // Completion stage: wake on the reader's eventfd, reap, signal each slot's reader.
  awaitable<void> completion_stage() {
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
  awaitable<void> upload_stage() {
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
  awaitable<void> upload_completion_stage() {
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
  awaitable<void> broadcast_stage() {
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
  awaitable<void> landing_stage() {
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

  // Ends the load when no stage has made progress for `timeout`: nothing waits forever.
  awaitable<void> watchdog() {
    const auto tick = std::min<Clock::duration>(_options.timeout, std::chrono::seconds(1));
    while (!_finished) {
      // A stop request (LoadOptions::stop) cancels the wait; its error is the cause, and
      // cancels the other stages. Checked before the wait too: its wake-up may have run
      // before this stage first waited.
      if (_options.stop.stop_requested()) throw stopped();
      _watchdog_timer.expires_after(tick);
      const auto due = Clock::now() + tick;
      boost::system::error_code ec;
      co_await _watchdog_timer.async_wait(asio::redirect_error(use_awaitable, ec));
      if (_finished) co_return;
      if (_options.stop.stop_requested()) throw stopped();
      if (ec) throw boost::system::system_error(ec);  // cancelled: another stage failed
      // A wake-up far later than asked: this process was stopped (SIGSTOP, a debugger) or
      // starved, and could make no progress meanwhile (detail::RunningClock).
      // That time is not a stall of the load (a rank stopped for `timeout` and resumed ended
      // the job blaming the others); if the others stalled on it, they have said so.
      _running.woke(due);
      if (_running.now() - _last_progress >= _options.timeout) {
        // A broadcast is collective: where this rank waits on one, the rank holding it back
        // is another (stopped, stuck, or gone without its connection closing).
        const std::string where =
            _landing && _transport.world_size() > 1
                ? fmt::format(" waiting for chunk {}'s broadcast to complete, which needs "
                              "every rank: another rank stopped taking part",
                              *_landing)
                : std::string();
        throw Error(Errc::timeout,
                    fmt::format("no progress for {} ms (timeout): the load stalled{}",
                                _options.timeout.count(), where));
      }
    }
  }

  // How late a watchdog wake-up must be to count as time this process did not run.
  static constexpr std::chrono::milliseconds suspended_after{500};

  [[nodiscard]] static Error stopped() {
    return Error(Errc::interrupted, "the load was stopped (LoadOptions::stop was requested)");
  }

  // Records the first stage failure. When one stage throws, the awaitable operators cancel
  // the others and rethrow whichever operand comes first, which may be a cancellation.
  awaitable<void> guarded(awaitable<void> stage) {
    try {
      co_await std::move(stage);
    } catch (...) {
      if (!_first_failure) _first_failure = std::current_exception();
      throw;
    }
  }

  // Polls an operation in flight on the device or transport, every 10 µs at first, then
  // twice as long each time up to @p cap.
  awaitable<void> wait(std::unique_ptr<Pending> pending,
                       std::chrono::microseconds cap = std::chrono::microseconds(1000)) {
    if (!pending) co_return;
    asio::steady_timer timer(_executor);
    auto interval = std::chrono::microseconds(10);
    while (!pending->test()) {
      timer.expires_after(interval);
      co_await timer.async_wait(use_awaitable);
      interval = std::min(interval * 2, cap);
    }
  }

  // How late a completed copy may be noticed: a 16 MiB H2D copy takes ~0.3 ms on PCIe 5, and
  // a 1 ms cap noticed it up to ~0.6 ms late (a slot and the chunk's broadcast held as long;
  // the copy engine meanwhile runs the chunks queued behind it). 100 µs keeps that under a
  // third of a copy for one cudaEventQuery per 100 µs. Rank 0's placed uploads still wait
  // for each copy in turn. (A host device's upload is a memcpy: nothing to poll.)
  static constexpr std::chrono::microseconds upload_poll_cap{100};

  // The landing stage's poll: how late a completed broadcast may be noticed, and, while at
  // most two are in flight, how late the next one is posted. A receiving rank under mpi also
  // copies the bytes inside its polls (MpiBroadcast::test), so a long sleep between polls
  // delays the copy's start. 3 ranks on 2 cores, the broadcast stage against plain MPI_Bcast
  // (bench/bcast_bench, old and new binaries alternating): 0.58, 0.63, 0.64 with a 1 ms cap
  // and 0.72, 0.71, 0.81 with 50 µs beside O_DIRECT reads; 0.56 to 0.65 either way beside
  // buffered reads, which take the cores (bench/RESULTS.md). A 16 MiB broadcast over
  // NVLink takes about 0.2 ms, so a 1 ms cap
  // would bound a GPU job to two chunks per millisecond. Rank 0 with a host arena keeps
  // 1 ms: its one thread also copies the buffered reads, and polling it every 100 µs or less
  // made the whole load slower (2 ranks: 0.42 to 0.40 and 0.35 of MPI_Bcast).
  [[nodiscard]] std::chrono::microseconds landing_poll_cap() const noexcept {
    if (_transport.rank() == 0 && _arena.kind() == MemoryKind::host) {
      return std::chrono::microseconds(1000);
    }
    return std::chrono::microseconds(50);
  }

  // Chunk `c`'s broadcast (begun at `begin`) has completed on this rank: its bytes are in
  // the arena; tensors whose last piece it carried are ready.
  void chunk_landed(std::size_t c, Clock::time_point begin) {
    const Chunk& chunk = _plan.chunks[c];
    _last_progress = _running.now();
    stage_event(Stage::broadcast, c, begin);
    for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
      const std::uint32_t t = _plan.pieces[chunk.first_piece + p].tensor;
      if (++_landed[t] == _plan.tensor_piece_counts[t]) tensor_ready(t);
    }
    report_progress(c);
  }

  // Tells the trace hook that `stage` finished chunk `c`, which it began at `begin`.
  void stage_event(Stage stage, std::size_t c, Clock::time_point begin) const {
    if (!_options.on_stage_event) return;
    const Chunk& chunk = _plan.chunks[c];
    _options.on_stage_event(StageEvent{stage, c, chunk.shard, chunk.bytes, begin, Clock::now()});
  }

  // Tells the progress hook that chunk `c` has landed (chunks land in plan order).
  void report_progress(std::size_t c) {
    const Chunk& chunk = _plan.chunks[c];
    _bytes_landed += chunk.bytes;
    if (!_options.on_progress) return;
    const ShardInfo& shard = _catalogue.shards[chunk.shard];
    _options.on_progress(LoadProgress{
        _bytes_landed, _plan.total_bytes, c + 1, _plan.chunks.size(), chunk.shard,
        static_cast<std::uint32_t>(_catalogue.shards.size()), shard.name,
        std::chrono::duration<double>(Clock::now() - _started).count()});
  }

  void announce_zero_size_tensors() {
    if (_placement) {
      for (std::uint32_t w = 0; w < _want_left.size(); ++w) {
        if (_want_left[w] == 0) want_ready(w);
      }
      return;
    }
    for (std::uint32_t t = 0; t < _catalogue.tensors.size(); ++t) {
      if (_plan.tensor_piece_counts[t] == 0) tensor_ready(t);
    }
  }

  [[nodiscard]] bool discarding() const noexcept {
    return _options.destination == Destination::discard;
  }

  // Rank 0 of a placed load over MPI within one node, with a host device, sends each chunk
  // from the memory it is in, and the receivers copy their slices out of it themselves (Open
  // MPI's single-copy CMA path). A shard already in the page cache (read buffered, and at
  // least `mapped_fraction` resident) is then sent from a mapping of the cache's own pages
  // instead of being copied into a slot first: rank 0 copies only its own local shards, and
  // the receivers copy theirs in parallel (io/detail/mapped_shard.hpp and
  // docs/DESIGN.md § Placement). Across nodes a network transport may need to register the
  // memory it sends for writing, which a read-only mapping refuses: there, and under
  // `direct_io: on` (bypass the page cache), nothing is mapped. A shard that cannot be
  // mapped is read.
  void map_cached_shards() {
    _maps.resize(_catalogue.shards.size());
    _mapped_left.assign(_catalogue.shards.size(), 0);
    if (!_placement || _transport.world_size() == 1 ||
        !_transport.receivers_read_sender_memory() || _device.name() != "host" ||
        _options.direct_io == DirectIo::on) {
      return;
    }
    std::vector<std::uint8_t> has_chunks(_catalogue.shards.size(), 0);
    for (const Chunk& chunk : _plan.chunks) has_chunks[chunk.shard] = 1;
    for (std::uint32_t f = 0; f < _catalogue.shards.size(); ++f) {
      const ShardInfo& shard = _catalogue.shards[f];
      if (has_chunks[f] == 0 || _files->direct(f) || shard.file_bytes == 0 ||
          _files->resident_fraction(f) < mapped_fraction) {
        continue;
      }
      try {
        _maps[f] = std::make_unique<detail::MappedShard>(_files->fd(f), shard.file_bytes,
                                                         shard.name);
      } catch (const Error& e) {
        spdlog::debug("{}; reading it instead", e.what());
      }
    }
    for (const Chunk& chunk : _plan.chunks) {
      if (mapped(chunk)) ++_mapped_left[chunk.shard];
    }
  }

  [[nodiscard]] bool mapped(const Chunk& chunk) const {
    return chunk.shard < _maps.size() && _maps[chunk.shard] != nullptr;
  }

  // A mapped chunk's sends have completed: its pages leave rank 0's RSS (the window stays
  // the ring's), and after a shard's last chunk, the shard is checked as a read one is.
  void mapped_chunk_sent(const Chunk& chunk) {
    detail::MappedShard& map = *_maps[chunk.shard];
    map.release(chunk.file_offset, chunk.bytes);
    // Pages past a new end read as zeros (mapped_shard.hpp), and a receiver's single-copy read
    // of one fails: fail at the first chunk that may have met one, with the message of a read
    // that found the file ended; a zeroed page of a file as long as ever was an I/O error.
    struct stat st {};
    const ShardInfo& shard = _catalogue.shards[chunk.shard];
    const bool stat_ok = ::fstat(_files->fd(chunk.shard), &st) == 0;
    const auto size = stat_ok ? static_cast<std::uint64_t>(st.st_size) : shard.file_bytes;
    const std::string& tensor = _catalogue.tensors[_plan.pieces[chunk.first_piece].tensor].name;
    if (size < shard.file_bytes) throw shrank(chunk.shard, size, tensor);
    if (map.truncated() != 0) {
      throw Error(Errc::io, fmt::format("{}: a page of the shard could not be read (an I/O "
                                        "error under its mapping) while sending tensor '{}'",
                                        shard.name, tensor));
    }
    if (--_mapped_left[chunk.shard] == 0) _files->check_unchanged(chunk.shard);
  }

  // Of a shard's pages, the fraction resident for it to be sent from the page cache: a few
  // missing pages are read by the faults that meet them.
  static constexpr double mapped_fraction = 0.95;

  // A buffered chunk whose pieces tile one range of a host arena is read into that range:
  // no slot, no copy. O_DIRECT chunks are staged: their aligned superset spills past them.
  [[nodiscard]] bool reads_into_arena(const Chunk& chunk) const {
    return !discarding() && !_placement && _device.reads_into_arena() &&
           chunk.arena_contiguous && _files->alignment(chunk.shard) == 1;
  }

  void tensor_ready(std::uint32_t t) {
    if (!_options.on_tensor_ready) return;
    const TensorInfo& info = _catalogue.tensors[t];
    std::byte* data = info.bytes == 0 || discarding()
                          ? nullptr
                          : _arena.data() + _layout.tensor_offsets[t];
    _options.on_tensor_ready(TensorView{&info, data, _arena.kind()});
  }

  // Shard @p f now ends at @p end, found while reading @p tensor (or sending it from the
  // page cache): where the file ends, in its header (a shard cut to 0 bytes) or inside a
  // tensor, which may be an earlier one than the one being read.
  [[nodiscard]] Error shrank(std::uint32_t f, std::uint64_t end, std::string tensor) const {
    const ShardInfo& shard = _catalogue.shards[f];
    if (end < shard.data_offset) {
      return Error(Errc::io,
                   fmt::format("{}: file ended at offset {}, inside its header, while reading "
                               "tensor '{}' (expected {} bytes): the shard shrank after its "
                               "header was read",
                               shard.name, end, tensor, shard.file_bytes));
    }
    std::string reading;
    for (const TensorInfo& info : _catalogue.tensors) {
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

  [[nodiscard]] Error read_error(const ReadRequest& request) const {
    const Chunk& chunk = _plan.chunks[_slot_chunk[request.user]];
    const ShardInfo& shard = _catalogue.shards[chunk.shard];
    // The first byte that did not arrive; an O_DIRECT request may begin before the chunk.
    const std::uint64_t offset =
        std::max(request.file_offset + request.bytes_done, chunk.file_offset);
    std::string tensor = "?";
    for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
      const Piece& piece = _plan.pieces[chunk.first_piece + p];
      if (offset < chunk.file_offset + piece.chunk_offset + piece.bytes) {
        tensor = _catalogue.tensors[piece.tensor].name;
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

  // Chunks whose broadcast may be posted at once (see broadcast_stage). Two measured 1.4×
  // faster whole loads than one with 2 ranks (bench/RESULTS.md); more gave nothing more.
  // In flight at once: the one the landing stage waits on, those queued in `_to_land`, and
  // the one whose hand-over is blocked; hence `_to_land`'s capacity of this minus 2.
  static constexpr std::size_t broadcasts_in_flight = 2;
  static_assert(broadcasts_in_flight >= 2);

  asio::any_io_executor _executor;
  const Catalogue& _catalogue;
  const Plan& _plan;
  const ArenaLayout& _layout;
  Arena& _arena;
  Device& _device;
  Transport& _transport;
  const LoadOptions& _options;
  std::vector<std::uint32_t> _landed;  // pieces landed per tensor

  std::optional<detail::ShardFiles> _files;
  std::optional<detail::StagingRing> _ring;
  // Rank 0, placed over nccl: per slot, its chunk's sends on the device. Declared before
  // `_posted`, so freed after every exchange in flight has been aborted and drained.
  std::shared_ptr<Arena> _device_sends;
  std::uint64_t _device_send_slot_bytes = 0;
  std::vector<std::unique_ptr<ReadyChannel>> _ready;  // per slot
  std::vector<ReadRequest> _requests;                 // per slot
  std::vector<std::size_t> _slot_chunk;               // per slot: the chunk it holds
  std::vector<std::uint64_t> _slot_head;              // per slot: O_DIRECT bytes before it
  std::vector<const std::byte*> _slot_source;         // per slot: its chunk's first byte
  // Rank 0, a placed load over MPI: per shard, its mapping where it is sent from the page
  // cache (map_cached_shards), else null; and its mapped chunks not yet landed.
  std::vector<std::unique_ptr<detail::MappedShard>> _maps;
  std::vector<std::size_t> _mapped_left;
  std::optional<StreamingDigests> _digests;           // destination: discard
  std::vector<Clock::time_point> _read_begin;         // per slot: when its read was submitted
  const Clock::time_point _started = Clock::now();    // for LoadProgress::seconds
  std::uint64_t _bytes_landed = 0;                    // for LoadProgress::bytes_done
  std::optional<IndexChannel> _to_upload;             // slot indices, plan order
  IndexChannel _to_broadcast;                         // chunk indices, plan order
  IndexChannel _to_complete;                          // uploads queued, plan order
  std::deque<Uploading> _uploading;                   // ...their copies and slots
  std::vector<Device::Copy> _piece_copies;            // the chunk being uploaded, by piece
  IndexChannel _to_land;                              // posted chunks, plan order
  std::deque<InFlight> _posted;                       // their broadcasts, not yet landing
  std::vector<Transport::Range> _ranges;              // the chunk being broadcast
  // A placed plan (LoadOptions::placement); see set_up_placement.
  const LoadPlacement* _placement = nullptr;
  int _me = 0;
  std::vector<std::byte*> _want_data;                        // my wants' destinations
  std::vector<std::vector<std::uint32_t>> _want_tensor;      // [rank][want]: tensor
  std::vector<std::vector<std::uint8_t>> _whole;             // [rank][want]: wants it whole
  std::vector<std::vector<detail::ShardRuns>> _runs;         // [rank][want] (rank 0: all)
  std::vector<std::int32_t> _want_of_tensor;                 // my want per tensor, or -1
  std::vector<std::uint64_t> _want_left;                     // my wants' bytes to land
  std::vector<std::optional<Dtype>> _cast_to;                // my wants' casts
  std::vector<CastState> _cast;
  std::vector<std::uint8_t> _hash_received;                  // my wants hashed as they land
  std::vector<std::uint8_t> _hash_landed;                    // ...from their host memory
  std::optional<StreamingDigests> _received;
  // One thread for device read-backs of landed wants (hash_landed); declared after what its
  // tasks use, so it is stopped and joined first. `_hashing_failure` is written on that
  // thread only and read once it is joined.
  std::optional<asio::thread_pool> _hashing;
  std::exception_ptr _hashing_failure;
  std::optional<StreamingDigests> _expected;                 // rank 0, expect_digests
  std::vector<std::uint8_t> _tensor_whole_wanted;
  std::vector<std::size_t> _expected_base;
  std::vector<std::uint64_t> _expected_left;
  std::deque<HeldSlot> _held;                                // rank 0: uploaded, not posted
  std::vector<std::byte> _scratch;                           // rank 0: its own gathers
  std::vector<std::vector<std::byte>> _spare_windows;        // landed chunks' window memory
  std::vector<Transport::Message> _sends;
  std::vector<Transport::Message> _receives;
  std::unique_ptr<Reader> _reader;  // declared last: destroyed first, before the ring
  // Progress is stamped in the time this process ran: the watchdog's `timeout` leaves out
  // the stretches it was stopped.
  detail::RunningClock _running{suspended_after};
  Clock::time_point _last_progress;  // _running's time
  asio::steady_timer _watchdog_timer{_executor};
  bool _finished = false;
  std::optional<std::size_t> _landing;  // the chunk whose broadcast the landing stage awaits
  std::exception_ptr _first_failure;
  // LoadOptions::stop: the callback posts a wake-up for the watchdog, which holds `_alive`
  // weakly (a pipeline already destroyed is not touched).
  std::shared_ptr<Pipeline*> _alive = std::make_shared<Pipeline*>(this);
  std::optional<std::stop_callback<std::function<void()>>> _stop_callback;
};

// A placed load's plan, arena and destinations (result.wants, want_data, arena).
Plan plan_placed_load(LoadResult& result, Device& device, Transport& transport,
                      const LoadOptions& options) {
  const LoadPlacement& placement = *options.placement;
  const int rank = transport.rank();
  WEIGHTCAST_EXPECT(options.destination != Destination::discard, Errc::config,
                    "destination: discard keeps nothing; it cannot be combined with a placement");
  WEIGHTCAST_EXPECT(placement.all.size() == static_cast<std::size_t>(transport.world_size()) &&
                        placement.all[rank].tensors.size() == placement.mine.tensors.size(),
                    Errc::internal,
                    fmt::format("LoadPlacement: wants of {} ranks for a world of {}, this rank's "
                                "{} against {}",
                                placement.all.size(), transport.world_size(),
                                placement.mine.tensors.size(),
                                placement.all.size() > static_cast<std::size_t>(rank)
                                    ? placement.all[rank].tensors.size()
                                    : 0));
  std::vector<RankWants> checked = placement.all;
  checked[rank] = placement.mine;
  validate_wants(result.catalogue, checked);
  for (const TensorWant& want : placement.mine.tensors) {
    const TensorDestination& d = want.destination;
    WEIGHTCAST_EXPECT(!d.in_place || d.data != nullptr, Errc::config,
                      fmt::format("placement: rank {}: tensor '{}': destination.data: null for "
                                  "an in-place destination",
                                  rank, want.tensor));
    const MemoryKind device_memory =
        device.name() == "host" ? MemoryKind::host : MemoryKind::cuda;
    WEIGHTCAST_EXPECT(d.data == nullptr || d.memory == device_memory, Errc::config,
                      fmt::format("placement: rank {}: tensor '{}': destination.memory: {} "
                                  "memory, but the load's device is {}",
                                  rank, want.tensor,
                                  d.memory == MemoryKind::host ? "host" : "device",
                                  device.name()));
    WEIGHTCAST_EXPECT(d.data == nullptr || d.memory == MemoryKind::host ||
                          transport.world_size() == 1 || transport.name() == "nccl",
                      Errc::config,
                      fmt::format("placement: rank {}: tensor '{}': destination.memory: device "
                                  "memory, which transport {} cannot receive into",
                                  rank, want.tensor, transport.name()));
  }
  if (device.name() != "host") {
    // A cast runs on the host (cast_into); an arena want's destination is the device's.
    std::unordered_map<std::string_view, Dtype> dtypes;
    for (const TensorInfo& t : result.catalogue.tensors) dtypes.emplace(t.name, t.dtype);
    for (const TensorWant& want : placement.mine.tensors) {
      const auto& cast = want.destination.dtype;
      WEIGHTCAST_EXPECT(!cast || *cast == dtypes.at(want.tensor), Errc::config,
                        fmt::format("placement: rank {}: tensor '{}': destination.dtype: a cast "
                                    "from {} to {} happens in host memory; the load's device "
                                    "is {}",
                                    rank, want.tensor, dtype_name(dtypes.at(want.tensor)),
                                    dtype_name(*cast), device.name()));
    }
  }
  Plan plan = make_placed_plan(result.catalogue, placement.all, options.chunk_bytes,
                               rank == 0 ? -1 : rank);
  const WantLayout layout =
      layout_wants(result.catalogue, placement.mine, options.tensor_alignment);
  result.arena = device.allocate_arena(layout.arena_bytes);
  result.placed = true;
  result.wants = placement.mine;
  std::unordered_map<std::string_view, std::uint32_t> index_of;
  index_of.reserve(result.catalogue.tensors.size());
  for (std::uint32_t t = 0; t < result.catalogue.tensors.size(); ++t) {
    index_of.emplace(result.catalogue.tensors[t].name, t);
  }
  result.want_tensors.reserve(result.wants.tensors.size());
  for (const TensorWant& want : result.wants.tensors) {
    result.want_tensors.push_back(index_of.at(want.tensor));  // validate_wants found each
  }
  for (std::size_t w = 0; w < layout.offsets.size(); ++w) {
    const TensorDestination& d = placement.mine.tensors[w].destination;
    if (layout.offsets[w] == no_arena_offset) {
      result.want_data.push_back(d.data);
    } else {
      result.want_data.push_back(result.arena->data() == nullptr
                                     ? nullptr
                                     : result.arena->data() + layout.offsets[w]);
    }
  }
  return plan;
}

// The load on the calling coroutine's executor, which must run one handler at a time (the
// stages share the pipeline's state without locks): `load`'s own io_context, or a strand.
awaitable<LoadResult> load_serially(Catalogue catalogue, Device& device, Transport& transport,
                                    LoadOptions options) {
  auto executor = co_await asio::this_coro::executor;
  check_load_options(options);
  LoadResult result;
  result.catalogue = std::move(catalogue);
  const bool discard = options.destination == Destination::discard;
  check_destination(options.destination, transport.world_size());
  Plan plan;
  std::vector<std::byte*> want_data;
  if (options.placement) {
    plan = plan_placed_load(result, device, transport, options);
    want_data = result.want_data;
  } else {
    result.layout = layout_arena(result.catalogue, options.tensor_alignment);
    plan = make_plan(result.catalogue, result.layout, options.chunk_bytes);
    result.arena =
        discard ? make_host_arena(0) : device.allocate_arena(result.layout.arena_bytes);
  }

  // The caller's queued GPU work on the destinations comes first (LoadOptions::cuda_stream).
  device.order_after(options.cuda_stream);
  transport.order_after(options.cuda_stream);
  const auto start = Clock::now();
  Pipeline pipeline(executor, result.catalogue, plan, result.layout, *result.arena, device,
                    transport, options);
  if (options.placement) pipeline.use_destinations(std::move(want_data));
  std::exception_ptr failure;
  try {
    co_await pipeline.run();
    pipeline.finish_hashing();
  } catch (...) {
    failure = pipeline.first_failure() ? pipeline.first_failure() : std::current_exception();
  }
  result.stats.reader = pipeline.reader_name();
  result.stats.io_mode = pipeline.io_mode();
  result.digests = pipeline.digests();
  if (options.placement) {
    result.expected_digests = pipeline.expected_digests();
    result.received_digests = pipeline.received_digests();
    result.received_hashed = pipeline.received_hashed();
  }
  pipeline.shut_down();
  if (failure) std::rethrow_exception(failure);
  // The data is ready on the caller's stream (its later work runs after every write).
  device.order_before(options.cuda_stream);
  transport.order_before(options.cuda_stream);

  result.stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.stats.bytes = plan.total_bytes;
  if (result.placed) {
    result.stats.bytes = 0;
    for (std::size_t w = 0; w < result.wants.tensors.size(); ++w) {
      result.stats.bytes += local_bytes(*result.local(w).info, result.wants.tensors[w]);
    }
  }
  result.stats.chunks = plan.chunks.size();
  result.stats.staging_bytes = pipeline.staging_bytes();
  result.stats.device = std::string(device.name());
  result.stats.transport = std::string(transport.name());
  co_return result;
}

}  // namespace

awaitable<LoadResult> async_load(Catalogue catalogue, Device& device, Transport& transport,
                                 LoadOptions options) {
  // A trainer's executor may run handlers on several threads (an io_context run by a thread
  // pool): a strand of it keeps the stages to one at a time.
  co_return co_await asio::co_spawn(
      asio::make_strand(co_await asio::this_coro::executor),
      load_serially(std::move(catalogue), device, transport, std::move(options)), use_awaitable);
}

LoadResult load(Catalogue catalogue, Device& device, Transport& transport,
                const LoadOptions& options) {
  asio::io_context context(1);
  std::optional<LoadResult> result;
  std::exception_ptr failure;
  asio::co_spawn(context, load_serially(std::move(catalogue), device, transport, options),
                 [&](std::exception_ptr e, LoadResult r) {
                   if (e) {
                     failure = e;
                   } else {
                     result.emplace(std::move(r));
                   }
                 });
  context.run();
  if (failure) std::rethrow_exception(failure);
  if (!result) throw Error(Errc::internal, "the load ended without a result");
  return std::move(*result);
}

LoadResult load(const std::filesystem::path& checkpoint, const LoadOptions& options) {
  auto device = make_host_device();
  auto transport = make_local_transport();
  return load(open_checkpoint(checkpoint), *device, *transport, options);
}

std::future<LoadResult> load_async(std::filesystem::path checkpoint, LoadOptions options) {
  return std::async(std::launch::async,
                    [checkpoint = std::move(checkpoint), options = std::move(options)] {
                      return load(checkpoint, options);
                    });
}

}  // namespace weightcast
