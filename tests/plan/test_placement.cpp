// Placement: torch.chunk's split, the resolution of modes and rules, validation of every
// rank's wants, their wire form, the casts at the receiver, and the placed plan's coverage
// (every byte of every local shard delivered exactly once, checked against an independent
// element-by-element slicing).
#include "weightcast/core/error.hpp"
#include "weightcast/plan/placement.hpp"
#include "weightcast/plan/plan.hpp"

#include "support/expect_error.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace weightcast;
using Catch::Matchers::Contains;
using weightcast::test::expect_error;

namespace {

TensorInfo make_tensor(std::string name, Dtype dtype, std::vector<std::uint64_t> shape,
                       std::uint64_t file_offset = 8) {
  TensorInfo t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  unsigned __int128 bits = dtype_bits(dtype);
  for (auto d : t.shape) bits *= d;
  t.bytes = static_cast<std::uint64_t>(bits / 8);
  t.file_offset = file_offset;
  return t;
}

// One shard whose tensors are tiled back to back.
Catalogue make_catalogue(std::vector<TensorInfo> tensors) {
  Catalogue catalogue;
  ShardInfo shard;
  shard.name = "model.safetensors";
  shard.data_offset = 16;
  std::uint64_t offset = shard.data_offset;
  for (auto& t : tensors) {
    t.file_offset = offset;
    offset += t.bytes;
  }
  shard.file_bytes = offset;
  catalogue.shards.push_back(shard);
  catalogue.tensors = std::move(tensors);
  return catalogue;
}

// The local byte a tensor byte is, by slicing element by element (independent of ShardRuns),
// or -1 when the byte is outside the local shard.
std::int64_t local_byte_of(const TensorInfo& tensor, const TensorWant& want, std::uint64_t b) {
  const std::uint64_t esize = dtype_bits(tensor.dtype) / 8;
  const auto shape = local_shape(tensor, want);
  const auto offset = local_offset(tensor, want);
  std::uint64_t e = b / esize;
  std::vector<std::uint64_t> index(tensor.shape.size());
  for (std::size_t d = tensor.shape.size(); d-- > 0;) {
    index[d] = e % tensor.shape[d];
    e /= tensor.shape[d];
  }
  std::uint64_t local = 0;
  for (std::size_t d = 0; d < tensor.shape.size(); ++d) {
    if (index[d] < offset[d] || index[d] >= offset[d] + shape[d]) return -1;
    local = local * shape[d] + (index[d] - offset[d]);
  }
  return static_cast<std::int64_t>(local * esize + b % esize);
}

// Checks a placed plan: every local byte of every rank's wants delivered exactly once (or
// broadcast), each at the tensor byte the independent slicing says.
void check_placed_plan(const Catalogue& catalogue, const std::vector<RankWants>& wants,
                       const Plan& plan, std::uint64_t chunk_bytes) {
  std::vector<std::vector<std::vector<std::uint8_t>>> seen(wants.size());
  std::vector<std::vector<std::uint32_t>> want_tensor(wants.size());
  for (std::size_t r = 0; r < wants.size(); ++r) {
    for (const TensorWant& w : wants[r].tensors) {
      std::uint32_t t = 0;
      while (catalogue.tensors[t].name != w.tensor) ++t;
      want_tensor[r].push_back(t);
      seen[r].emplace_back(local_bytes(catalogue.tensors[t], w), 0);
    }
  }
  REQUIRE(plan.chunk_first_delivery.size() == plan.chunks.size() + 1);
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    REQUIRE(chunk.bytes <= chunk_bytes);
    if (plan.chunk_broadcast[c]) {
      REQUIRE(plan.chunk_first_delivery[c] == plan.chunk_first_delivery[c + 1]);
      for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
        const Piece& piece = plan.pieces[chunk.first_piece + p];
        for (std::size_t r = 0; r < wants.size(); ++r) {
          std::size_t w = 0;
          while (w < want_tensor[r].size() && want_tensor[r][w] != piece.tensor) ++w;
          REQUIRE(w < want_tensor[r].size());
          REQUIRE(wants_whole(catalogue.tensors[piece.tensor], wants[r].tensors[w]));
          for (std::uint64_t b = 0; b < piece.bytes; ++b) ++seen[r][w][piece.tensor_offset + b];
        }
      }
      continue;
    }
    for (auto d = plan.chunk_first_delivery[c]; d < plan.chunk_first_delivery[c + 1]; ++d) {
      const Delivery& delivery = plan.deliveries[d];
      const Piece& piece = plan.pieces[delivery.piece];
      REQUIRE(delivery.piece >= chunk.first_piece);
      REQUIRE(delivery.piece < chunk.first_piece + chunk.piece_count);
      REQUIRE(delivery.bytes > 0);
      const TensorInfo& tensor = catalogue.tensors[piece.tensor];
      const TensorWant& want = wants[delivery.rank].tensors[delivery.want];
      REQUIRE(want.tensor == tensor.name);
      detail::ShardRuns runs(tensor, want);
      std::uint64_t stretches = 0;
      runs.for_each_stretch(delivery.local_offset, delivery.local_offset + delivery.bytes,
                            [&](std::uint64_t tb, std::uint64_t lb, std::uint64_t n) {
                              ++stretches;
                              REQUIRE(tb >= piece.tensor_offset);
                              REQUIRE(tb + n <= piece.tensor_offset + piece.bytes);
                              for (std::uint64_t i = 0; i < n; ++i) {
                                REQUIRE(local_byte_of(tensor, want, tb + i) ==
                                        static_cast<std::int64_t>(lb + i));
                                ++seen[delivery.rank][delivery.want][lb + i];
                              }
                            });
      REQUIRE(stretches == delivery.runs);
    }
  }
  for (std::size_t r = 0; r < wants.size(); ++r) {
    for (std::size_t w = 0; w < seen[r].size(); ++w) {
      for (std::uint64_t b = 0; b < seen[r][w].size(); ++b) {
        INFO("rank " << r << " tensor " << wants[r].tensors[w].tensor << " local byte " << b);
        REQUIRE(seen[r][w][b] == 1);
      }
    }
  }
}

