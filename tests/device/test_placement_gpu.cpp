// Placement on the GPU: nccl's point-to-point exchange (ncclSend/ncclRecv in one group), a
// placed load into device memory (the arena and in-place device destinations), and fsdp over
// nccl between GPUs.
//
// Tagged [gpu]: where no CUDA device is usable (or the build has no CUDA) each test WARNs the
// reason and returns; WEIGHTCAST_REQUIRE_GPU=1 (tests/gpu/gpu_check.sh on a GPU host) makes that
// a failure. NCCL refuses two ranks on one GPU, so the multi-rank test needs two devices and
// says so where there are fewer, unless WEIGHTCAST_TEST_TWO_RANKS_PER_GPU=1 says NCCL takes
// two ranks on one (NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1: tests/gpu/gpu_check.sh sets
// both); on one GPU the exchange is tested rank 0 to itself, which NCCL allows inside a group.
#include "weightcast/device/device.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/gpu_info.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"
#include "weightcast/transport/transport.hpp"

#include "support/gpu.hpp"
#include "support/paths.hpp"
#include "support/ports.hpp"
#include "support/process.hpp"
#include "support/report.hpp"
#include "support/typed_checkpoint.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>

using namespace weightcast;
using namespace weightcast::test;
using Catch::Matchers::Contains;

namespace {

void wait_for(std::unique_ptr<Pending> pending) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (pending && !pending->test()) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string read_back(const Arena& arena, std::uint64_t offset, std::uint64_t bytes) {
  std::string out;
  arena.read_back(offset, bytes, [&](const std::byte* data, std::size_t n) {
    out.append(reinterpret_cast<const char*>(data), n);
  });
  return out;
}

const std::vector<TypedTensor> tensors = {
    {"uneven", "BF16", {5, 4}},    // 5 rows over 2 ranks: 3, 2
    {"few", "F32", {1, 3}},        // fewer rows than ranks: 1, 0
    {"bias", "F32", {7}},          // 1-D
    {"scalar", "F32", {}},         // 0-dim: whole everywhere
    {"empty", "F16", {0, 4}},      // zero-size
    {"cols", "BF16", {64, 33}},    // a dim-1 slice: strided in the file
    {"big", "U8", {3000, 170}},    // many chunks
};

TensorWant want(const std::string& tensor, std::vector<std::uint64_t> offset,
                std::vector<std::uint64_t> shape) {
  TensorWant w;
  w.tensor = tensor;
  w.offset = std::move(offset);
  w.shape = std::move(shape);
  return w;
}

}  // namespace

TEST_CASE("placement gpu: nccl exchange delivers every message in order - rank 0 to itself",
          "[gpu][nccl][placement]") {
  WEIGHTCAST_REQUIRE_GPU();
  auto device = make_cuda_device(0);
  auto transport = make_nccl_transport(0, 1, 0, nccl_unique_id(), std::chrono::seconds(60));
  // Several messages to the one peer in one group, of different sizes: NCCL runs calls to
  // the same peer in order, so each receive gets the send posted in the same place.
  const std::vector<std::uint64_t> sizes = {1, 4096, 3 << 20, 77};
  std::uint64_t total = 0;
  for (auto n : sizes) total += n;
  std::string bytes(total, '\0');
  std::mt19937_64 random(41);
  for (auto& c : bytes) c = static_cast<char>(random());
  auto source = device->allocate_arena(total);
  auto target = device->allocate_arena(total);
  wait_for(device->upload(reinterpret_cast<const std::byte*>(bytes.data()), source->data(),
                          total));
  std::vector<Transport::Message> sends, receives;
  std::uint64_t at = 0;
  for (auto n : sizes) {
    sends.push_back({0, source->data() + at, n});
    receives.push_back({0, target->data() + at, n});
    at += n;
  }
  wait_for(transport->exchange(sends, receives, 0));
  CHECK(read_back(*target, 0, total) == bytes);
  CHECK(transport->exchange({}, {}, 1) == nullptr);  // nothing to do
}

TEST_CASE("placement gpu: a placed load into device memory lands each local shard bit-exact",
          "[gpu][placement]") {
  WEIGHTCAST_REQUIRE_GPU();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 51);
  auto device = make_cuda_device(0);
  auto transport = make_nccl_transport(0, 1, 0, nccl_unique_id(), std::chrono::seconds(60));
  RankWants mine;
  mine.tensors = {want("uneven", {3, 0}, {2, 4}), want("cols", {0, 11}, {64, 11}),
                  want("scalar", {}, {}),         want("empty", {0, 0}, {0, 4}),
                  want("big", {1000, 0}, {1500, 170})};
  // "big" lands in place, in device memory of the caller's (here: another arena).
  const std::uint64_t big_bytes = 1500 * 170;
  auto own = device->allocate_arena(big_bytes);
  mine.tensors.back().destination.data = own->data();
  mine.tensors.back().destination.capacity_bytes = big_bytes;
  mine.tensors.back().destination.memory = MemoryKind::cuda;
  for (const std::uint64_t chunk : {std::uint64_t{100}, std::uint64_t{1} << 20}) {
    INFO("chunk_bytes " << chunk);
    auto placement = std::make_shared<LoadPlacement>();
    placement->all = {mine};
    placement->mine = mine;
    placement->expect_digests = true;
    LoadOptions options;
    options.chunk_bytes = chunk;
    options.placement = placement;
    const LoadResult result = load(open_checkpoint(path), *device, *transport, options);
    REQUIRE(result.placed);
    const auto digests = local_digests(result);
    for (std::size_t w = 0; w < mine.tensors.size(); ++w) {
      INFO("tensor " << mine.tensors[w].tensor);
      const TensorWant& wanted = mine.tensors[w];
      const std::string expected =
          expected_local(tensors, datas, wanted.tensor, wanted.offset, wanted.shape);
      CHECK(digests[w] == xxh3_64(expected.data(), expected.size()));
      const TensorView view = result.local(w);
      CHECK(view.memory == MemoryKind::cuda);
      if (expected.empty()) continue;
      const Arena& arena = w + 1 == mine.tensors.size() ? *own : *result.arena;
      CHECK(read_back(arena, static_cast<std::uint64_t>(view.data - arena.data()),
                      expected.size()) == expected);
    }
  }
}

