/**
 * @file pipeline.hpp
 * @brief The pipeline of one load: the state its stages share, and the members each file of
 *        src/pipeline/ defines.
 *
 * Internal (includes Boost.Asio; never installed). One `Pipeline` runs one load's stages as
 * coroutines on one executor that runs one handler at a time (`load`'s own `io_context`, or a
 * strand for `async_load`): the stages share this state without locks. Its members are
 * defined by job:
 *
 * - `stages.cpp`: the stage coroutines (read, completion, upload, upload completion,
 *   broadcast, landing) and `run`, which joins them;
 * - `watchdog.cpp`: the watchdog (`timeout`, `LoadOptions::stop`) and the polling of
 *   operations in flight;
 * - `placed_delivery.cpp`: a placed load's delivery (each rank's wants, rank 0's sends,
 *   casts, digests);
 * - `page_cache.cpp`: rank 0's shards sent from the page cache (mapped) instead of read;
 * - `hooks.cpp`: tensors ready, stage events and progress, as the caller's hooks hear them;
 * - `read_errors.cpp`: the errors of rank 0's reads (a failed read, a shard that shrank).
 */
#pragma once

#include "weightcast/checkpoint/detail/shard_files.hpp"
#include "weightcast/core/detail/running_time.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/io/detail/mapped_shard.hpp"
#include "weightcast/io/detail/staging_ring.hpp"
#include "weightcast/io/reader.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

namespace weightcast::detail {

/// A chunk's broadcast, posted on this rank and not yet seen to complete (the chunks are
/// posted and land in plan order, so the queue's order says which chunk it is).
struct InFlight {
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
};

/// A chunk whose copies are queued on the device, not yet seen complete (upload_stage hands
/// it to upload_completion_stage).
struct Uploading {
  SlotLease lease;  ///< Empty for a placed chunk (its slot is held in `_held`).
  std::vector<std::unique_ptr<Pending>> copies;
  std::chrono::steady_clock::time_point begin;
};

/// Rank 0's slot between a placed chunk's upload (its own copies) and its sends.
struct HeldSlot {
  SlotLease lease;
  const std::byte* source = nullptr;  ///< The chunk's first byte in the slot.
  /// Transport nccl (device memory only): the bytes rank 0 sends, uploaded from the slot —
  /// the whole chunk for a broadcast, else each delivery's in plan order, packed. Null
  /// under mpi, which sends from the slot.
  std::byte* device = nullptr;
};

class Pipeline {
 public:
  using Clock = std::chrono::steady_clock;
  /// One-shot signal per staging slot: the read into it has finished.
  using ReadyChannel = boost::asio::experimental::channel<void(boost::system::error_code)>;
  /// Slot or chunk indices handed from one stage to the next, in plan order.
  using IndexChannel =
      boost::asio::experimental::channel<void(boost::system::error_code, std::size_t)>;

  /// @p executor must run one handler at a time; the references must outlive the pipeline.
  Pipeline(const boost::asio::any_io_executor& executor, const Catalogue& catalogue,
           const Plan& plan, const ArenaLayout& layout, Arena& arena, Device& device,
           Transport& transport, const LoadOptions& options);

  /// Runs the load: every stage of this rank, joined (stages.cpp).
  boost::asio::awaitable<void> run();

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
  [[nodiscard]] std::string io_mode() const;
  /// @return the streamed digests (`destination: discard`), empty otherwise.
  [[nodiscard]] std::vector<std::uint64_t> digests() const {
    return _digests ? _digests->digests() : std::vector<std::uint64_t>{};
  }

  /// Frees the reader before the ring: in-flight reads must finish before slots go away.
  void shut_down() noexcept { _reader.reset(); }
  /// Hands over the device memory the transport's sends read (rank 0's send regions of a
  /// placed load over nccl; null otherwise), so the caller can keep it past the pipeline when
  /// the transport may still touch it after a failure (`Transport::may_still_touch_memory`).
  [[nodiscard]] std::shared_ptr<Arena> take_device_sends() noexcept {
    return std::move(_device_sends);
  }