std::vector<RankWants> resolve_all(const PlacementSpec& spec, const Catalogue& catalogue,
                                   int world) {
  std::vector<RankWants> wants;
  for (int r = 0; r < world; ++r) wants.push_back(resolve_placement(spec, catalogue, r, world));
  validate_wants(catalogue, wants);
  return wants;
}

// Every byte of each tensor is covered exactly once across @p ranks (a Shard placement).
void check_exact_cover(const Catalogue& catalogue, const std::vector<RankWants>& wants,
                       const std::vector<int>& ranks, const std::string& name) {
  std::uint32_t t = 0;
  while (catalogue.tensors[t].name != name) ++t;
  const TensorInfo& tensor = catalogue.tensors[t];
  std::vector<int> cover(tensor.bytes, 0);
  for (int r : ranks) {
    for (const TensorWant& w : wants[r].tensors) {
      if (w.tensor != name) continue;
      for (std::uint64_t b = 0; b < tensor.bytes; ++b) cover[b] += local_byte_of(tensor, w, b) >= 0;
    }
  }
  for (std::uint64_t b = 0; b < tensor.bytes; ++b) {
    INFO(name << " byte " << b);
    REQUIRE(cover[b] == 1);
  }
}

}  // namespace

TEST_CASE("chunk_rows follows torch.chunk: c = ceil(n / W) - trailing ranks fewer or none",
          "[placement]") {
  const std::uint64_t expect54[] = {2, 2, 1, 0};
  for (std::uint32_t r = 0; r < 4; ++r) REQUIRE(chunk_rows(5, 4, r).count == expect54[r]);
  REQUIRE(chunk_rows(5, 4, 3).begin == 5);
  REQUIRE(chunk_rows(2, 3, 0).count == 1);
  REQUIRE(chunk_rows(2, 3, 1).count == 1);
  REQUIRE(chunk_rows(2, 3, 2).count == 0);
  REQUIRE(chunk_rows(0, 3, 1).count == 0);
  REQUIRE(chunk_rows(9, 3, 2).begin == 6);
  REQUIRE(chunk_rows(9, 3, 2).count == 3);
  // torch.chunk(10, 4): c = 3 -> 3, 3, 3, 1
  REQUIRE(chunk_rows(10, 4, 3).count == 1);
  REQUIRE(chunk_rows(10, 4, 3).begin == 9);
}

