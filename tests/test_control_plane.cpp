// The control plane on loopback: catalogue wire format, rendezvous, token, reports, verdict.
#include "weightcast/catalogue_wire.hpp"
#include "weightcast/checkpoint.hpp"
#include "weightcast/control_plane.hpp"
#include "weightcast/error.hpp"

#include "utils/paths.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <future>
#include <thread>

using namespace weightcast;
using Catch::Matchers::Contains;

namespace {

Catalogue corpus_catalogue(const std::string& relative) {
  return open_checkpoint(test::corpus_dir() / "real" / relative);
}

Error decode_error(std::string_view bytes) {
  try {
    decode_catalogue(bytes, "catalogue from rank 0");
  } catch (const Error& e) {
    return e;
  }
  FAIL("decoded without an error");
  return Error(Errc::internal, "");
}

World world_of(int rank, int size) {
  World w;
  w.rank = rank;
  w.world_size = size;
  w.local_rank = rank;
  return w;
}

RendezvousOptions loopback(std::uint16_t port, std::string token = "t0ken",
                           std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  RendezvousOptions o;
  o.address = "127.0.0.1";
  o.port = port;
  o.token = std::move(token);
  o.timeout = timeout;
  return o;
}

}  // namespace

TEST_CASE("catalogue wire: round trip keeps everything but shard paths", "[control_plane]") {
  for (const char* file : {"huggingface__safetensors/samples/overall.safetensors",
                           "anirudh-ak__peft-gpt2/model/lora_model/adapter_model.safetensors",
                           "JunSuzukiJapan__tl/model.safetensors"}) {
    INFO(file);
    const Catalogue original = corpus_catalogue(file);
    const Catalogue back = decode_catalogue(encode_catalogue(original), "test");
    REQUIRE(back.shards.size() == original.shards.size());
    for (std::size_t s = 0; s < back.shards.size(); ++s) {
      CHECK(back.shards[s].path.empty());  // never sent: other ranks never open files
      CHECK(back.shards[s].name == original.shards[s].name);
      CHECK(back.shards[s].file_bytes == original.shards[s].file_bytes);
      CHECK(back.shards[s].data_offset == original.shards[s].data_offset);
    }
    REQUIRE(back.tensors.size() == original.tensors.size());
    for (std::size_t t = 0; t < back.tensors.size(); ++t) {
      CHECK(back.tensors[t].name == original.tensors[t].name);
      CHECK(back.tensors[t].dtype == original.tensors[t].dtype);
      CHECK(back.tensors[t].shape == original.tensors[t].shape);
      CHECK(back.tensors[t].shard == original.tensors[t].shard);
      CHECK(back.tensors[t].file_offset == original.tensors[t].file_offset);
      CHECK(back.tensors[t].bytes == original.tensors[t].bytes);
    }
    CHECK(back.metadata == original.metadata);
  }
}

TEST_CASE("catalogue wire: the decoder never trusts the peer", "[control_plane]") {
  const std::string good =
      encode_catalogue(corpus_catalogue("huggingface__safetensors/samples/overall.safetensors"));
  // Every truncation is an error, never a crash or an over-read.
  for (std::size_t n = 0; n < good.size(); ++n) {
    const Error e = decode_error(std::string_view(good).substr(0, n));
    CHECK(e.code() == Errc::unavailable);
  }
  CHECK_THAT(decode_error(good + "x").what(), Contains("trailing"));
  std::string bad_magic = good;
  bad_magic[0] ^= 1;
  CHECK_THAT(decode_error(bad_magic).what(), Contains("magic"));
  std::string bad_version = good;
  bad_version[4] = 9;
  CHECK_THAT(decode_error(bad_version).what(), Contains("version 9"));
  // A huge shard count is refused before anything is allocated.
  std::string huge = good;
  huge[8] = huge[9] = huge[10] = huge[11] = '\xff';
  CHECK_THAT(decode_error(huge).what(), Contains("more entries than the payload holds"));
  // Flipping bytes anywhere is at worst an error.
  for (std::size_t i = 12; i < good.size(); i += 3) {
    std::string flipped = good;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    try {
      decode_catalogue(flipped, "fuzz");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
    }
  }
}

TEST_CASE("control plane: 3 ranks meet, share, report and agree", "[control_plane]") {
  constexpr std::uint16_t port = 29651;
  auto peer = [](int rank) {
    ControlPlane control(world_of(rank, 3), loopback(port));
    const std::string shared = control.share({});
    RankReport report{rank, 100, 0.5, {1, 2, static_cast<std::uint64_t>(rank == 2 ? 9 : 3)}};
    control.gather(report);
    const Verdict verdict = control.finish({});
    return std::make_pair(shared, verdict);
  };
  auto one = std::async(std::launch::async, peer, 1);
  auto two = std::async(std::launch::async, peer, 2);
  ControlPlane root(world_of(0, 3), loopback(port));
  CHECK(root.share("catalogue bytes") == "catalogue bytes");
  const auto reports = root.gather(RankReport{0, 100, 0.5, {1, 2, 3}});
  REQUIRE(reports.size() == 3);
  CHECK(reports[1].rank == 1);
  CHECK(reports[1].digests == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(reports[2].digests == std::vector<std::uint64_t>{1, 2, 9});
  root.finish(Verdict{70, "rank 2 differs"});
  for (auto* f : {&one, &two}) {
    REQUIRE(f->wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    auto [shared, verdict] = f->get();
    CHECK(shared == "catalogue bytes");
    CHECK(verdict.status == 70);
    CHECK(verdict.message == "rank 2 differs");
  }
}

TEST_CASE("control plane: a wrong token is refused on both sides", "[control_plane]") {
  constexpr std::uint16_t port = 29652;
  auto intruder = std::async(std::launch::async, [] {
    try {
      ControlPlane control(world_of(1, 2), loopback(port, "wrong"));
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("joined"));
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    ControlPlane root(world_of(0, 2), loopback(port, "right", std::chrono::seconds(2)));
    FAIL("rank 0 accepted a wrong token");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(), Contains("rank(s) 1 did not join") && Contains("wrong job token"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  REQUIRE(intruder.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  auto [code, what] = intruder.get();
  CHECK(code == Errc::config);
  CHECK_THAT(what, Contains("refused this rank") && Contains("wrong job token"));
}

TEST_CASE("control plane: no rank 0 is unavailable within the timeout", "[control_plane]") {
  const auto start = std::chrono::steady_clock::now();
  try {
    ControlPlane control(world_of(1, 2), loopback(29653, "t", std::chrono::milliseconds(1500)));
    FAIL("connected to nobody");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Contains("cannot reach rank 0 at 127.0.0.1:29653"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}
