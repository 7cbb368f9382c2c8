/**
 * @file plan.hpp
 * @brief The plan: the ordered list of chunks every rank executes identically.
 *
 * A pure function of the catalogue, the arena layout and `chunk_size`, so every rank builds
 * the same plan from the same catalogue without talking (DESIGN.md layer 4). Chunks follow
 * file order, shard by shard; a chunk never spans two shards; each chunk is split into
 * pieces at tensor boundaries. Zero-size tensors make no piece and no read.
 */
#pragma once

#include "weightcast/checkpoint.hpp"

#include <cstdint>
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
 * @throws Error `internal` if @p alignment is not a power of two or the sum overflows.
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

/// The whole plan.
struct Plan {
  std::vector<Chunk> chunks;
  std::vector<Piece> pieces;        ///< All pieces, chunk by chunk.
  std::uint64_t total_bytes = 0;    ///< Sum of chunk sizes = sum of tensor sizes, bytes.
  std::uint64_t chunk_bytes = 0;    ///< The `chunk_size` the plan was made with, bytes.
  /// Per tensor: number of pieces (a tensor is complete when that many have landed).
  std::vector<std::uint32_t> tensor_piece_counts;
};

/**
 * @brief Splits the catalogue into chunks of at most @p chunk_bytes.
 * @param chunk_bytes `chunk_size` in bytes, > 0.
 * @throws Error `config` if @p chunk_bytes is 0; `internal` if the layout does not match.
 */
Plan make_plan(const Catalogue& catalogue, const ArenaLayout& layout, std::uint64_t chunk_bytes);

}  // namespace weightcast