TEST_CASE("fsdp: Shard(0) covers every byte exactly once - 0-dim tensors whole on every rank",
          "[placement]") {
  std::mt19937_64 rng(18);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<TensorInfo> tensors;
    const int count = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < count; ++i) {
      const int dims = std::uniform_int_distribution<int>(0, 3)(rng);
      std::vector<std::uint64_t> shape;
      for (int d = 0; d < dims; ++d) shape.push_back(std::uniform_int_distribution<int>(0, 7)(rng));
      const Dtype dtypes[] = {Dtype::U8, Dtype::BF16, Dtype::F32, Dtype::F64};
      tensors.push_back(make_tensor("t" + std::to_string(i),
                                    dtypes[std::uniform_int_distribution<int>(0, 3)(rng)], shape));
    }
    const Catalogue catalogue = make_catalogue(tensors);
    const int world = std::uniform_int_distribution<int>(1, 5)(rng);
    PlacementSpec spec;
    spec.mode = PlacementMode::fsdp;
    const auto wants = resolve_all(spec, catalogue, world);
    std::vector<int> all(world);
    for (int r = 0; r < world; ++r) all[r] = r;
    for (const TensorInfo& t : catalogue.tensors) {
      if (t.shape.empty()) {
        for (int r = 0; r < world; ++r) {
          REQUIRE(wants[r].tensors.size() == catalogue.tensors.size());
        }
        continue;
      }
      check_exact_cover(catalogue, wants, all, t.name);
    }
    const std::uint64_t chunk = std::uniform_int_distribution<std::uint64_t>(1, 64)(rng);
    check_placed_plan(catalogue, wants, make_placed_plan(catalogue, wants, chunk), chunk);
  }
}

TEST_CASE("fsdp on 5 rows over 4 ranks gives 2/2/1/0 rows with their offsets",
          "[placement]") {
  const Catalogue catalogue = make_catalogue({make_tensor("w", Dtype::BF16, {5, 3}),
                                              make_tensor("s", Dtype::F32, {})});
  PlacementSpec spec;
  spec.mode = PlacementMode::fsdp;
  const auto wants = resolve_all(spec, catalogue, 4);
  const std::uint64_t rows[] = {2, 2, 1, 0};
  const std::uint64_t first[] = {0, 2, 4, 5};
  for (int r = 0; r < 4; ++r) {
    REQUIRE(wants[r].tensors.size() == 2);
    const TensorWant& w = wants[r].tensors[0];
    REQUIRE(w.shape == std::vector<std::uint64_t>{rows[r], 3});
    REQUIRE(w.offset == std::vector<std::uint64_t>{first[r], 0});
    REQUIRE(local_bytes(catalogue.tensors[0], w) == rows[r] * 3 * 2);
    REQUIRE(wants_whole(catalogue.tensors[1], wants[r].tensors[1]));
  }
}

