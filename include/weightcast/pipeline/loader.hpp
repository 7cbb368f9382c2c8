/**
 * @file loader.hpp
 * @brief Loading a checkpoint: the read, upload and broadcast stages run together.
 *
 * ```
 * rank 0:  disk ─io_uring─▶ staging slot ─upload─▶ arena ─broadcast─▶ ranks 1..N-1
 * ```
 * The stages are C++20 coroutines on one Boost.Asio `io_context` (docs/DESIGN.md § Pipeline):
 * chunk k is broadcast while chunk k+1 is uploaded and chunks k+2.. are read. Up to two
 * chunks' broadcasts are in flight; each lands (its tensors become ready) as soon as this rank
 * sees it complete, not when the next chunk is posted. A staging slot returns to the ring only
 * when its upload has completed, so rank 0's host memory beyond the arena stays
 * `chunk_size × buffer_depth`. Ranks other than 0 run only the broadcast stage and allocate
 * no staging.
 *
 * The blocking `load()` is for callers that do not use Asio; `weightcast/pipeline/async_load.hpp`
 * has the coroutine form for callers that do.
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/plan/placement.hpp"
#include "weightcast/plan/plan.hpp"
#include "weightcast/transport/transport.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast {

/// A tensor that has landed: a view into the arena (host or device memory).
struct TensorView {
  const TensorInfo* info = nullptr;  ///< Name, dtype, shape, bytes (owned by the result).
  std::byte* data = nullptr;         ///< First byte in the arena; null for a zero-size tensor.
  MemoryKind memory = MemoryKind::host;  ///< Whether `data` is a host or a device address.
  /// A placed load: the local shard this rank received (offset, shape, destination dtype),
  /// owned by the result or the `LoadPlacement`; `data` holds its local bytes. Null: the whole
  /// tensor in the checkpoint's dtype.
  const TensorWant* want = nullptr;
};

/**
 * @brief A placed load's wants (placement.hpp): what every rank receives, and this rank's
 *        destinations.
 *
 * In a job, each rank computes `mine` (from the config's rules, `resolve_placement`, or the
 * caller's in-place destinations), rank 0 gathers and validates every rank's
 * (`validate_wants`) and sends them all back, so every rank builds the same plan
 * (`make_placed_plan`). At world size 1, `all` is `{mine}`.
 */
struct LoadPlacement {
  std::vector<RankWants> all;  ///< Every rank's wants, indexed by rank (pointers not needed).
  RankWants mine;              ///< This rank's wants, in the order of `all[rank]`, with the
                               ///< in-place destinations' pointers.
  /// Rank 0: hash every rank's local bytes as they pass (`LoadResult::expected_digests`),
  /// for `verify: digest`.
  bool expect_digests = false;
};

/// A stage of the pipeline, as reported to `LoadOptions::on_stage_event`.
enum class Stage : std::uint8_t {
  read,       ///< Rank 0: a chunk's read, from its submission to its completion signal.
  upload,     ///< Rank 0: a chunk's copy from its staging slot into the arena.
  broadcast,  ///< Every rank: a chunk's broadcast from rank 0's arena, from its post on this
              ///< rank to this rank seeing it complete (polled, so up to ~1 ms late; two
              ///< chunks' broadcasts may be in flight at once).
};

/// @return "read", "upload" or "broadcast".
std::string_view to_string(Stage stage) noexcept;

/// One stage's work on one chunk: the unit of a pipeline trace (`weightcast/pipeline/trace.hpp`).
struct StageEvent {
  Stage stage = Stage::read;
  std::uint64_t chunk = 0;   ///< Index into the plan's chunks.
  std::uint32_t shard = 0;   ///< Index into the catalogue's shards.
  std::uint64_t bytes = 0;   ///< The chunk's bytes.
  std::chrono::steady_clock::time_point begin;  ///< When the stage started on the chunk.
  std::chrono::steady_clock::time_point end;    ///< When it finished (≥ begin).
};

/// How far a load has come on this rank, as reported to `LoadOptions::on_progress`.
struct LoadProgress {
  std::uint64_t bytes_done = 0;     ///< Tensor bytes broadcast (landed on this rank) so far.
  std::uint64_t bytes_total = 0;    ///< Tensor bytes of the whole plan.
  std::uint64_t chunks_done = 0;    ///< Chunks landed so far.
  std::uint64_t chunks_total = 0;   ///< Chunks in the plan.
  std::uint32_t shard = 0;          ///< Shard of the chunk that just landed.
  std::uint32_t shards = 0;         ///< Shards in the catalogue.
  std::string_view shard_name;      ///< Its file name; valid only during the call.
  double seconds = 0;               ///< Since the pipeline started.
};