TEST_CASE("placement gpu: a cast into a device's arena is refused with 78 naming the tensor",
          "[gpu][placement]") {
  // Casts run in host memory (loader: cast_into); a device arena is not.
  WEIGHTCAST_REQUIRE_GPU();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  write_typed_checkpoint(path, tensors, 53);
  auto device = make_cuda_device(0);
  auto transport = make_nccl_transport(0, 1, 0, nccl_unique_id(), std::chrono::seconds(60));
  {
    RankWants cast;
    cast.tensors = {want("uneven", {}, {})};
    cast.tensors[0].destination.dtype = Dtype::F32;
    auto placement = std::make_shared<LoadPlacement>();
    placement->all = {cast};
    placement->mine = cast;
    LoadOptions options;
    options.placement = placement;
    try {
      static_cast<void>(load(open_checkpoint(path), *device, *transport, options));
      FAIL("a cast into device memory was accepted");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::config);
      CHECK_THAT(e.what(), Contains("tensor 'uneven': destination.dtype: a cast from BF16 to "
                                    "F32 happens in host memory"));
    }
  }
}

TEST_CASE("placement gpu: fsdp over nccl on 2 GPUs gives each rank its Shard(0) rows bit-exact",
          "[gpu][nccl][placement]") {
  WEIGHTCAST_REQUIRE_GPU();
  const char* two_per_gpu = std::getenv("WEIGHTCAST_TEST_TWO_RANKS_PER_GPU");
  const bool two_ranks_one_gpu = two_per_gpu != nullptr && std::string_view(two_per_gpu) == "1";
  if (cuda_device_count() < 2 && !two_ranks_one_gpu) {
    WARN("skipped: needs 2 CUDA devices (NCCL refuses two ranks on one GPU; "
         "WEIGHTCAST_TEST_TWO_RANKS_PER_GPU=1 where NCCL takes two); this machine has "
         << cuda_device_count());
    return;
  }
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 52);
  const std::string rules = "placement_rules=[{match: cols, shard: {dim: 1}}]";
  for (const std::string chunk : {"100B", "1MiB"}) {
    INFO("chunk_size " << chunk);
    const auto r = run_cli({"launch", "-n", "2", "--spawner", "local", "--set",
                            "checkpoint=" + path.string(), "--set", "device=cuda", "--set",
                            "transport=nccl", "--set", "placement=fsdp", "--set", rules,
                            "--set", "chunk_size=" + chunk, "--set",
                            "rendezvous.port=" + std::to_string(test::free_port()), "--set",
                            "timeout=60s", "--report", (dir / "r{rank}.json").string()},
                           {}, 180);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK_THAT(r.out + r.err, Contains("local shards bit-exact"));
    for (int rank = 0; rank < 2; ++rank) {
      INFO("rank " << rank);
      const auto got = read_json(dir / ("r" + std::to_string(rank) + ".json"));
      REQUIRE(got["tensors"].size() == tensors.size());
      for (const auto& t : tensors) {
        INFO("tensor " << t.name);
        // torch.chunk over 2 ranks along dim 0 (dim 1 for "cols"); 0-dim whole.
        std::vector<std::uint64_t> offset(t.shape.size(), 0), shape = t.shape;
        if (!t.shape.empty()) {
          const std::size_t dim = t.name == "cols" ? 1 : 0;
          const std::uint64_t n = t.shape[dim], c = (n + 1) / 2;
          offset[dim] = std::min<std::uint64_t>(n, c * rank);
          shape[dim] = std::min<std::uint64_t>(n, c * (rank + 1)) - offset[dim];
        }
        const auto& entry = got["tensors"][t.name];
        CHECK(entry["shape"].get<std::vector<std::uint64_t>>() == shape);
        CHECK(entry["offset"].get<std::vector<std::uint64_t>>() == offset);
        const std::string bytes = slice_bytes(datas[tensor_index(tensors, t.name)], t.shape,
                                              typed_element_bytes(t.dtype), offset, shape);
        CHECK(entry["xxh3"] == digest_hex(xxh3_64(bytes.data(), bytes.size())));
      }
    }
  }
}