TEST_CASE("rules: first match wins - shard dim 1 - a TP group inside the world - ranks - skip",
          "[placement]") {
  const Catalogue catalogue = make_catalogue({
      make_tensor("layers.0.q.weight", Dtype::BF16, {6, 4}),
      make_tensor("layers.0.o.weight", Dtype::BF16, {4, 7}),
      make_tensor("layers.0.norm", Dtype::F32, {4}),
      make_tensor("layers.1.q.weight", Dtype::BF16, {6, 4}),
      make_tensor("head", Dtype::F16, {3, 5}),
      make_tensor("rope.cache", Dtype::F32, {8}),
  });
  PlacementSpec spec;
  spec.mode = PlacementMode::fsdp;
  spec.rules.push_back({"rope.*", PlacementRule::Action::skip, 0, {}, 0});
  spec.rules.push_back({"layers.1.*", PlacementRule::Action::ranks, 0, {2, 3}, 0});
  spec.rules.push_back({"*.o.weight", PlacementRule::Action::shard, 1, {}, 2});
  spec.rules.push_back({"*.q.weight", PlacementRule::Action::shard, 0, {1, 3}, 0});
  spec.rules.push_back({"*norm", PlacementRule::Action::replicate, 0, {}, 0});
  const auto wants = resolve_all(spec, catalogue, 4);
  auto find = [&](int r, std::string_view name) -> const TensorWant* {
    for (const auto& w : wants[r].tensors) {
      if (w.tensor == name) return &w;
    }
    return nullptr;
  };
  for (int r = 0; r < 4; ++r) {
    REQUIRE(find(r, "rope.cache") == nullptr);
    REQUIRE((find(r, "layers.1.q.weight") != nullptr) == (r >= 2));
    REQUIRE(find(r, "layers.0.norm") != nullptr);
    REQUIRE(wants_whole(catalogue.tensors[2], *find(r, "layers.0.norm")));
    REQUIRE((find(r, "layers.0.q.weight") != nullptr) == (r == 1 || r == 3));
  }
  // o.weight: groups {0, 1} and {2, 3}, each splitting dim 1 (7 columns: 4 and 3).
  REQUIRE(find(0, "layers.0.o.weight")->shape == std::vector<std::uint64_t>{4, 4});
  REQUIRE(find(1, "layers.0.o.weight")->offset == std::vector<std::uint64_t>{0, 4});
  REQUIRE(find(3, "layers.0.o.weight")->shape == std::vector<std::uint64_t>{4, 3});
  check_exact_cover(catalogue, wants, {0, 1}, "layers.0.o.weight");
  check_exact_cover(catalogue, wants, {2, 3}, "layers.0.o.weight");
  check_exact_cover(catalogue, wants, {1, 3}, "layers.0.q.weight");
  check_exact_cover(catalogue, wants, {0, 1, 2, 3}, "head");
  for (std::uint64_t chunk : {1, 3, 8, 13, 1000}) {
    const Plan plan = make_placed_plan(catalogue, wants, chunk);
    check_placed_plan(catalogue, wants, plan, chunk);
    // A receiving rank keeps only its own deliveries.
    const Plan mine = make_placed_plan(catalogue, wants, chunk, 2);
    for (const Delivery& d : mine.deliveries) REQUIRE(d.rank == 2);
  }
}

TEST_CASE("a dim-1 slice is gathered: one delivery per chunk and piece - its runs counted",
          "[placement]") {
  const Catalogue catalogue = make_catalogue({make_tensor("w", Dtype::F32, {64, 30})});
  PlacementSpec spec;
  spec.rules.push_back({"w", PlacementRule::Action::shard, 1, {}, 0});
  const auto wants = resolve_all(spec, catalogue, 3);
  const Plan plan = make_placed_plan(catalogue, wants, 1 << 20);
  REQUIRE(plan.chunks.size() == 1);
  REQUIRE(plan.deliveries.size() == 3);
  for (const Delivery& d : plan.deliveries) {
    REQUIRE(d.runs == 64);
    REQUIRE(d.bytes == 64 * 10 * 4);
  }
  check_placed_plan(catalogue, wants, plan, 1 << 20);
}

TEST_CASE("replicate: every chunk is broadcast - no deliveries", "[placement]") {
  const Catalogue catalogue = make_catalogue({make_tensor("a", Dtype::U8, {100}),
                                              make_tensor("b", Dtype::U8, {0}),
                                              make_tensor("c", Dtype::F32, {})});
  const auto wants = resolve_all(PlacementSpec{}, catalogue, 3);
  const Plan plan = make_placed_plan(catalogue, wants, 30);
  REQUIRE(plan.deliveries.empty());
  for (auto b : plan.chunk_broadcast) REQUIRE(b == 1);
  check_placed_plan(catalogue, wants, plan, 30);
}