/// Tuning and hooks of one load. Defaults and bounds are the settings registry's
/// (core/settings.hpp), which `configs/default.yaml` restates.
struct LoadOptions {
  /// `chunk_size`: bytes per chunk.
  std::uint64_t chunk_bytes = static_cast<std::uint64_t>(setting::chunk_size.default_value);
  /// Staging slots on rank 0.
  std::uint32_t buffer_depth = static_cast<std::uint32_t>(setting::buffer_depth.default_value);
  /// Reads in flight.
  std::uint32_t io_depth = static_cast<std::uint32_t>(setting::io_depth.default_value);
  /// No stage may make no progress longer.
  std::chrono::milliseconds timeout{setting::timeout.default_value};
  /// Arena offset alignment, bytes (a power of 2): setting::tensor_alignment_packed, or what
  /// the entry point's views want (core/settings.hpp).
  std::uint64_t tensor_alignment = setting::tensor_alignment_packed;
  /// `direct_io`: O_DIRECT reads (aligned supersets of each chunk) on `on`; buffered on
  /// `off`; on `auto`, buffered for a shard mostly in the page cache or on a filesystem that
  /// refuses O_DIRECT (one notice), else O_DIRECT.
  DirectIo direct_io = default_choice<DirectIo>(setting::direct_io);
  /// `reader`: io_uring, a pread thread pool, or auto (io_uring, else pread with a warning).
  ReaderKind reader = default_choice<ReaderKind>(setting::reader);
  /// `destination`: `arena`, or `discard`: no arena; each tensor's XXH3-64 is computed as its
  /// bytes pass through the staging ring (`LoadResult::digests`). World size 1 only.
  Destination destination = default_choice<Destination>(setting::destination);
  /// With `destination: discard`: hash each tensor as it passes (true), or only read it
  /// (false, `verify: none`: `LoadResult::digests` stays empty; what is left is the read
  /// stage alone). Ignored for `arena`, whose digests the caller computes from the arena.
  bool digest_discarded = true;
  /// Called on the loader's thread once each tensor has fully landed on this rank (zero-size
  /// tensors first). Must not block for long (it stalls the pipeline). An exception it throws
  /// fails the load as a failed read does (the stages stop, reads in flight are waited for)
  /// and leaves `load` as it was thrown; the same holds for `on_progress` and
  /// `on_stage_event`.
  std::function<void(const TensorView&)> on_tensor_ready;
  /// Called on the loader's thread after each chunk has landed on this rank (its broadcast
  /// completed), in plan order; never for a plan of no chunks (only zero-size tensors).
  /// Keep it cheap (rate-limit any printing).
  std::function<void(const LoadProgress&)> on_progress;
  /// Called on the loader's thread when a stage finishes a chunk (one call per chunk per
  /// stage this rank runs). Keep it cheap: its time counts in the stage.
  std::function<void(const StageEvent&)> on_stage_event;
  /// Stops the load early: once a stop is requested on its `std::stop_source` (from any
  /// thread; e.g. a signal-waiting thread on SIGINT), the load cancels its stages, waits for
  /// the reads already in flight, and throws `Error` `interrupted` (130) within milliseconds
  /// (a blocked `on_*` hook delays it). Requested before the load starts, the load throws at
  /// once. A default token never stops. A broadcast in flight cannot be cancelled under
  /// `mpi`: as on any failure, the process must then exit soon (`make_mpi_transport`).
  std::stop_token stop;
  /// Placement: null (the default) loads every tensor whole into every rank's arena, with
  /// one broadcast per chunk. Otherwise each rank receives exactly its wants: chunks every
  /// rank wants whole are broadcast, the rest go point to point (`Transport::exchange`;
  /// `mpi` only, host memory), each rank's slices packed on rank 0 (a strided slice is
  /// gathered there, one message per rank and chunk). Rank 0 reads every chunk into its
  /// staging ring and keeps the slot until the chunk's sends complete: its host memory beyond
  /// its own wants stays `chunk_size × buffer_depth` plus one packed copy of the strided
  /// slices of the (at most three) chunks in flight; other ranks hold their own wants
  /// only, plus a receive window of a chunk's bytes for a cast.
  std::shared_ptr<const LoadPlacement> placement;
  /// The caller's CUDA stream on the load's device (`CallerStream::none()`, the default:
  /// order nothing), for a load into memory the caller's GPU work also uses (torch's current
  /// stream: kernels still queued on the destinations, such as `init_weights()` after
  /// `to_empty()`, or an allocator block just freed by such work). Set it with
  /// `CallerStream::from_handle(stream)`: a handle of 0 is CUDA's default stream, which is
  /// ordered too (the legacy default stream). The device's copy stream and the nccl
  /// transport's comm stream wait on an event recorded on it before the load's first write,
  /// and, once the load succeeded, it waits on an event recorded on each of them after their
  /// last write (DLPack's stream contract: the data is ready on the caller's stream). Ignored
  /// by the host device and the local and mpi transports. `cudaStreamPerThread` is refused
  /// (78, `check_load_options`): it names the default stream of whichever thread uses it,
  /// and the load orders itself from its own thread.
  CallerStream cuda_stream;
};