  // ---- placement (a placed plan): each rank receives exactly its wants ----

  /// Where this rank's wants land (`LoadResult::want_data`); call before `run`.
  void use_destinations(std::vector<std::byte*> want_data) { _want_data = std::move(want_data); }

  /// Rank 0, `LoadPlacement::expect_digests`: per rank, per want, the digest of what it
  /// should have received.
  [[nodiscard]] std::vector<std::vector<std::uint64_t>> expected_digests() const;
  /// Per want of this rank: whether `received_digests` holds its digest.
  [[nodiscard]] std::vector<std::uint8_t> received_hashed() const;
  /// Per want of this rank: the digest of the bytes received (hashed as they landed), or 0.
  /// Rank 0 with expected digests: its own expected ones, of the bytes it copied from.
  [[nodiscard]] std::vector<std::uint64_t> received_digests() const;
  /// Waits for the device read-backs still hashing (`hash_landed`); call after `run` and
  /// before `received_digests`. @throws what a read-back threw (`Arena::read_back`'s errors).
  void finish_hashing();

 private:
  struct CastState {
    std::uint64_t next = 0;     // the local byte expected next
    std::uint64_t carried = 0;  // bytes of a cut element in `carry`
    std::byte carry[8]{};
  };

  // ---- the stages (stages.cpp) ----
  boost::asio::awaitable<void> read_stage();
  boost::asio::awaitable<void> completion_stage();
  boost::asio::awaitable<void> upload_stage();
  boost::asio::awaitable<void> upload_completion_stage();
  boost::asio::awaitable<void> broadcast_stage();
  boost::asio::awaitable<void> landing_stage();
  boost::asio::awaitable<void> guarded(boost::asio::awaitable<void> stage);

  // ---- the watchdog and polling (watchdog.cpp) ----
  boost::asio::awaitable<void> watchdog();
  [[nodiscard]] static Error stopped();
  boost::asio::awaitable<void> wait(
      std::unique_ptr<Pending> pending,
      std::chrono::microseconds cap = std::chrono::microseconds(1000));
  [[nodiscard]] std::chrono::microseconds landing_poll_cap() const noexcept;

  // ---- a placed load's delivery (placed_delivery.cpp) ----
  void set_up_placement();

  [[nodiscard]] std::size_t expected_index(std::size_t rank, std::size_t want) const {
    return _whole[rank][want] ? _want_tensor[rank][want] : _expected_base[rank] + want;
  }
  void expect(std::size_t index, const std::byte* data, std::uint64_t bytes);
  // The chunk offset of tensor byte `tensor_byte` of piece `piece`.
  [[nodiscard]] std::uint64_t chunk_offset(const Piece& piece, std::uint64_t tensor_byte) const {
    return piece.chunk_offset + (tensor_byte - piece.tensor_offset);
  }
  const std::byte* gather(const Delivery& d, const std::byte* source,
                          std::vector<std::byte>& buffer) const;
  void cast_into(std::uint32_t w, const std::byte* data, std::uint64_t local_offset,
                 std::uint64_t bytes);
  std::unique_ptr<Pending> copy_to_mine(std::uint32_t w, const std::byte* data,
                                        std::uint64_t local_offset, std::uint64_t bytes);
  boost::asio::awaitable<void> upload_placed(std::size_t c, const std::byte* source);
  [[nodiscard]] std::uint64_t send_bytes(std::size_t c) const;
  boost::asio::awaitable<void> upload_sends(std::size_t c, HeldSlot& held);
  InFlight post_placed(std::size_t c, bool root);
  [[nodiscard]] std::uint64_t cast_bytes(std::size_t c) const;
  void placed_landed(std::size_t c, InFlight& landed);
  void hash_landed(std::uint32_t w, std::uint64_t local_offset, std::uint64_t bytes);
  void land(std::uint32_t w, std::uint64_t bytes);
  void want_ready(std::uint32_t w);