TEST_CASE("rules that cannot apply are config errors naming the rule and the tensor",
          "[placement]") {
  const Catalogue catalogue = make_catalogue({make_tensor("bias", Dtype::F32, {4})});
  PlacementSpec spec;
  spec.rules.push_back({"bias", PlacementRule::Action::shard, 1, {}, 0});
  Error e = expect_error([&] { resolve_placement(spec, catalogue, 0, 2); });
  REQUIRE(e.code() == Errc::config);
  REQUIRE_THAT(e.what(), Contains("rule 1 (pattern 'bias')") && Contains("dim 1") &&
                             Contains("'bias'"));
  spec.rules[0] = {"*", PlacementRule::Action::ranks, 0, {0, 5}, 0};
  e = expect_error([&] { resolve_placement(spec, catalogue, 0, 2); });
  REQUIRE_THAT(e.what(), Contains("rank 5 is outside the world of 2"));
  spec.rules[0] = {"*", PlacementRule::Action::shard, 0, {}, 2};
  e = expect_error([&] { resolve_placement(spec, catalogue, 0, 3); });
  REQUIRE_THAT(e.what(), Contains("group 2 does not divide the world size 3"));
  spec.rules[0] = {"*", PlacementRule::Action::ranks, 0, {1, 1}, 0};
  e = expect_error([&] { resolve_placement(spec, catalogue, 0, 3); });
  REQUIRE_THAT(e.what(), Contains("rank 1 is listed twice"));
}

TEST_CASE("validate_wants: each bad want names the rank - the tensor and the key",
          "[placement]") {
  const Catalogue catalogue = make_catalogue({make_tensor("w", Dtype::BF16, {4, 6}),
                                              make_tensor("f4", Dtype::F4, {3, 3})});
  auto check = [&](TensorWant want, Errc code, std::vector<std::string> parts) {
    std::vector<RankWants> wants(3);
    wants[2].tensors.push_back(std::move(want));
    const Error e = expect_error([&] { validate_wants(catalogue, wants); });
    REQUIRE(e.code() == code);
    REQUIRE_THAT(e.what(), Contains("rank 2"));
    for (const auto& p : parts) REQUIRE_THAT(e.what(), Contains(p));
  };
  check(TensorWant{"nope", {}, {}, {}}, Errc::config, {"'nope'", "tensor:", "no tensor"});
  check(TensorWant{"w", {0}, {4}, {}}, Errc::config, {"'w'", "offset:", "1 dims"});
  check(TensorWant{"w", {0, 0}, {4}, {}}, Errc::config, {"'w'", "shape:", "1 dims"});
  check(TensorWant{"w", {2, 0}, {3, 6}, {}}, Errc::config,
        {"'w'", "offset:", "outside the tensor's shape [4, 6] (dim 0)"});
  check(TensorWant{"w", {0, 7}, {4, 0}, {}}, Errc::config, {"(dim 1)"});
  TensorDestination small;
  small.data = reinterpret_cast<std::byte*>(16);
  small.capacity_bytes = 47;
  check(TensorWant{"w", {}, {}, small}, Errc::config,
        {"'w'", "destination.capacity_bytes", "47 bytes", "48 bytes"});
  TensorDestination cast;
  cast.dtype = Dtype::F32;
  cast.data = reinterpret_cast<std::byte*>(16);
  cast.capacity_bytes = 95;  // 24 elements × 4 bytes = 96
  check(TensorWant{"w", {}, {}, cast}, Errc::config, {"destination.capacity_bytes", "96"});
  cast.dtype = Dtype::I32;
  check(TensorWant{"w", {}, {}, cast}, Errc::config,
        {"destination.dtype", "cannot cast BF16 to I32"});
  cast.dtype = Dtype::F32;
  cast.capacity_bytes = 96;
  cast.memory = MemoryKind::cuda;
  check(TensorWant{"w", {}, {}, cast}, Errc::config, {"destination.memory"});
  check(TensorWant{"f4", {0, 1}, {3, 1}, {}}, Errc::invalid_checkpoint, {"'f4'", "whole byte"});
  // Asked twice.
  std::vector<RankWants> wants(2);
  wants[1].tensors.push_back({"w", {}, {}, {}});
  wants[1].tensors.push_back({"w", {0, 0}, {1, 6}, {}});
  const Error e = expect_error([&] { validate_wants(catalogue, wants); });
  REQUIRE_THAT(e.what(), Contains("rank 1") && Contains("'w'") && Contains("twice"));
  // A whole F4 tensor, and F4 rows sliced on whole bytes, are fine.
  const Catalogue even = make_catalogue({make_tensor("f4", Dtype::F4, {3, 4})});
  std::vector<RankWants> ok(1);
  ok[0].tensors.push_back({"f4", {1, 0}, {2, 4}, {}});
  validate_wants(even, ok);
  REQUIRE(local_bytes(even.tensors[0], ok[0].tensors[0]) == 4);
}

