// Placed loads on one rank: every local shard lands bit-exact against slicing the file's
// bytes independently, whatever the chunking and read mode; in-place destinations and casts
// at the receiver; bad wants refused before any read.
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"

#include "support/expect_error.hpp"
#include "support/paths.hpp"
#include "support/typed_checkpoint.hpp"

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>

using namespace weightcast;
using Catch::Matchers::Contains;
using weightcast::test::expect_error;
using weightcast::test::TempDir;
using weightcast::test::TypedTensor;

namespace {

const std::vector<TypedTensor> tensors = {
    {"embed", "BF16", {37, 24}},   {"scalar", "F32", {}},       {"empty", "F16", {0, 5}},
    {"cube", "F32", {5, 6, 7}},    {"bias", "BF16", {11}},      {"proj", "F64", {9, 13}},
    {"bytes", "U8", {1000}},
};

LoadResult load_placed(const std::filesystem::path& path, RankWants mine,
                       std::uint64_t chunk_bytes, DirectIo direct_io) {
  auto placement = std::make_shared<LoadPlacement>();
  placement->all = {mine};
  placement->mine = std::move(mine);
  placement->expect_digests = true;
  LoadOptions options;
  options.chunk_bytes = chunk_bytes;
  options.buffer_depth = 3;
  options.direct_io = direct_io;
  options.placement = placement;
  auto device = make_host_device();
  auto transport = make_local_transport();
  return load(open_checkpoint(path), *device, *transport, options);
}

}  // namespace

TEST_CASE("a placed load on one rank lands every local shard bit-exact - any chunking",
          "[placement][loader]") {
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = test::write_typed_checkpoint(path, tensors, 18);
  RankWants mine;
  mine.tensors.push_back({"cube", {1, 2, 0}, {3, 3, 7}, {}});  // dims 0 and 1 sliced
  mine.tensors.push_back({"embed", {0, 5}, {37, 9}, {}});      // a dim-1 slice: strided
  mine.tensors.push_back({"scalar", {}, {}, {}});
  mine.tensors.push_back({"empty", {0, 1}, {0, 2}, {}});
  mine.tensors.push_back({"bias", {8}, {3}, {}});
  mine.tensors.push_back({"proj", {}, {}, {}});
  mine.tensors.push_back({"bytes", {999}, {0}, {}});  // an empty local shard at the end
  // "bytes" asked empty and nothing else of it: the tensor skipped in practice.
  for (const std::uint64_t chunk : {1ull, 7ull, 64ull, 1000ull, 1ull << 20}) {
    for (const DirectIo mode : {DirectIo::off, DirectIo::on}) {
      INFO("chunk_size " << chunk << (mode == DirectIo::on ? " O_DIRECT" : " buffered"));
      const LoadResult result = load_placed(path, mine, chunk, mode);
      REQUIRE(result.placed);
      REQUIRE(result.wants.tensors.size() == mine.tensors.size());
      const auto digests = local_digests(result);
      REQUIRE(result.expected_digests.size() == 1);
      std::uint64_t total = 0;
      for (std::size_t w = 0; w < mine.tensors.size(); ++w) {
        INFO("tensor " << mine.tensors[w].tensor);
        const TensorWant& wanted = mine.tensors[w];
        const std::string expected =
            expected_local(tensors, datas, wanted.tensor, wanted.offset, wanted.shape);
        const TensorView view = result.local(w);
        REQUIRE(local_bytes(*view.info, *view.want) == expected.size());
        if (!expected.empty()) {
          REQUIRE(std::memcmp(view.data, expected.data(), expected.size()) == 0);
        }
        REQUIRE(digests[w] == xxh3_64(expected.data(), expected.size()));
        REQUIRE(result.expected_digests[0][w] == digests[w]);
        total += expected.size();
      }
      REQUIRE(result.stats.bytes == total);
    }
  }
}

