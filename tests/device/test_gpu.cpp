// The GPU path: cuda device, pinned staging and its fallbacks, device digests, nccl.
//
// Tests tagged [gpu] need a CUDA device: where `cudaGetDeviceCount` finds none (or the build
// has no CUDA) they WARN the reason and return — never a fake pass, never a mock of CUDA.
// WEIGHTCAST_REQUIRE_GPU=1 (tests/gpu/gpu_check.sh sets it on a GPU host) makes that a failure:
// a driver too old for the toolkit (cudaErrorInsufficientDriver) must not pass as "no GPU".
// The others run everywhere: --version, the errors and fallbacks of a machine without a GPU,
// and the staging ring's pinning fallback driven through the Device interface.
#include "weightcast/io/detail/staging_ring.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/gpu_info.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/transport/transport.hpp"

#include "support/gpu.hpp"
#include "support/paths.hpp"
#include "support/process.hpp"
#include "support/report.hpp"
#include "support/safetensors_writer.hpp"

#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <optional>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

using namespace weightcast;
using namespace weightcast::test;

namespace {

// U8 tensors of the given sizes with random bytes, in one safetensors file.
std::filesystem::path write_checkpoint(const std::filesystem::path& dir,
                                       const std::vector<std::uint64_t>& sizes,
                                       std::uint64_t seed) {
  std::filesystem::create_directories(dir);
  return write_random_checkpoint(dir / "gpu.safetensors", sizes, seed);
}

// Sizes that make chunks of several pieces, a zero-size tensor, and one tensor larger than
// the 4 MiB read-back halves (digests of device arenas copy back in chunks).
std::vector<std::uint64_t> mixed_sizes() {
  std::vector<std::uint64_t> sizes{0, 1, 255, 256, 257, 4096, (20ull << 20) + 3};
  std::mt19937_64 rng(7);
  for (int i = 0; i < 40; ++i) sizes.push_back(rng() % 70000);
  return sizes;
}

// The same kinds of tensor (empty, one byte, around 256, several per chunk) in ~20 KB, for
// loads in tiny chunks.
std::vector<std::uint64_t> small_sizes() {
  std::vector<std::uint64_t> sizes{0, 1, 255, 256, 257, 4096};
  std::mt19937_64 rng(11);
  for (int i = 0; i < 12; ++i) sizes.push_back(rng() % 1500);
  return sizes;
}

// A device that forwards to another one but refuses to pin more than `pin_limit_bytes` at a
// time, the way the driver refuses under `ulimit -l`: drives the ring's fallback through the
// real Device interface (the inner device does the real work, host or cuda).
class PinLimitedDevice final : public Device {
 public:
  PinLimitedDevice(std::unique_ptr<Device> inner, std::uint64_t pin_limit_bytes)
      : _inner(std::move(inner)), _limit(pin_limit_bytes) {}
  [[nodiscard]] std::string_view name() const noexcept override { return _inner->name(); }
  std::shared_ptr<Arena> allocate_arena(std::uint64_t bytes) override {
    return _inner->allocate_arena(bytes);
  }
  std::unique_ptr<Pending> upload(const std::byte* source, std::byte* destination,
                                  std::uint64_t bytes) override {
    return _inner->upload(source, destination, bytes);
  }
  [[nodiscard]] bool wants_pinned_staging() const noexcept override { return true; }
  void pin(std::byte* host, std::uint64_t bytes) override {
    attempts.push_back(bytes);
    if (bytes > _limit) throw Error(Errc::unavailable, "refused: over the pin limit");
    if (_inner->wants_pinned_staging()) _inner->pin(host, bytes);
    pinned_bytes = bytes;
  }
  void unpin(std::byte* host) noexcept override {
    if (_inner->wants_pinned_staging()) _inner->unpin(host);
    ++unpins;
  }
  [[nodiscard]] void* upload_event() const noexcept override { return _inner->upload_event(); }

  std::vector<std::uint64_t> attempts;
  std::uint64_t pinned_bytes = 0;
  int unpins = 0;

 private:
  std::unique_ptr<Device> _inner;
  std::uint64_t _limit;
};

std::vector<std::uint64_t> host_digests(const std::filesystem::path& checkpoint) {
  LoadOptions options;
  options.chunk_bytes = 1 << 20;
  return tensor_digests(load(checkpoint, options));
}

}  // namespace

// ---- everywhere ------------------------------------------------------------------------