TEST_CASE("wants of any size round-trip the wire - past one control frame", "[placement]") {
  // Every rank's wants name every tensor: a checkpoint of many tensors on a few ranks encodes
  // to more than the 64 MiB one control frame carries, and must load as it does on one rank.
  constexpr std::size_t per_rank = 33'000;
  std::vector<RankWants> wants(2);
  const std::string stem(1'000, 'n');
  for (std::size_t r = 0; r < wants.size(); ++r) {
    for (std::size_t t = 0; t < per_rank; ++t) {
      wants[r].tensors.push_back({stem + std::to_string(t), {r}, {1}, {}});
    }
  }
  const std::string bytes = encode_wants(wants);
  REQUIRE(bytes.size() > std::size_t{64} << 20);
  const auto back = decode_wants(bytes, "wants");
  REQUIRE(back.size() == 2);
  REQUIRE(back[1].tensors.size() == per_rank);
  CHECK(back[1].tensors.back().tensor == stem + std::to_string(per_rank - 1));
  CHECK(back[1].tensors.back().offset == std::vector<std::uint64_t>{1});
  CHECK(encode_wants(back) == bytes);
  // A slice of a tensor of any number of dimensions, as the format and the catalogue allow.
  std::vector<RankWants> deep(1);
  deep[0].tensors.push_back({"deep", std::vector<std::uint64_t>(100, 0),
                             std::vector<std::uint64_t>(100, 1), {}});
  CHECK(decode_wants(encode_wants(deep), "wants")[0].tensors[0].shape.size() == 100);
}

TEST_CASE("wants round-trip the wire - truncated or corrupt bytes are refused - never trusted",
          "[placement]") {
  std::vector<RankWants> wants(3);
  wants[0].tensors.push_back({"a", {}, {}, {}});
  TensorDestination d;
  d.data = reinterpret_cast<std::byte*>(64);
  d.capacity_bytes = 1234;
  d.dtype = Dtype::F32;
  wants[1].tensors.push_back({"b.weight", {1, 0}, {2, 5}, d});
  d.memory = MemoryKind::cuda;
  d.dtype.reset();
  wants[2].tensors.push_back({"c", {0}, {0}, d});
  const std::string bytes = encode_wants(wants);
  const auto back = decode_wants(bytes, "wants");
  REQUIRE(back.size() == 3);
  REQUIRE(back[1].tensors[0].tensor == "b.weight");
  REQUIRE(back[1].tensors[0].offset == std::vector<std::uint64_t>{1, 0});
  REQUIRE(back[1].tensors[0].shape == std::vector<std::uint64_t>{2, 5});
  REQUIRE(back[1].tensors[0].destination.in_place);
  REQUIRE(back[1].tensors[0].destination.data == nullptr);
  REQUIRE(back[1].tensors[0].destination.capacity_bytes == 1234);
  REQUIRE(back[1].tensors[0].destination.dtype == Dtype::F32);
  REQUIRE(back[2].tensors[0].destination.memory == MemoryKind::cuda);
  REQUIRE(!back[0].tensors[0].destination.in_place);
  REQUIRE(encode_wants(back) == bytes);
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const Error e = expect_error([&] { decode_wants(bytes.substr(0, n), "wants from rank 1"); });
    REQUIRE(e.code() == Errc::unavailable);
    REQUIRE_THAT(e.what(), Contains("wants from rank 1"));
  }
  REQUIRE_THROWS_AS(decode_wants(bytes + "x", "w"), Error);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bad = bytes;
    bad[std::uniform_int_distribution<std::size_t>(0, bad.size() - 1)(rng)] ^=
        static_cast<char>(1 + rng() % 255);
    try {
      decode_wants(bad, "w");
    } catch (const Error& e) {
      REQUIRE(e.code() == Errc::unavailable);
    }
  }
  // A huge claimed count does not allocate.
  std::string huge = bytes.substr(0, 8) + std::string("\xff\xff\xff\x7f", 4);
  REQUIRE_THROWS_AS(decode_wants(huge, "w"), Error);
}