TEST_CASE("in-place destinations - with casts at the receiver - even across chunk cuts",
          "[placement][loader]") {
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = test::write_typed_checkpoint(path, tensors, 19);
  // embed rows 10..19 as F32 (BF16 in the file), cube whole as BF16 (F32 in the file), bias
  // in place in its own dtype.
  std::vector<float> embed(10 * 24, -1.0f);
  std::vector<std::uint16_t> cube(5 * 6 * 7, 0xFFFF);
  std::vector<std::uint16_t> bias(11 + 3, 0xABCD);  // 3 spare elements stay untouched
  RankWants mine;
  TensorWant e{"embed", {10, 0}, {10, 24}, {}};
  e.destination.data = reinterpret_cast<std::byte*>(embed.data());
  e.destination.capacity_bytes = embed.size() * 4;
  e.destination.dtype = Dtype::F32;
  TensorWant c{"cube", {}, {}, {}};
  c.destination.data = reinterpret_cast<std::byte*>(cube.data());
  c.destination.capacity_bytes = cube.size() * 2;
  c.destination.dtype = Dtype::BF16;
  TensorWant b{"bias", {}, {}, {}};
  b.destination.data = reinterpret_cast<std::byte*>(bias.data());
  b.destination.capacity_bytes = bias.size() * 2;
  mine.tensors = {e, c, b};
  for (const std::uint64_t chunk : {3ull, 5ull, 4096ull}) {
    INFO("chunk_size " << chunk);
    std::fill(embed.begin(), embed.end(), -1.0f);
    const LoadResult result = load_placed(path, mine, chunk, DirectIo::off);
    REQUIRE(result.arena->bytes() == 0);  // everything in place: no arena
    const std::string embed_wire = expected_local(tensors, datas, e.tensor, e.offset, e.shape);
    std::vector<float> embed_expected(10 * 24);
    cast_elements(Dtype::BF16, Dtype::F32, reinterpret_cast<const std::byte*>(embed_wire.data()),
                  reinterpret_cast<std::byte*>(embed_expected.data()), 240);
    REQUIRE(std::memcmp(embed.data(), embed_expected.data(), 240 * 4) == 0);
    std::vector<std::uint16_t> cube_expected(210);
    cast_elements(Dtype::F32, Dtype::BF16, reinterpret_cast<const std::byte*>(datas[3].data()),
                  reinterpret_cast<std::byte*>(cube_expected.data()), 210);
    REQUIRE(std::memcmp(cube.data(), cube_expected.data(), 210 * 2) == 0);
    REQUIRE(std::memcmp(bias.data(), datas[4].data(), 22) == 0);
    REQUIRE(bias[11] == 0xABCD);
    // Digests are of the bytes received, in the checkpoint's dtype.
    const auto digests = local_digests(result);
    REQUIRE(digests[0] == xxh3_64(embed_wire.data(), embed_wire.size()));
    REQUIRE(digests[1] == xxh3_64(datas[3].data(), datas[3].size()));
    REQUIRE(digests == result.expected_digests[0]);
  }
}

TEST_CASE("a placed load refuses bad wants before reading - naming rank - tensor and key",
          "[placement][loader]") {
  TempDir dir;
  const auto path = dir / "model.safetensors";
  test::write_typed_checkpoint(path, tensors, 20);
  std::vector<std::uint16_t> small(5);
  RankWants mine;
  TensorWant b{"bias", {}, {}, {}};
  b.destination.data = reinterpret_cast<std::byte*>(small.data());
  b.destination.capacity_bytes = 10;
  mine.tensors = {b};
  Error e = expect_error([&] { load_placed(path, mine, 64, DirectIo::off); });
  REQUIRE(e.code() == Errc::config);
  REQUIRE_THAT(e.what(), Contains("rank 0") && Contains("'bias'") &&
                             Contains("destination.capacity_bytes"));
  mine.tensors = {TensorWant{"nope", {}, {}, {}}};
  e = expect_error([&] { load_placed(path, mine, 64, DirectIo::off); });
  REQUIRE_THAT(e.what(), Contains("'nope'") && Contains("tensor:"));
  mine.tensors = {TensorWant{"bias", {}, {}, {}}};
  mine.tensors[0].destination.in_place = true;
  e = expect_error([&] { load_placed(path, mine, 64, DirectIo::off); });
  REQUIRE_THAT(e.what(), Contains("destination.capacity_bytes"));
}