TEST_CASE("weightcast --version says what GPU support is compiled in and what was found", "[cli][gpu-info]") {
  const auto r = run_cli({"--version"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::StartsWith("weightcast ") && Catch::Contains("compiled in: ") &&
                        Catch::Contains("run time: "));
  if (built_with_cuda()) {
    // Whatever toolkit built it (CUDA 12 or 13 on the GPU hosts): "CUDA runtime 12.8".
    CHECK_THAT(r.out, Catch::Matches("[\\s\\S]*compiled in: CUDA runtime [0-9]+\\.[0-9]+ "
                                     "\\(headers\\), NCCL 2\\.[\\s\\S]*"));
    const CudaProbe probe = probe_cuda();
    // No runtime to load is no device too, and the line says what was looked for.
    if (probe.device_count == 0) {
      CHECK_THAT(r.out, Catch::Contains("no CUDA device (cuda") ||
                            Catch::Contains("no CUDA device (CUDA runtime (libcudart) not found"));
    }
    CHECK_THAT(r.out, Catch::Contains("\nloaded: "));
  } else {
    CHECK_THAT(r.out, Catch::Contains("no CUDA"));
  }
}

TEST_CASE("device: cuda without a usable GPU exits 69 saying why", "[run][gpu-info]") {
  if (cuda_device_count() > 0) {
    WARN("skipped: this machine has a CUDA device (the [gpu] tests cover device: cuda)");
    return;
  }
  const auto file = weightcast::test::small_checkpoint();
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set", "device=cuda"});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 69);
  CHECK_THAT(r.err, Catch::Contains("device: cuda: cuda:0: "));
  if (built_with_cuda()) {
    // A runtime that loads but finds no device or driver, or none to load.
    CHECK_THAT(r.err, Catch::Contains("no usable CUDA device (cuda") ||
                          Catch::Contains("no usable CUDA device (CUDA runtime (libcudart)"));
  } else {
    CHECK_THAT(r.err, Catch::Contains("this build has no CUDA"));
  }
}

TEST_CASE("device: auto without a GPU falls back to host with a notice", "[run][gpu-info]") {
  if (cuda_device_count() > 0) {
    WARN("skipped: this machine has a CUDA device, so auto picks it");
    return;
  }
  const auto file = weightcast::test::small_checkpoint();
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set", "device=auto"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.err, Catch::Contains("device: auto: using host memory: "));
  CHECK_THAT(r.out, Catch::Contains("device host"));
}

TEST_CASE("cuda and nccl factories without a GPU throw unavailable", "[gpu-info]") {
  if (cuda_device_count() > 0) {
    WARN("skipped: this machine has a CUDA device");
    return;
  }
  try {
    make_cuda_device(0);
    FAIL("make_cuda_device succeeded without a device");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Catch::Contains("cuda:0"));
  }
  CHECK(make_device(DeviceKind::automatic, 0)->name() == "host");
  if (!built_with_cuda()) {
    CHECK_THROWS_MATCHES(nccl_unique_id(), Error,
                         Catch::Matchers::Predicate<Error>([](const Error& e) {
                           return e.code() == Errc::unavailable &&
                                  std::string(e.what()).find("no CUDA") != std::string::npos;
                         }));
  }
}

TEST_CASE("cuda ordinal: the only visible device, else the local rank's, refused past the last",
          "[gpu-info][device]") {
  // One GPU per rank (Slurm --gpus-per-task=1, a per-rank CUDA_VISIBLE_DEVICES): every local
  // rank sees its own GPU as ordinal 0.
  for (int local_rank : {0, 1, 7, 63}) CHECK(cuda_ordinal_for_local_rank(local_rank, 1) == 0);
  // Every rank sees all of the node's GPUs: one each, by local rank.
  for (int local_rank = 0; local_rank < 8; ++local_rank) {
    CHECK(cuda_ordinal_for_local_rank(local_rank, 8) == local_rank);
  }
  CHECK(cuda_ordinal_for_local_rank(1, 2) == 1);
  // More ranks than visible GPUs: refused, not wrapped onto a GPU another rank has.
  const auto refused = [](int local_rank, int visible, const std::string& text) {
    INFO("local rank " << local_rank << ", " << visible << " visible");
    try {
      static_cast<void>(cuda_ordinal_for_local_rank(local_rank, visible));
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
      CHECK_THAT(e.what(), Catch::Contains(text));
    }
  };
  refused(2, 2, "local rank 2 but this process sees 2 CUDA devices (ordinals 0-1)");
  refused(9, 4, "CUDA_VISIBLE_DEVICES");
  refused(0, 0, "local rank 0: no CUDA device is visible");
  CHECK_THROWS_AS(cuda_ordinal_for_local_rank(-1, 4), Error);
}