TEST_CASE("casts at the receiver: BF16/F16 to F32 exact - F32 to BF16/F16 round to nearest even",
          "[placement]") {
  auto f32_bits = [](float f) {
    std::uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
  };
  auto to_bf16 = [&](float f) {
    std::uint16_t out;
    cast_elements(Dtype::F32, Dtype::BF16, reinterpret_cast<const std::byte*>(&f),
                  reinterpret_cast<std::byte*>(&out), 1);
    return out;
  };
  REQUIRE(to_bf16(1.0f) == 0x3F80);
  // 1 + 2^-8 is exactly halfway between BF16 1.0 and 1 + 2^-7: ties to even (1.0).
  REQUIRE(to_bf16(1.0f + 1.0f / 256) == 0x3F80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even (up).
  REQUIRE(to_bf16(1.0f + 3.0f / 256) == 0x3F82);
  REQUIRE(to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536) == 0x3F81);
  REQUIRE(to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  REQUIRE(to_bf16(3.4e38f) == 0x7F80);  // rounds past BF16's largest finite value
  const std::uint16_t nan = to_bf16(std::numeric_limits<float>::quiet_NaN());
  REQUIRE((nan & 0x7F80) == 0x7F80);
  REQUIRE((nan & 0x7F) != 0);
  // BF16 -> F32 is a shift; every BF16 value round-trips.
  for (std::uint32_t b = 0; b < 0x10000; b += 7) {
    const auto h = static_cast<std::uint16_t>(b);
    float f;
    cast_elements(Dtype::BF16, Dtype::F32, reinterpret_cast<const std::byte*>(&h),
                  reinterpret_cast<std::byte*>(&f), 1);
    REQUIRE(f32_bits(f) == std::uint32_t{h} << 16);
    if (!std::isnan(f)) REQUIRE(to_bf16(f) == h);
  }
  // F16: 1.0 = 0x3C00, the smallest subnormal 2^-24 = 0x0001, 65504 = 0x7BFF, 65520 -> inf.
  const std::uint16_t halves[] = {0x3C00, 0x0001, 0x7BFF, 0xC000};
  const float values[] = {1.0f, std::ldexp(1.0f, -24), 65504.0f, -2.0f};
  float widened[4];
  cast_elements(Dtype::F16, Dtype::F32, reinterpret_cast<const std::byte*>(halves),
                reinterpret_cast<std::byte*>(widened), 4);
  for (int i = 0; i < 4; ++i) REQUIRE(widened[i] == values[i]);
  const float narrow_in[] = {1.0f + 1.0f / 2048, 65520.0f, 1.0f + 3.0f / 2048};
  std::uint16_t narrow_out[3];
  cast_elements(Dtype::F32, Dtype::F16, reinterpret_cast<const std::byte*>(narrow_in),
                reinterpret_cast<std::byte*>(narrow_out), 3);
  REQUIRE(narrow_out[0] == 0x3C00);  // tie to even
  REQUIRE(narrow_out[1] == 0x7C00);  // inf
  REQUIRE(narrow_out[2] == 0x3C02);  // tie to even (up)
  REQUIRE(expect_error([] {
            std::byte b[4]{};
            cast_elements(Dtype::I32, Dtype::F32, b, b, 1);
          }).code() == Errc::config);
}

TEST_CASE("layout_wants sizes arena wants in the destination dtype - in-place ones take none",
          "[placement]") {
  const Catalogue catalogue = make_catalogue({make_tensor("a", Dtype::BF16, {3}),
                                              make_tensor("b", Dtype::U8, {5})});
  RankWants wants;
  TensorWant a{"a", {}, {}, {}};
  a.destination.dtype = Dtype::F32;
  wants.tensors.push_back(a);
  TensorWant b{"b", {}, {}, {}};
  std::byte memory[5];
  b.destination.data = memory;
  b.destination.capacity_bytes = 5;
  wants.tensors.push_back(b);
  wants.tensors.push_back({"b", {1}, {2}, {}});
  const WantLayout layout = layout_wants(catalogue, wants, 256);
  REQUIRE(layout.offsets == std::vector<std::uint64_t>{0, no_arena_offset, 256});
  REQUIRE(layout.arena_bytes == 258);
}
