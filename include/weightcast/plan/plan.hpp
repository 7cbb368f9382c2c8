/**
 * @file plan.hpp
 * @brief The plan: the ordered list of chunks every rank executes identically.
 *
 * A pure function of the catalogue, the arena layout and `chunk_size`, so every rank builds
 * the same plan from the same catalogue without talking (docs/DESIGN.md § Plan). Chunks follow
 * file order, shard by shard; a chunk never spans two shards; each chunk is split into
 * pieces at tensor boundaries. Zero-size tensors make no piece and no read.
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/plan/placement.hpp"

#include <cstdint>
#include <span>
#include <vector>

namespace weightcast {

/// Where each tensor lives in a rank's arena.
struct ArenaLayout {
  std::vector<std::uint64_t> tensor_offsets;  ///< Per catalogue tensor: arena offset, bytes.
  std::uint64_t arena_bytes = 0;              ///< Total arena size, bytes (≥ sum of tensors).
  std::uint64_t alignment = 1;                ///< Every tensor offset is a multiple of this.
};

/**
 * @brief Lays tensors out back to back in catalogue order, each at a multiple of @p alignment.
 * @param alignment bytes, a power of two (1 = packed: the arena mirrors the data sections,
 *        so every chunk lands in one contiguous arena range; 256 suits CUDA kernels).
 * @throws Error `internal` (70) if @p alignment is not a power of two or the arena size
 *         overflows 64 bits (names the tensor).
 */
ArenaLayout layout_arena(const Catalogue& catalogue, std::uint64_t alignment = 1);

/// The part of a chunk that lands in one tensor.
struct Piece {
  std::uint32_t tensor = 0;        ///< Catalogue tensor index.
  std::uint64_t chunk_offset = 0;  ///< Offset of the piece inside the chunk, bytes.
  std::uint64_t tensor_offset = 0; ///< Offset of the piece inside its tensor, bytes.
  std::uint64_t arena_offset = 0;  ///< Destination offset in the arena, bytes.
  std::uint64_t bytes = 0;         ///< Piece length, bytes (> 0).
};

/// ≤ `chunk_size` contiguous bytes of one shard: the unit of read, upload and broadcast.
struct Chunk {
  std::uint32_t shard = 0;        ///< Catalogue shard index.
  std::uint64_t file_offset = 0;  ///< Absolute offset of the first byte in the shard file.
  std::uint64_t bytes = 0;        ///< Length, bytes (0 < bytes ≤ chunk_size).
  std::uint64_t arena_offset = 0; ///< Arena offset of the first byte.
  bool arena_contiguous = true;   ///< True when the pieces tile [arena_offset, +bytes).
  std::uint32_t first_piece = 0;  ///< Index of the first piece in `Plan::pieces`.
  std::uint32_t piece_count = 0;  ///< Number of pieces (≥ 1).
};

/**
 * @brief The part of one chunk's piece that one rank receives (a placed plan only): its local
 *        bytes [`local_offset`, + `bytes`) of the tensor, which `detail::ShardRuns` maps to
 *        the tensor's bytes, all inside the piece. They travel as one message, packed in
 *        local order (a dim ≥ 1 slice is gathered on the root, never one message per row).
 */
struct Delivery {
  std::uint64_t local_offset = 0;  ///< Offset in the rank's local shard, bytes (wire dtype).
  std::uint64_t bytes = 0;         ///< Length, bytes (> 0).
  std::uint32_t piece = 0;         ///< Index into `Plan::pieces`: the chunk's piece of the tensor.
  std::uint32_t want = 0;          ///< Index into the receiving rank's `RankWants::tensors`.
  std::int32_t rank = 0;           ///< The receiving rank.
  std::uint32_t runs = 0;          ///< Byte runs in the chunk (1: contiguous; saturates).
};

/// The whole plan.
struct Plan {
  std::vector<Chunk> chunks;        ///< In plan order; at most `max_plan_chunks`.
  std::vector<Piece> pieces;        ///< All pieces, chunk by chunk.
  std::uint64_t total_bytes = 0;    ///< Sum of chunk sizes = sum of tensor sizes, bytes.
  std::uint64_t chunk_bytes = 0;    ///< The `chunk_size` the plan was made with, bytes.
  /// Per tensor: number of pieces (a tensor is complete when that many have landed).
  std::vector<std::uint32_t> tensor_piece_counts;

  // A placed plan (`make_placed_plan`) only; empty for `make_plan`'s.
  /// Per chunk: 1 when every rank wants every tensor of the chunk whole (one broadcast, as
  /// `make_plan`'s chunks), else 0 (point-to-point deliveries).
  std::vector<std::uint8_t> chunk_broadcast;
  /// Per chunk plus one: index of the chunk's first delivery in `deliveries` (broadcast
  /// chunks have none).
  std::vector<std::uint64_t> chunk_first_delivery;
  /// Deliveries, chunk by chunk, then piece by piece, then by rank.
  std::vector<Delivery> deliveries;
  /// @return true for a placed plan.
  [[nodiscard]] bool placed() const noexcept { return !chunk_first_delivery.empty(); }
};

