// Planner properties: every tensor byte covered exactly once, no chunk over chunk_size,
// chunks in file order within one shard, pieces at tensor boundaries.
#include "weightcast/core/error.hpp"
#include "weightcast/plan/plan.hpp"

#include "support/expect_error.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <random>

using namespace weightcast;
using Catch::Matchers::Contains;
using weightcast::test::expect_error;

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

// A checkpoint that exists only as a catalogue (no file, no data): @p shards shards, each
// tiled by @p tensors_per_shard tensors of @p tensor_bytes bytes.
Catalogue huge_catalogue(int shards, int tensors_per_shard, std::uint64_t tensor_bytes) {
  Catalogue catalogue;
  for (int s = 0; s < shards; ++s) {
    const std::string name = "model-" + std::to_string(s) + ".safetensors";
    std::uint64_t offset = 8 + 4096;
    for (int t = 0; t < tensors_per_shard; ++t) {
      catalogue.tensors.push_back(TensorInfo{name + ".t" + std::to_string(t), Dtype::BF16,
                                             {tensor_bytes / 2}, static_cast<std::uint32_t>(s),
                                             offset, tensor_bytes});
      offset += tensor_bytes;
    }
    catalogue.shards.push_back(ShardInfo{name, name, offset, 8 + 4096});
  }
  return catalogue;
}

}  // namespace

TEST_CASE("plan_size counts what make_plan builds, min_chunk_bytes is the smallest that fits",
          "[plan]") {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 300; ++round) {
    const Catalogue catalogue = random_catalogue(rng);
    const std::uint64_t chunk_bytes =
        std::uniform_int_distribution<std::uint64_t>(1, 70000)(rng);
    const ArenaLayout layout = layout_arena(catalogue, 1);
    const Plan plan = make_plan(catalogue, layout, chunk_bytes);
    const PlanSize size = plan_size(catalogue, chunk_bytes);
    INFO("round " << round << " chunk_bytes " << chunk_bytes);
    REQUIRE(size.chunks == plan.chunks.size());
    REQUIRE(size.pieces == plan.pieces.size());

    const std::uint64_t limit = std::uniform_int_distribution<std::uint64_t>(1, 300)(rng);
    const std::uint64_t fits = min_chunk_bytes(catalogue, limit);
    const std::uint64_t shards_with_data =
        plan_size(catalogue, std::numeric_limits<std::uint64_t>::max()).chunks;
    INFO("limit " << limit << " fits " << fits);
    if (catalogue.total_bytes() == 0) {
      REQUIRE(fits == 1);
    } else if (shards_with_data > limit) {
      REQUIRE(fits == 0);
    } else {
      REQUIRE(fits >= 1);
      REQUIRE(plan_size(catalogue, fits).chunks <= limit);
      if (fits > 1) REQUIRE(plan_size(catalogue, fits - 1).chunks > limit);
    }
  }
}

TEST_CASE("chunk_size 1 on a 100 TB checkpoint is refused before the plan is built", "[plan]") {
  // 8 shards of 12.5 TB: 1e14 one-byte chunks would be ~9 PB of plan on every rank.
  const Catalogue catalogue = huge_catalogue(8, 125, 100'000'000'000);
  const ArenaLayout layout = layout_arena(catalogue);
  const Error e = expect_error([&] { make_plan(catalogue, layout, 1); });
  CHECK(e.code() == Errc::config);
  CHECK(exit_status(e.code()) == 78);
  // Each shard needs ceil(12.5e12 / c) ≤ 2^20 / 8 chunks: c ≥ 95367431.6.
  CHECK(std::string(e.what()) ==
        "chunk_size 1 (1 B) would split the checkpoint's 100000000000000 bytes (90.95 TiB) of "
        "tensor data into 100000000000000 chunks, over the limit of 1048576 chunks per plan "
        "(every rank holds the plan in memory); set chunk_size to at least 95367432 "
        "(90.95 MiB)");
  CHECK(min_chunk_bytes(catalogue) == 95367432);
  CHECK(plan_size(catalogue, 95367432).chunks <= max_plan_chunks);
  CHECK(plan_size(catalogue, 95367431).chunks > max_plan_chunks);
  // The default 16 MiB does not fit 100 TB either; 128 MiB does.
  CHECK_THAT(expect_error([&] { make_plan(catalogue, layout, 16ull << 20); }).what(),
             Contains("chunk_size 16777216 (16 MiB)") && Contains("5960472 chunks"));
  CHECK(plan_size(catalogue, 128ull << 20).chunks == 8 * 93133);
}

TEST_CASE("a 2 TiB checkpoint plans at the default chunk_size", "[plan]") {
  // 40 shards of 50 tensors of 1 GiB: like the largest open checkpoints (~1-2 TB in BF16).
  const Catalogue catalogue = huge_catalogue(40, 50, 1ull << 30);
  REQUIRE(catalogue.total_bytes() == 2000ull << 30);
  const Plan plan = make_plan(catalogue, layout_arena(catalogue), 16ull << 20);
  CHECK(plan.chunks.size() == 2000 * 64);
  CHECK(plan.pieces.size() == 2000 * 64);
  CHECK(plan.total_bytes == catalogue.total_bytes());
}

TEST_CASE("exactly max_plan_chunks chunks are planned, one more is refused", "[plan]") {
  // 16 TiB at 16 MiB is exactly 2^20 chunks (~88 MiB of plan); one more byte makes 2^20 + 1.
  Catalogue catalogue = huge_catalogue(1, 16, 1ull << 40);
  Plan plan = make_plan(catalogue, layout_arena(catalogue), 16ull << 20);
  CHECK(plan.chunks.size() == max_plan_chunks);
  CHECK(plan.pieces.size() == max_plan_chunks);
  CHECK(plan.chunks.back().first_piece == max_plan_chunks - 1);
  plan = Plan{};

  const std::uint64_t end = catalogue.shards[0].file_bytes;
  catalogue.tensors.push_back(TensorInfo{"one.more", Dtype::U8, {1}, 0, end, 1});
  catalogue.shards[0].file_bytes = end + 1;
  const Error e = expect_error([&] { make_plan(catalogue, layout_arena(catalogue), 16ull << 20); });
  CHECK(e.code() == Errc::config);
  CHECK_THAT(e.what(), Contains("chunk_size 16777216 (16 MiB)") &&
                           Contains("17592186044417 bytes") && Contains("1048577 chunks") &&
                           Contains("limit of 1048576 chunks") &&
                           Contains("at least 16777217 (16.00 MiB)"));
}

TEST_CASE("no chunk_size fits when more shards than max_plan_chunks hold data", "[plan]") {
  // A million one-byte shards (~170 MB of catalogue here; a real one would be a million
  // files): each needs a chunk of its own whatever chunk_size is.
  Catalogue catalogue;
  catalogue.shards.resize(max_plan_chunks + 1, ShardInfo{"", "", 9, 8});
  catalogue.tensors.resize(max_plan_chunks + 1, TensorInfo{"", Dtype::U8, {}, 0, 8, 1});
  for (std::uint32_t s = 0; s < catalogue.tensors.size(); ++s) catalogue.tensors[s].shard = s;
  CHECK(min_chunk_bytes(catalogue) == 0);
  CHECK_THAT(expect_error([&] { make_plan(catalogue, layout_arena(catalogue), 4ull << 30); })
                 .what(),
             Contains("1048577 chunks") && Contains("no chunk_size fits") &&
                 Contains("1048577 shards"));
}

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