TEST_CASE("WEIGHTCAST_REQUIRE_GPU=1 turns a missing GPU into a failing [gpu] test",
          "[gpu-info]") {
  // The switch's effect as a child process sees it: a [gpu] test on this machine, with and
  // without the variable. Where a GPU is usable both pass.
  if (cuda_device_count() > 0) {
    WARN("skipped: this machine has a usable CUDA device (the switch changes nothing here)");
    return;
  }
  const std::string test = "cuda: device digests copied back equal the host digests";
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto plain = run_process({self, test}, {"WEIGHTCAST_REQUIRE_GPU=0"});
  INFO(plain.out << plain.err);
  CHECK(plain.exit_status == 0);
  CHECK_THAT(plain.out, Catch::Contains("skipped: needs a CUDA device"));
  const auto required = run_process({self, test}, {"WEIGHTCAST_REQUIRE_GPU=1"});
  INFO(required.out << required.err);
  CHECK(required.exit_status != 0);
  CHECK_THAT(required.out, Catch::Contains("WEIGHTCAST_REQUIRE_GPU=1 but no usable CUDA device"));
}

TEST_CASE("staging ring: refused pinning retries with fewer slots, then pageable",
          "[staging][pinned]") {
  boost::asio::io_context context;
  const std::uint64_t slot = 1 << 20;
  SECTION("all slots pin") {
    PinLimitedDevice device(make_host_device(), 8 * slot);
    {
      detail::StagingRing ring(context.get_executor(), 8, slot, &device);
      CHECK(ring.slots() == 8);
      CHECK(ring.pinned());
      CHECK(device.attempts == std::vector<std::uint64_t>{8 * slot});
    }
    CHECK(device.unpins == 1);
  }
  SECTION("half the slots, then a quarter") {
    PinLimitedDevice device(make_host_device(), 2 * slot + 1);
    {
      detail::StagingRing ring(context.get_executor(), 8, slot, &device);
      CHECK(ring.slots() == 2);
      CHECK(ring.total_bytes() == 2 * slot);
      CHECK(ring.pinned());
      CHECK(device.attempts == std::vector<std::uint64_t>{8 * slot, 4 * slot, 2 * slot});
    }
    CHECK(device.unpins == 1);
  }
  SECTION("nothing pins: pageable staging, every slot kept") {
    PinLimitedDevice device(make_host_device(), 0);
    {
      detail::StagingRing ring(context.get_executor(), 5, slot, &device);
      CHECK(ring.slots() == 5);
      CHECK_FALSE(ring.pinned());
      CHECK(device.attempts == std::vector<std::uint64_t>{5 * slot, 2 * slot, 1 * slot});
    }
    CHECK(device.unpins == 0);
  }
  SECTION("a host device never pins") {
    auto device = make_host_device();
    detail::StagingRing ring(context.get_executor(), 3, slot, device.get());
    CHECK_FALSE(ring.pinned());
  }
}

TEST_CASE("a load whose pinning is refused still delivers every byte", "[loader][pinned]") {
  TempDir dir;
  const auto path = write_checkpoint(dir.path(), mixed_sizes(), 3);
  const auto reference = host_digests(path);
  for (std::uint64_t limit : {0ull, 64ull << 10, 1ull << 30}) {
    INFO("pin limit " << limit);
    PinLimitedDevice device(make_host_device(), limit);
    auto transport = make_local_transport();
    LoadOptions options;
    options.chunk_bytes = 64 << 10;
    options.buffer_depth = 4;
    const LoadResult result = load(open_checkpoint(path), device, *transport, options);
    CHECK(tensor_digests(result) == reference);
    CHECK(result.stats.staging_bytes <= 4 * (64 << 10));
  }
}

TEST_CASE("Arena::read_back hands host arena bytes over in place", "[device]") {
  auto arena = make_host_arena(1000);
  for (int i = 0; i < 1000; ++i) arena->data()[i] = static_cast<std::byte>(i);
  std::vector<std::byte> seen;
  arena->read_back(10, 20, [&](const std::byte* data, std::size_t bytes) {
    CHECK(data == arena->data() + 10);
    seen.insert(seen.end(), data, data + bytes);
  });
  REQUIRE(seen.size() == 20);
  CHECK(seen[0] == std::byte{10});
  CHECK_THROWS_AS(arena->read_back(990, 20, [](const std::byte*, std::size_t) {}), Error);
}