/// What a load measured.
struct LoadStats {
  std::uint64_t bytes = 0;          ///< Tensor bytes delivered to this rank.
  std::uint64_t chunks = 0;         ///< Chunks in the plan.
  double seconds = 0;               ///< Wall time of the pipeline (files open to last byte).
  std::uint64_t staging_bytes = 0;  ///< Host memory of the staging ring (0 off rank 0).
  std::string reader;               ///< Read back end, e.g. "io_uring" ("" off rank 0).
  /// How rank 0 read: "direct" (O_DIRECT), "buffered", or "direct+buffered"; "mapped" where
  /// a placed load over MPI sent every shard from the page cache, "…+mapped" where it sent
  /// some so (docs/DESIGN.md § Placement); "" off rank 0.
  std::string io_mode;
  std::string device;               ///< "host" or "cuda:N".
  std::string transport;            ///< "local", "mpi", "nccl", "tcp" or "shm".
  /// `transport: shm` only, the same on every rank: "local" where each rank read its own
  /// boxes from the shard files (they were in the page cache and every local rank could open
  /// them), "ring" where rank 0 read every byte into the node ring and each rank copied its
  /// boxes out of it (docs/DESIGN.md § Staging); "" for other transports.
  std::string node_reads;
  /// @return bytes / seconds in GB/s (1 GB = 1e9 B), 0 when nothing was timed.
  [[nodiscard]] double gbps() const noexcept { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

/// The loaded checkpoint: the catalogue, the arena holding every tensor, and statistics.
struct LoadResult {
  Catalogue catalogue;
  ArenaLayout layout;
  std::shared_ptr<Arena> arena;  ///< Keeps the tensor memory alive; views point into it.
  LoadStats stats;
  /// `destination: discard` only: each tensor's XXH3-64 (catalogue order), computed as its
  /// bytes streamed past; the arena is then empty. Empty otherwise.
  std::vector<std::uint64_t> digests;

  // A placed load (`LoadOptions::placement`) only.
  bool placed = false;  ///< True for a placed load.
  /// This rank's wants: what it received, in the order it asked (empty otherwise).
  RankWants wants;
  /// Per want: its tensor's index in `catalogue`.
  std::vector<std::uint32_t> want_tensors;
  /// Per want: its local bytes (the arena, or the caller's in-place memory).
  std::vector<std::byte*> want_data;
  /// Per want: XXH3-64 of the bytes received, checkpoint dtype, taken as they landed — for
  /// wants whose destination cannot be hashed afterwards in the checkpoint's dtype (a cast;
  /// with `LoadPlacement::expect_digests`, device memory outside the arena), and, with
  /// `expect_digests`, for host memory, hashed right after each chunk landed; 0 for the
  /// others (`local_digests`).
  /// Rank 0 with `expect_digests` hashes its own wants once, in its staging ring, before it
  /// copies them within its own process: its entries are its `expected_digests[0]`.
  std::vector<std::uint64_t> received_digests;
  /// Per want: 1 where `received_digests` holds its digest.
  std::vector<std::uint8_t> received_hashed;
  /// Rank 0 with `LoadPlacement::expect_digests`: per rank, per want, XXH3-64 of the local
  /// bytes it should have received (checkpoint dtype, row-major contiguous). With local reads
  /// over the node ring (`LoadStats::node_reads` "local") only rank 0's own row: every other
  /// rank hashed its own (`self_expected_digests`).
  std::vector<std::vector<std::uint64_t>> expected_digests;
  /// A rank other than 0 with `LoadPlacement::expect_digests` and local reads: per want,
  /// XXH3-64 of the bytes it should have (checkpoint dtype, row-major contiguous), hashed as
  /// it read them from the files, for rank 0 to compare with `received_digests`. Empty
  /// otherwise.
  std::vector<std::uint64_t> self_expected_digests;

  /// @return tensor @p index (catalogue order). Not for a placed load (use `local`).
  /// @throws std::out_of_range.
  [[nodiscard]] TensorView tensor(std::size_t index) const;
  /// @return the tensor named @p name, or nullopt (a placed load: its local shard).
  [[nodiscard]] std::optional<TensorView> find(std::string_view name) const;
  /// @return a placed load's want @p index (`wants` order). @throws std::out_of_range.
  [[nodiscard]] TensorView local(std::size_t index) const;
};

/**
 * @brief Per want of a placed load (`LoadResult::wants` order), XXH3-64 of the local bytes
 *        received, in the checkpoint's dtype, row-major contiguous — what rank 0's
 *        `expected_digests` says this rank should have.
 * @throws Error as `Arena::read_back`; `usage` (64) for a want in device memory outside the
 *         arena of a load without `LoadPlacement::expect_digests`, which was not hashed.
 */
std::vector<std::uint64_t> local_digests(const LoadResult& result);

/**
 * @brief Checks that @p destination suits a world of @p world_size ranks: `discard` keeps
 *        nothing on rank 0, so there is nothing to broadcast, and it needs world size 1.
 *        `load` checks this; a launcher calls it before any rendezvous, so that the other
 *        ranks do not wait for a peer that fails at once.
 * @throws Error `config` (78) naming the world size when `discard` meets world size > 1.
 */
void check_destination(Destination destination, int world_size);

/**
 * @brief Checks @p options against the bounds the config enforces for the same keys (the
 *        settings registry's: `setting::chunk_size`, `buffer_depth`, `io_depth`, `timeout`),
 *        and `tensor_alignment` a power of two up to 1 GiB. Every load calls it first.
 * @throws Error `config` (78) naming the field and its setting, then the value and bounds
 *         in the words the config uses for the same value ("LoadOptions::chunk_bytes:
 *         chunk_size: '0' is out of range (must be more than 0 and at most 4GiB)").
 */
void check_load_options(const LoadOptions& options);

/**
 * @brief Loads @p catalogue into an arena on @p device, broadcasting over @p transport.
 *
 * Rank 0 (`transport.rank() == 0`) opens the shard files and reads them; other ranks only
 * receive. Blocks until every tensor has landed on this rank.
 *
 * @throws Error `config` (78) for options out of bounds (check_load_options), or a
 *         `chunk_bytes` that would cut the checkpoint into more than 2^20 chunks (names the
 *         smallest that fits); `missing_input` (66) when a shard is gone or is no longer a
 *         regular file; `io` (74) when a read fails or a shard shrank or changed since its
 *         header was read (names file, offset, tensor); `unavailable` (69) when
 *         `ReaderKind::uring` is asked for where io_uring is refused, or the arena cannot be
 *         mapped; `timeout` (75) when no stage made progress for `options.timeout`;
 *         `interrupted` (130) when `options.stop` was requested; whatever the device,
 *         transport or a `LoadOptions` hook throw.
 */
LoadResult load(Catalogue catalogue, Device& device, Transport& transport,
                const LoadOptions& options = {});

/**
 * @brief Opens @p checkpoint and loads it into host memory on this process (world size 1).
 * @throws Error as `open_checkpoint` and the general `load` do.
 */
LoadResult load(const std::filesystem::path& checkpoint, const LoadOptions& options = {});

/// `load(checkpoint, options)` on a thread of its own; the future holds the result or error.
/// As with every `std::async` future, destroying it waits for the load to end: to give up
/// early, request a stop on `options.stop` first (the load then ends within milliseconds).
std::future<LoadResult> load_async(std::filesystem::path checkpoint, LoadOptions options = {});

}  // namespace weightcast