/**
 * @brief The most chunks one plan may hold: 2^20 = 1,048,576.
 *
 * Every rank holds the whole plan in host memory: 48 bytes per `Chunk` and 40 per `Piece`
 * (one piece per chunk, plus one per tensor boundary inside a chunk), about 88 MiB at this
 * limit plus 40 bytes per tensor — the order of the default staging window (64 MiB). Without
 * it, `chunk_size: 1` cost about 90 bytes of every rank's RAM per checkpoint byte.
 * Checkpoints of up to `max_plan_chunks × chunk_size` bytes of tensor data fit: 16 TiB at the
 * default 16 MiB, 64 TiB at 64 MiB, 4 PiB at the 4 GiB maximum. The limit also keeps every
 * piece index within `Chunk::first_piece`'s 32 bits (see `make_plan`).
 */
inline constexpr std::uint64_t max_plan_chunks = std::uint64_t{1} << 20;

/// The most tensors a catalogue may have to be planned: `Piece::tensor` and
/// `Chunk::first_piece` are 32-bit, and a plan has fewer than tensors + chunks pieces.
inline constexpr std::uint64_t max_plan_tensors = 0xFFFF'FFFFull - max_plan_chunks;

/// How many chunks and pieces `make_plan` builds for a catalogue and a `chunk_size`.
struct PlanSize {
  std::uint64_t chunks = 0;  ///< Number of chunks (saturates at 2^64 - 1).
  std::uint64_t pieces = 0;  ///< Number of pieces (saturates at 2^64 - 1).
};

/**
 * @brief Counts the chunks and pieces `make_plan` would build, without building them.
 *
 * O(tensors) arithmetic and no allocation, so it is safe for any @p chunk_bytes and any
 * catalogue size. Does not apply the limits.
 * @param chunk_bytes `chunk_size` in bytes, > 0.
 * @throws Error `config` (78) if @p chunk_bytes is 0; `internal` (70) if a tensor's byte
 *         range ends past 2^64 (a catalogue no checkpoint or control-plane message can produce).
 */
PlanSize plan_size(const Catalogue& catalogue, std::uint64_t chunk_bytes);

/**
 * @brief The smallest `chunk_size` whose plan has at most @p max_chunks chunks.
 *
 * Each shard needs at least one chunk of its own, so none fits when the tensor data lies in
 * more than @p max_chunks shards.
 * @param max_chunks the chunk limit, ≥ 1 (`max_plan_chunks` for `make_plan`).
 * @return bytes, ≥ 1; 1 for a catalogue with no tensor data; 0 when no `chunk_size` fits.
 * @throws Error `internal` (70) as `plan_size`, and when @p max_chunks is 0.
 */
std::uint64_t min_chunk_bytes(const Catalogue& catalogue,
                              std::uint64_t max_chunks = max_plan_chunks);

/**
 * @brief Splits the catalogue into chunks of at most @p chunk_bytes.
 *
 * Counts the chunks first (`plan_size`) and refuses a plan over the limits before allocating
 * any of it. Within the limits every piece index fits the 32-bit fields: a plan has at most
 * nonzero-size tensors + chunks - 1 pieces.
 * @param chunk_bytes `chunk_size` in bytes, within `setting::chunk_size`'s bounds.
 * @throws Error `config` (78) if @p chunk_bytes is outside them (the config's message), or
 *         if the plan would have more than
 *         `max_plan_chunks` chunks — the message names `chunk_size`, the checkpoint's tensor
 *         bytes, the chunk count, the limit and the smallest `chunk_size` that fits
 *         (`min_chunk_bytes`); `invalid_checkpoint` (65) if the catalogue has more than
 *         `max_plan_tensors` tensors; `internal` (70) if the layout does not match the catalogue
 *         or a tensor's byte range ends past 2^64 (`plan_size`).
 */
Plan make_plan(const Catalogue& catalogue, const ArenaLayout& layout, std::uint64_t chunk_bytes);

/**
 * @brief The plan for a placement: `make_plan`'s chunks and pieces (file order, at most
 *        @p chunk_bytes; `Piece::arena_offset` as for a packed arena, unused: each rank maps
 *        a tensor to its own destination), each chunk either broadcast (every rank wants all of it whole) or
 *        split into `Delivery`s per receiving rank.
 *
 * A pure function of its inputs, so every rank that has every rank's wants builds the same
 * plan. Memory: one `Delivery` (32 bytes) per receiving rank per piece of a chunk not
 * broadcast; @p keep_rank ≥ 0 keeps only that rank's deliveries (a receiving rank needs no
 * other's).
 * @param wants every rank's wants, indexed by rank, validated (`validate_wants`).
 * @throws Error as `make_plan`.
 */
Plan make_placed_plan(const Catalogue& catalogue, std::span<const RankWants> wants,
                      std::uint64_t chunk_bytes, int keep_rank = -1);

/// A rank's destinations in its arena: per want (`RankWants::tensors` order) its offset, for
/// the wants whose destination is the arena (in-place ones get `no_arena_offset`).
struct WantLayout {
  std::vector<std::uint64_t> offsets;  ///< Per want: arena offset, bytes, or no_arena_offset.
  std::uint64_t arena_bytes = 0;       ///< Arena size, bytes.
};
/// `WantLayout::offsets` of a want that lands in the caller's memory.
inline constexpr std::uint64_t no_arena_offset = ~std::uint64_t{0};

/**
 * @brief Lays out the arena wants of @p wants back to back (want order), each at a multiple
 *        of @p alignment, sized in the destination dtype (`destination_bytes`).
 * @throws Error `internal` (70) as `layout_arena`; `config` (78) for a want naming no tensor.
 */
WantLayout layout_wants(const Catalogue& catalogue, const RankWants& wants,
                        std::uint64_t alignment = 1);

}  // namespace weightcast