  // ---- shards sent from the page cache (page_cache.cpp) ----
  void map_cached_shards();
  [[nodiscard]] bool mapped(const Chunk& chunk) const {
    return chunk.shard < _maps.size() && _maps[chunk.shard] != nullptr;
  }
  void mapped_chunk_sent(const Chunk& chunk);

  // ---- what the caller's hooks hear (hooks.cpp) ----
  void chunk_landed(std::size_t c, Clock::time_point begin);
  void stage_event(Stage stage, std::size_t c, Clock::time_point begin) const;
  void report_progress(std::size_t c);
  void announce_zero_size_tensors();
  void tensor_ready(std::uint32_t t);

  // ---- the errors of rank 0's reads (read_errors.cpp) ----
  [[nodiscard]] Error shrank(std::uint32_t f, std::uint64_t end, std::string tensor) const;
  [[nodiscard]] Error read_error(const ReadRequest& request) const;

  [[nodiscard]] bool discarding() const noexcept {
    return _options.destination == Destination::discard;
  }

  // A buffered chunk whose pieces tile one range of a host arena is read into that range:
  // no slot, no copy. O_DIRECT chunks are staged: their aligned superset spills past them.
  [[nodiscard]] bool reads_into_arena(const Chunk& chunk) const {
    return !discarding() && !_placement && _device.reads_into_arena() &&
           chunk.arena_contiguous && _files->alignment(chunk.shard) == 1;
  }

  // How late a watchdog wake-up must be to count as time this process did not run.
  static constexpr std::chrono::milliseconds suspended_after{500};

  // How late a completed copy may be noticed: a 16 MiB H2D copy takes ~0.3 ms on PCIe 5, and
  // a 1 ms cap noticed it up to ~0.6 ms late (a slot and the chunk's broadcast held as long;
  // the copy engine meanwhile runs the chunks queued behind it). 100 µs keeps that under a
  // third of a copy for one cudaEventQuery per 100 µs. Rank 0's placed uploads still wait
  // for each copy in turn. (A host device's upload is a memcpy: nothing to poll.)
  static constexpr std::chrono::microseconds upload_poll_cap{100};

  // Of a shard's pages, the fraction resident for it to be sent from the page cache: a few
  // missing pages are read by the faults that meet them.
  static constexpr double mapped_fraction = 0.95;

  // Chunks whose broadcast may be posted at once (see broadcast_stage). Two let one chunk's
  // broadcast travel while the next is posted, so the link never idles between chunks; a
  // third finds the link busy with the first two and gains nothing (bench/RESULTS.md).
  // In flight at once: the one the landing stage waits on, those queued in `_to_land`, and
  // the one whose hand-over is blocked; hence `_to_land`'s capacity of this minus 2.
  static constexpr std::size_t broadcasts_in_flight = 2;
  static_assert(broadcasts_in_flight >= 2);

  boost::asio::any_io_executor _executor;
  const Catalogue& _catalogue;
  const Plan& _plan;
  const ArenaLayout& _layout;
  Arena& _arena;
  Device& _device;
  Transport& _transport;
  const LoadOptions& _options;
  std::vector<std::uint32_t> _landed;  // pieces landed per tensor

  std::optional<ShardFiles> _files;
  std::optional<StagingRing> _ring;
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
  std::vector<std::unique_ptr<MappedShard>> _maps;
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
  std::vector<std::vector<ShardRuns>> _runs;                 // [rank][want] (rank 0: all)
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
  std::optional<boost::asio::thread_pool> _hashing;
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
  RunningClock _running{suspended_after};
  Clock::time_point _last_progress;  // _running's time
  boost::asio::steady_timer _watchdog_timer{_executor};
  bool _finished = false;
  std::optional<std::size_t> _landing;  // the chunk whose broadcast the landing stage awaits
  std::exception_ptr _first_failure;
  // LoadOptions::stop: the callback posts a wake-up for the watchdog, which holds `_alive`
  // weakly (a pipeline already destroyed is not touched).
  std::shared_ptr<Pipeline*> _alive = std::make_shared<Pipeline*>(this);
  std::optional<std::stop_callback<std::function<void()>>> _stop_callback;
};

}  // namespace weightcast::detail