TEST_CASE("Transport::broadcast_group defaults to one broadcast per range", "[transport]") {
  class CountingTransport final : public Transport {
   public:
    [[nodiscard]] std::string_view name() const noexcept override { return "counting"; }
    [[nodiscard]] int rank() const noexcept override { return 0; }
    [[nodiscard]] int world_size() const noexcept override { return 1; }
    std::unique_ptr<Pending> broadcast(std::byte*, std::uint64_t bytes, int) override {
      seen.push_back(bytes);
      return nullptr;
    }
    std::vector<std::uint64_t> seen;
  } transport;
  std::byte memory[8];
  const Transport::Range ranges[] = {{memory, 3}, {memory + 3, 5}};
  CHECK(transport.broadcast_group(ranges, 0, nullptr) == nullptr);
  CHECK(transport.seen == std::vector<std::uint64_t>{3, 5});
}

// ---- [gpu]: need a CUDA device -----------------------------------------------------------

TEST_CASE("cuda: every real corpus file lands bit-exact in device memory", "[gpu][corpus]") {
  WEIGHTCAST_REQUIRE_GPU();
  const auto manifest = corpus_manifest();
  auto device = make_cuda_device(0);
  auto transport = make_local_transport();
  for (const auto& [file, tensors] : manifest.items()) {
    INFO("file " << file);
    LoadOptions options;
    options.chunk_bytes = 4096;
    options.buffer_depth = 3;
    options.tensor_alignment = 256;
    const LoadResult result =
        load(open_checkpoint(corpus_dir() / "real" / file), *device, *transport, options);
    CHECK(result.arena->kind() == MemoryKind::cuda);
    CHECK(result.stats.device == "cuda:0");
    const auto digests = tensor_digests(result);
    for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
      const TensorInfo& tensor = result.catalogue.tensors[i];
      INFO("tensor " << tensor.name);
      CHECK(result.tensor(i).memory == MemoryKind::cuda);
      CHECK(digest_hex(digests[i]) == tensors[tensor.name]["xxh3"].get<std::string>());
    }
  }
}

TEST_CASE("cuda: device digests copied back equal the host digests", "[gpu][digest]") {
  WEIGHTCAST_REQUIRE_GPU();
  TempDir dir;
  // Tiny chunks on a tiny checkpoint (a few hundred chunks, each several CUDA calls): the
  // ~21 MB one in 61-byte chunks would be ~700k chunks and overrun the GPU check's cap.
  const auto small = write_checkpoint(dir.path() / "small", small_sizes(), 5);
  const auto mixed = write_checkpoint(dir.path() / "mixed", mixed_sizes(), 5);
  auto device = make_cuda_device(0);
  auto transport = make_local_transport();
  struct Case {
    std::filesystem::path checkpoint;
    std::uint64_t chunk;
  };
  for (const Case& c : {Case{small, 61}, Case{mixed, 65536}, Case{mixed, 16ull << 20}}) {
    const auto reference = host_digests(c.checkpoint);
    for (std::uint64_t alignment : {1ull, 256ull}) {
      INFO(c.checkpoint.filename().string() << ": chunk " << c.chunk << " alignment " << alignment);
      LoadOptions options;
      options.chunk_bytes = c.chunk;
      options.tensor_alignment = alignment;
      const LoadResult result = load(open_checkpoint(c.checkpoint), *device, *transport, options);
      CHECK(tensor_digests(result) == reference);
    }
  }
}

TEST_CASE("cuda: staging slots are pinned, refused pinning falls back", "[gpu][pinned]") {
  WEIGHTCAST_REQUIRE_GPU();
  TempDir dir;
  const auto path = write_checkpoint(dir.path(), mixed_sizes(), 9);
  const auto reference = host_digests(path);
  {
    auto device = make_cuda_device(0);
    boost::asio::io_context context;
    detail::StagingRing ring(context.get_executor(), 4, 1 << 20, device.get());
    CHECK(ring.pinned());
    CHECK(ring.slots() == 4);
  }
  auto transport = make_local_transport();
  for (std::uint64_t limit : {0ull, 1ull << 20, 1ull << 30}) {
    INFO("pin limit " << limit);
    PinLimitedDevice device(make_cuda_device(0), limit);
    LoadOptions options;
    options.chunk_bytes = 1 << 20;
    options.buffer_depth = 4;
    const LoadResult result = load(open_checkpoint(path), device, *transport, options);
    CHECK(tensor_digests(result) == reference);
  }
}

