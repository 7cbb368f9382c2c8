// Planner properties: every tensor byte covered exactly once, no chunk over chunk_size,
// chunks in file order within one shard, pieces at tensor boundaries.
#include "weightcast/error.hpp"
#include "weightcast/plan.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

using namespace weightcast;

namespace {

// A random catalogue whose shards are tiled by tensors, like a valid checkpoint.
Catalogue random_catalogue(std::mt19937_64& rng) {
  Catalogue catalogue;
  const int shards = std::uniform_int_distribution<int>(1, 4)(rng);
  for (int s = 0; s < shards; ++s) {
    ShardInfo shard;
    shard.name = "shard" + std::to_string(s);
    shard.data_offset = 8 + std::uniform_int_distribution<std::uint64_t>(2, 300)(rng);
    std::uint64_t offset = shard.data_offset;
    const int tensors = std::uniform_int_distribution<int>(0, 40)(rng);
    for (int t = 0; t < tensors; ++t) {
      TensorInfo tensor;
      tensor.name = shard.name + ".t" + std::to_string(t);
      tensor.shard = static_cast<std::uint32_t>(s);
      tensor.file_offset = offset;
      // Mostly small, some zero-size, some large.
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      tensor.bytes = kind == 0   ? 0
                     : kind < 8 ? std::uniform_int_distribution<std::uint64_t>(1, 5000)(rng)
                                : std::uniform_int_distribution<std::uint64_t>(1, 200000)(rng);
      offset += tensor.bytes;
      catalogue.tensors.push_back(tensor);
    }
    shard.file_bytes = offset;
    catalogue.shards.push_back(shard);
  }
  return catalogue;
}

void check_plan(const Catalogue& catalogue, const ArenaLayout& layout, const Plan& plan,
                std::uint64_t chunk_bytes) {
  // Coverage: mark every tensor byte delivered by the plan, in file space and arena space.
  std::vector<std::vector<std::uint8_t>> seen(catalogue.tensors.size());
  for (std::size_t t = 0; t < catalogue.tensors.size(); ++t) {
    seen[t].assign(catalogue.tensors[t].bytes, 0);
  }
  std::uint64_t total = 0;
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    REQUIRE(chunk.bytes > 0);
    REQUIRE(chunk.bytes <= chunk_bytes);
    REQUIRE(chunk.piece_count >= 1);
    if (c > 0) {
      const Chunk& prev = plan.chunks[c - 1];
      REQUIRE((prev.shard < chunk.shard ||
               (prev.shard == chunk.shard && prev.file_offset + prev.bytes <= chunk.file_offset)));
    }
    std::uint64_t in_chunk = 0;
    for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
      const Piece& piece = plan.pieces[chunk.first_piece + p];
      const TensorInfo& tensor = catalogue.tensors[piece.tensor];
      REQUIRE(piece.bytes > 0);
      REQUIRE(piece.chunk_offset == in_chunk);  // pieces tile the chunk in order
      REQUIRE(tensor.shard == chunk.shard);
      REQUIRE(tensor.file_offset + piece.tensor_offset == chunk.file_offset + piece.chunk_offset);
      REQUIRE(piece.arena_offset == layout.tensor_offsets[piece.tensor] + piece.tensor_offset);
      REQUIRE(piece.tensor_offset + piece.bytes <= tensor.bytes);
      if (chunk.arena_contiguous) REQUIRE(piece.arena_offset == chunk.arena_offset + in_chunk);
      for (std::uint64_t b = 0; b < piece.bytes; ++b) ++seen[piece.tensor][piece.tensor_offset + b];
      in_chunk += piece.bytes;
    }
    REQUIRE(in_chunk == chunk.bytes);
    total += chunk.bytes;
  }
  REQUIRE(total == plan.total_bytes);
  REQUIRE(total == catalogue.total_bytes());
  for (std::size_t t = 0; t < seen.size(); ++t) {
    const auto bad = std::find_if(seen[t].begin(), seen[t].end(), [](auto n) { return n != 1; });
    INFO("tensor " << t << " byte " << (bad - seen[t].begin()));
    REQUIRE(bad == seen[t].end());
  }
}

}  // namespace

TEST_CASE("plan covers every byte exactly once for random catalogues and chunk sizes",
          "[plan]") {
  std::mt19937_64 rng(20261130);
  for (int round = 0; round < 200; ++round) {
    const Catalogue catalogue = random_catalogue(rng);
    const std::uint64_t chunk_bytes =
        std::uniform_int_distribution<std::uint64_t>(1, 70000)(rng);
    const std::uint64_t alignment = std::uint64_t{1} << std::uniform_int_distribution<int>(0, 8)(rng);
    const ArenaLayout layout = layout_arena(catalogue, alignment);
    const Plan plan = make_plan(catalogue, layout, chunk_bytes);
    INFO("round " << round << " chunk_bytes " << chunk_bytes << " alignment " << alignment);
    check_plan(catalogue, layout, plan, chunk_bytes);
    for (std::uint64_t offset : layout.tensor_offsets) REQUIRE(offset % alignment == 0);
  }
}

TEST_CASE("packed layout makes every chunk one contiguous arena range", "[plan]") {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    const Catalogue catalogue = random_catalogue(rng);
    const Plan plan = make_plan(catalogue, layout_arena(catalogue, 1), 4096);
    for (const Chunk& chunk : plan.chunks) REQUIRE(chunk.arena_contiguous);
  }
}

TEST_CASE("zero-size tensors make no piece and no read", "[plan]") {
  Catalogue catalogue;
  catalogue.shards.push_back(ShardInfo{"x", "x", 8 + 16 + 8, 24});
  catalogue.tensors.push_back(TensorInfo{"empty", Dtype::F32, {0, 4}, 0, 24, 0});
  catalogue.tensors.push_back(TensorInfo{"w", Dtype::U8, {8}, 0, 24, 8});
  const Plan plan = make_plan(catalogue, layout_arena(catalogue), 1024);
  REQUIRE(plan.chunks.size() == 1);
  REQUIRE(plan.pieces.size() == 1);
  REQUIRE(plan.pieces[0].tensor == 1);
  REQUIRE(plan.tensor_piece_counts == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE("a tensor larger than chunk_size spans several chunks", "[plan]") {
  Catalogue catalogue;
  catalogue.shards.push_back(ShardInfo{"x", "x", 8 + 8 + 10000, 16});
  catalogue.tensors.push_back(TensorInfo{"big", Dtype::U8, {10000}, 0, 16, 10000});
  const Plan plan = make_plan(catalogue, layout_arena(catalogue), 4096);
  REQUIRE(plan.chunks.size() == 3);
  REQUIRE(plan.chunks[2].bytes == 10000 - 2 * 4096);
  REQUIRE(plan.tensor_piece_counts[0] == 3);
}

TEST_CASE("chunk_size 0 and a non power of two alignment are refused", "[plan]") {
  Catalogue catalogue;
  REQUIRE_THROWS_AS(make_plan(catalogue, layout_arena(catalogue), 0), Error);
  REQUIRE_THROWS_AS(layout_arena(catalogue, 3), Error);
}
