#include "weightcast/plan.hpp"

#include "weightcast/error.hpp"

#include <fmt/core.h>

namespace weightcast {

ArenaLayout layout_arena(const Catalogue& catalogue, std::uint64_t alignment) {
  WEIGHTCAST_EXPECT(alignment != 0 && (alignment & (alignment - 1)) == 0, Errc::internal,
                    fmt::format("arena alignment {} is not a power of two", alignment));
  ArenaLayout layout;
  layout.alignment = alignment;
  layout.tensor_offsets.reserve(catalogue.tensors.size());
  std::uint64_t offset = 0;
  for (const auto& tensor : catalogue.tensors) {
    std::uint64_t aligned = (offset + alignment - 1) & ~(alignment - 1);
    WEIGHTCAST_EXPECT(aligned >= offset && aligned + tensor.bytes >= aligned, Errc::internal,
                      fmt::format("arena size overflows 64 bits at tensor '{}'", tensor.name));
    layout.tensor_offsets.push_back(aligned);
    offset = aligned + tensor.bytes;
  }
  layout.arena_bytes = offset;
  return layout;
}

Plan make_plan(const Catalogue& catalogue, const ArenaLayout& layout,
               std::uint64_t chunk_bytes) {
  WEIGHTCAST_EXPECT(chunk_bytes > 0, Errc::config, "chunk_size must be greater than 0");
  WEIGHTCAST_EXPECT(layout.tensor_offsets.size() == catalogue.tensors.size(), Errc::internal,
                    "arena layout does not match the catalogue");
  Plan plan;
  plan.chunk_bytes = chunk_bytes;
  plan.tensor_piece_counts.assign(catalogue.tensors.size(), 0);

  Chunk* open = nullptr;  // the chunk being filled, if any
  for (std::uint32_t t = 0; t < catalogue.tensors.size(); ++t) {
    const TensorInfo& tensor = catalogue.tensors[t];
    std::uint64_t done = 0;
    while (done < tensor.bytes) {
      const std::uint64_t file_offset = tensor.file_offset + done;
      const std::uint64_t arena_offset = layout.tensor_offsets[t] + done;
      // A new chunk starts at a shard change, when the open one is full, or where the bytes
      // are not contiguous in the file (never within a valid shard, which has no holes).
      if (open == nullptr || open->shard != tensor.shard || open->bytes == chunk_bytes ||
          open->file_offset + open->bytes != file_offset) {
        plan.chunks.push_back(Chunk{tensor.shard, file_offset, 0, arena_offset, true,
                                    static_cast<std::uint32_t>(plan.pieces.size()), 0});
        open = &plan.chunks.back();
      }
      const std::uint64_t take = std::min(tensor.bytes - done, chunk_bytes - open->bytes);
      if (arena_offset != open->arena_offset + open->bytes) open->arena_contiguous = false;
      plan.pieces.push_back(Piece{t, open->bytes, done, arena_offset, take});
      ++open->piece_count;
      ++plan.tensor_piece_counts[t];
      open->bytes += take;
      plan.total_bytes += take;
      done += take;
    }
  }
  return plan;
}

}  // namespace weightcast