TEST_CASE("cuda: device auto picks the GPU, LOCAL_RANK out of range is refused", "[gpu]") {
  WEIGHTCAST_REQUIRE_GPU();
  CHECK(make_device(DeviceKind::automatic, 0)->name() == "cuda:0");
  CHECK(make_device(DeviceKind::host, 0)->name() == "host");
  try {
    make_cuda_device(cuda_device_count());
    FAIL("a device ordinal past the last device was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Catch::Contains("no such device"));
  }
}

TEST_CASE("nccl: world size 1 broadcast delivers every byte", "[gpu][nccl]") {
  WEIGHTCAST_REQUIRE_GPU();
  TempDir dir;
  const auto path = write_checkpoint(dir.path(), mixed_sizes(), 13);
  const auto reference = host_digests(path);
  auto device = make_cuda_device(0);
  auto transport = make_nccl_transport(0, 1, 0, nccl_unique_id(), std::chrono::seconds(60));
  CHECK(transport->name() == "nccl");
  for (std::uint64_t alignment : {1ull, 256ull}) {
    LoadOptions options;
    options.chunk_bytes = 65536;
    options.tensor_alignment = alignment;
    const LoadResult result = load(open_checkpoint(path), *device, *transport, options);
    CHECK(result.stats.transport == "nccl");
    CHECK(tensor_digests(result) == reference);
  }
}

TEST_CASE("cuda, nccl: one visible GPU is every local rank's ordinal 0", "[gpu][nccl]") {
  WEIGHTCAST_REQUIRE_GPU();
  if (cuda_device_count() != 1) {
    WARN("skipped: needs exactly one visible CUDA device (CUDA_VISIBLE_DEVICES=0)");
    return;
  }
  // As under Slurm --gpus-per-task=1: local rank 3 sees its one GPU as ordinal 0.
  CHECK(make_device(DeviceKind::cuda, 3)->name() == "cuda:0");
  auto transport = make_nccl_transport(0, 1, 3, nccl_unique_id(), std::chrono::seconds(60));
  auto device = make_device(DeviceKind::cuda, 3);
  auto arena = device->allocate_arena(4096);
  const Transport::Range range{arena->data(), 4096};
  auto pending = transport->broadcast_group(std::span(&range, 1), 0, nullptr);
  while (pending && !pending->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
}

TEST_CASE("nccl: a broadcast outlives its transport, and one abandoned aborts the communicator",
          "[gpu][nccl]") {
  WEIGHTCAST_REQUIRE_GPU();
  auto device = make_cuda_device(0);
  auto arena = device->allocate_arena(16 << 20);
  const Transport::Range range{arena->data(), 16 << 20};
  {
    // Shared ownership: the pending broadcast keeps the communicator and comm stream.
    auto transport = make_nccl_transport(0, 1, 0, nccl_unique_id(), std::chrono::seconds(60));
    auto pending = transport->broadcast_group(std::span(&range, 1), 0, nullptr);
    transport.reset();
    REQUIRE(pending != nullptr);
    while (!pending->test()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  auto transport = make_nccl_transport(0, 1, 0, nccl_unique_id(), std::chrono::seconds(60));
  // Destroyed before it was seen to complete: the communicator is aborted and the comm
  // stream drained, so the arena may be freed; the transport says so from then on.
  transport->broadcast_group(std::span(&range, 1), 0, nullptr).reset();
  try {
    static_cast<void>(transport->broadcast_group(std::span(&range, 1), 0, nullptr));
    FAIL("a broadcast on an aborted communicator was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Catch::Contains("the communicator was aborted"));
  }
  arena.reset();
}

TEST_CASE("nccl: a peer that never joins times out with 75, nothing hangs", "[gpu][nccl]") {
  WEIGHTCAST_REQUIRE_GPU();
  const auto start = std::chrono::steady_clock::now();
  try {
    make_nccl_transport(0, 2, 0, nccl_unique_id(), std::chrono::seconds(3));
    FAIL("a communicator of 2 formed with one rank");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK((e.code() == Errc::timeout || e.code() == Errc::unavailable));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("run: device: cuda, report digests equal the manifest", "[gpu][run][corpus]") {
  WEIGHTCAST_REQUIRE_GPU();
  TempDir dir;
  const auto manifest = corpus_manifest();
  for (const auto& [file, tensors] : manifest.items()) {
    INFO("file " << file);
    const auto report_path = dir / "report.json";
    const auto r = run_corpus_file(file, report_path, {"device=cuda"});
    CHECK_THAT(r.out, Catch::Contains("device cuda:0"));
    check_report_matches_manifest(read_json(report_path), tensors);
  }
}
