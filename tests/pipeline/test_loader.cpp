// The pipeline on real files: every corpus tensor lands bit-exact, whatever the chunking.
#include "weightcast/pipeline/async_load.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"

#include "support/host_load.hpp"
#include "support/paths.hpp"
#include "support/report.hpp"
#include "support/safetensors_writer.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <fcntl.h>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <stop_token>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace weightcast;
using weightcast::test::corpus_dir;
using weightcast::test::corpus_manifest;
using weightcast::test::TempDir;

namespace {

void check_against_manifest(const LoadResult& result, const nlohmann::json& expected) {
  REQUIRE(result.catalogue.tensors.size() == expected.size());
  const auto digests = tensor_digests(result);
  for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
    const TensorInfo& tensor = result.catalogue.tensors[i];
    INFO("tensor " << tensor.name);
    REQUIRE(expected.contains(tensor.name));
    CHECK(digest_hex(digests[i]) == expected[tensor.name]["xxh3"].get<std::string>());
  }
}

// A safetensors file of `count` U8 tensors of random sizes (0 to 20000 bytes) with random
// bytes, the data 8-byte aligned.
std::filesystem::path write_random_checkpoint(const std::filesystem::path& dir, int count,
                                              std::uint64_t seed) {
  return test::write_random_checkpoint(
      dir / "random.safetensors", count, seed, [](std::mt19937_64& rng, int) {
        return std::uniform_int_distribution<std::uint64_t>(0, 20000)(rng);
      });
}

// Sends this process's stderr (fd 2) to a file until finish(): what the library prints there.
class StderrCapture {
 public:
  explicit StderrCapture(std::filesystem::path path) : _path(std::move(path)) {
    std::fflush(stderr);
    _saved = dup(STDERR_FILENO);
    REQUIRE(_saved >= 0);
    const int fd = ::open(_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  ~StderrCapture() { restore(); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;

  /// Restores stderr. @return what was written to it meanwhile.
  std::string finish() {
    restore();
    return test::read_file(_path);
  }

 private:
  void restore() {
    if (_saved < 0) return;
    std::fflush(stderr);
    dup2(_saved, STDERR_FILENO);
    ::close(_saved);
    _saved = -1;
  }

  std::filesystem::path _path;
  int _saved = -1;
};

// Four 8 KiB tensors: with 4 KiB chunks, chunk c holds half of tensor c / 2.
std::filesystem::path write_four_tensors(const std::filesystem::path& dir) {
  return test::write_random_checkpoint(dir / "random.safetensors", {8192, 8192, 8192, 8192}, 7);
}

}  // namespace

TEST_CASE("every real corpus file loads bit-exact against the manifest", "[loader][corpus]") {
  const auto manifest = corpus_manifest();
  REQUIRE(manifest.size() >= 20);
  for (const auto& [file, tensors] : manifest.items()) {
    INFO("file " << file);
    LoadOptions options;
    options.chunk_bytes = 4096;
    options.buffer_depth = 2;
    const LoadResult result = load(corpus_dir() / "real" / file, options);
    check_against_manifest(result, tensors);
    CHECK(result.stats.bytes == result.catalogue.total_bytes());
  }
}

TEST_CASE("tiny chunks, shallow and deep rings all deliver the same bytes", "[loader]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 60, 42);
  LoadOptions reference_options;
  reference_options.chunk_bytes = 1 << 20;
  const auto reference = tensor_digests(load(path, reference_options));
  for (std::uint64_t chunk : {61ull, 4096ull, 65537ull}) {
    for (std::uint32_t depth : {1u, 2u, 5u}) {
      for (std::uint32_t io_depth : {1u, 3u}) {
        INFO("chunk " << chunk << " depth " << depth << " io_depth " << io_depth);
        LoadOptions options;
        options.chunk_bytes = chunk;
        options.buffer_depth = depth;
        options.io_depth = io_depth;
        options.tensor_alignment = chunk == 61 ? 256 : 1;  // non-contiguous chunks too
        const LoadResult result = load(path, options);
        REQUIRE(tensor_digests(result) == reference);
        REQUIRE(result.stats.staging_bytes <= depth * ((std::min<std::uint64_t>(chunk, 1 << 20) + 4095) / 4096 * 4096));
      }
    }
  }
}

TEST_CASE("one-byte chunks deliver the same bytes", "[loader]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 4, 11);
  const auto reference = tensor_digests(load(path));
  LoadOptions options;
  options.chunk_bytes = 1;
  options.buffer_depth = 3;
  CHECK(tensor_digests(load(path, options)) == reference);
}

TEST_CASE("LoadOptions out of the config's bounds are config errors naming the field",
          "[loader]") {
  // An embedder sets LoadOptions directly: io_depth 100000 fell back to a pread pool with a
  // false "io_uring unavailable", stalled 7 s starting threads, then failed as a bug (70).
  TempDir dir;
  const Catalogue catalogue = open_checkpoint(write_random_checkpoint(dir.path(), 2, 3));
  struct Case {
    std::function<void(LoadOptions&)> set;
    std::string says;
  };
  const std::vector<Case> cases = {
      {[](LoadOptions& o) { o.io_depth = 100000; },
       "LoadOptions::io_depth: io_depth: '100000' is out of range (must be 1 to 4096"},
      {[](LoadOptions& o) { o.io_depth = 0; }, "LoadOptions::io_depth: io_depth: '0' is out"},
      {[](LoadOptions& o) { o.buffer_depth = 0; },
       "LoadOptions::buffer_depth: buffer_depth: '0' is out"},
      {[](LoadOptions& o) { o.chunk_bytes = 0; }, "LoadOptions::chunk_bytes: chunk_size: '0' is out"},
      {[](LoadOptions& o) { o.tensor_alignment = 3; }, "must be a power of two"},
      {[](LoadOptions& o) { o.tensor_alignment = 0; }, "LoadOptions::tensor_alignment is 0"},
      {[](LoadOptions& o) { o.timeout = std::chrono::milliseconds(-1); },
       "LoadOptions::timeout: timeout: '-1ms' is out of range (must be at least 1ms"},
  };
  for (const Case& c : cases) {
    INFO(c.says);
    LoadOptions options;
    c.set(options);
    const Error e = test::expect_host_load_error(catalogue, options);
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Catch::Contains(c.says));
  }
}

TEST_CASE("on_tensor_ready fires once per tensor, after its bytes landed", "[loader]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 30, 9);
  const auto expected = tensor_digests(load(path));
  std::map<std::string, std::uint64_t> seen;
  LoadOptions options;
  options.chunk_bytes = 3000;
  options.on_tensor_ready = [&](const TensorView& view) {
    REQUIRE(seen.count(view.info->name) == 0);
    seen[view.info->name] = xxh3_64(view.data, view.info->bytes);
  };
  const LoadResult result = load(path, options);
  REQUIRE(seen.size() == result.catalogue.tensors.size());
  for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
    CHECK(seen[result.catalogue.tensors[i].name] == expected[i]);
  }
}

TEST_CASE("an exception thrown by a hook fails the load and leaves load as thrown",
          "[loader]") {
  // loader.hpp: the stages stop, reads in flight are waited for, and the hook's own
  // exception reaches the caller, whichever stage's thread called the hook.
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 30, 9);
  struct Thrown {
    int hook;
  };
  for (int hook = 0; hook < 4; ++hook) {
    INFO("hook " << hook);
    LoadOptions options;
    options.chunk_bytes = 3000;
    options.direct_io = DirectIo::off;
    int calls = 0;
    if (hook == 0) options.on_tensor_ready = [&](const TensorView&) { throw Thrown{0}; };
    if (hook == 1) options.on_progress = [&](const LoadProgress&) { throw Thrown{1}; };
    for (const Stage stage : {Stage::read, Stage::broadcast}) {
      if (hook != 2 + static_cast<int>(stage == Stage::broadcast)) continue;
      options.on_stage_event = [&, stage](const StageEvent& event) {
        if (event.stage == stage && ++calls == 3) throw Thrown{hook};
      };
    }
    try {
      load(path, options);
      FAIL("the load did not throw");
    } catch (const Thrown& thrown) {
      CHECK(thrown.hook == hook);
    }
  }
}

TEST_CASE("LoadOptions::stop ends a load in progress with interrupted (130)", "[loader][signal]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 30, 5);
  const Catalogue catalogue = open_checkpoint(path);
  std::stop_source stop;
  LoadOptions options;
  options.chunk_bytes = 512;  // many chunks: the stop comes with most still to read
  options.stop = stop.get_token();
  std::uint64_t chunks_landed = 0;
  std::uint64_t chunks_total = 0;
  options.on_progress = [&](const LoadProgress& progress) {
    chunks_total = progress.chunks_total;
    if (++chunks_landed == 2) stop.request_stop();  // from the loader's own thread
  };
  const Error e = test::expect_host_load_error(catalogue, options);
  CHECK(e.code() == Errc::interrupted);
  CHECK(exit_status(e.code()) == 130);
  CHECK_THAT(e.what(), Catch::Contains("stopped"));
  REQUIRE(chunks_total > 10);
  CHECK(chunks_landed < chunks_total);  // it stopped, rather than finishing
}

TEST_CASE("LoadOptions::stop from another thread ends a stalled load at once, and a stop "
          "requested before the load ends it before it starts", "[loader][signal]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 30, 6);
  const Catalogue catalogue = open_checkpoint(path);
  {
    std::stop_source stop;
    stop.request_stop();
    LoadOptions options;
    options.stop = stop.get_token();
    bool landed = false;
    options.on_progress = [&](const LoadProgress&) { landed = true; };
    CHECK(test::expect_host_load_error(catalogue, options).code() == Errc::interrupted);
    CHECK_FALSE(landed);
  }
  // Each landed chunk sleeps 50 ms on the loader's thread, so the load would take seconds;
  // the stop comes from this thread while it runs.
  std::stop_source stop;
  LoadOptions options;
  options.chunk_bytes = 512;
  options.stop = stop.get_token();
  options.on_progress = [](const LoadProgress&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  };
  auto loading = std::async(std::launch::async, [&] {
    return test::expect_host_load_error(catalogue, options);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  stop.request_stop();
  const Error e = loading.get();
  CHECK(e.code() == Errc::interrupted);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500));
}

TEST_CASE("a shard truncated after its header was read fails with 74 naming the tensor",
          "[loader]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 10, 3);
  Catalogue catalogue = open_checkpoint(path);
  const TensorInfo* victim = nullptr;
  for (const auto& t : catalogue.tensors) {
    if (t.bytes > 100) victim = &t;  // the last sizeable tensor
  }
  REQUIRE(victim != nullptr);
  const std::string victim_name = victim->name;
  // Cut the file in the middle of that tensor, and make the catalogue's size agree so the
  // reader itself meets the end of file.
  const std::uint64_t cut = victim->file_offset + victim->bytes / 2;
  test::truncate_shard(catalogue, cut);
  LoadOptions options;
  options.chunk_bytes = 4096;
  const Error e = test::expect_host_load_error(catalogue, options);
  CHECK(e.code() == Errc::io);
  CHECK_THAT(e.what(), Catch::Contains("'" + victim_name + "'") &&
                           Catch::Contains("random.safetensors") && Catch::Contains("shrank"));
}

TEST_CASE("a shard that shrinks mid-load fails once with 74, every slot returned once",
          "[loader]") {
  // The read stage waits for a free slot while the others hold them; the failing read ends
  // every stage, and each lease must go back to the ring exactly once.
  const auto depth = GENERATE(1u, 2u, 3u);
  const auto reader = GENERATE(ReaderKind::pread, ReaderKind::automatic);
  INFO("buffer_depth " << depth << ", reader " << static_cast<int>(reader));
  TempDir dir;
  const auto path = write_four_tensors(dir.path());
  const Catalogue catalogue = open_checkpoint(path);
  // Cut inside tensor 2 (chunks 4 and 5): when chunk 0's read completes, at most chunks
  // 0 to depth - 1 have been submitted, so the reader meets the new end of file.
  const std::uint64_t cut = catalogue.tensors[2].file_offset + 100;
  LoadOptions options;
  options.chunk_bytes = 4096;
  options.buffer_depth = depth;
  options.io_depth = 1;
  options.reader = reader;
  options.direct_io = DirectIo::off;
  bool cut_done = false;
  options.on_stage_event = [&](const StageEvent& event) {
    if (event.stage != Stage::read || event.chunk != 0 || cut_done) return;
    std::filesystem::resize_file(path, cut);
    cut_done = true;
  };
  StderrCapture capture(dir.path() / "stderr.txt");
  const Error error = test::expect_host_load_error(catalogue, options);
  const std::string log = capture.finish();
  INFO("stderr:\n" << log);
  REQUIRE(cut_done);
  CHECK(error.code() == Errc::io);
  CHECK_THAT(error.what(), Catch::Contains("random.safetensors") &&
                                Catch::Contains("'" + catalogue.tensors[2].name + "'") &&
                                Catch::Contains("shrank"));
  CHECK(log.find("internal error") == std::string::npos);
}

TEST_CASE("a read that starts past a shard's new end reports where the file ends", "[loader]") {
  const auto direct = GENERATE(DirectIo::off, DirectIo::on);
  // Cut just before chunk 2 (tensor 1), inside tensor 0; or to nothing, inside the header.
  const bool to_nothing = GENERATE(false, true);
  INFO("direct_io " << static_cast<int>(direct) << ", cut to nothing " << to_nothing);
  TempDir dir;
  const auto path = write_four_tensors(dir.path());
  const Catalogue catalogue = open_checkpoint(path);
  // One slot: chunk 2 is submitted only after chunk 1's read has completed and been
  // uploaded, so its read starts past the end.
  const std::uint64_t cut = to_nothing ? 0 : catalogue.tensors[1].file_offset - 10;
  LoadOptions options;
  options.chunk_bytes = 4096;
  options.buffer_depth = 1;
  options.reader = ReaderKind::pread;
  options.direct_io = direct;
  bool cut_done = false;
  options.on_stage_event = [&](const StageEvent& event) {
    if (event.stage != Stage::read || event.chunk != 1 || cut_done) return;
    std::filesystem::resize_file(path, cut);
    cut_done = true;
  };
  const Error error = test::expect_host_load_error(catalogue, options);
  if (direct == DirectIo::on && std::string(error.what()).find("O_DIRECT") != std::string::npos) {
    WARN("the temporary directory's filesystem refuses O_DIRECT: " << error.what());
    return;
  }
  INFO(error.what());
  REQUIRE(cut_done);
  CHECK(error.code() == Errc::io);
  // It said the file ended "inside tensor 't1'", the tensor being read, and for a file cut to
  // nothing "at offset 0 inside tensor ...": offset 0 is in the header.
  const std::string where =
      to_nothing ? "file ended at offset 0, inside its header, while reading tensor '" +
                       catalogue.tensors[1].name + "'"
                 : fmt::format("file ended at offset {} inside tensor '{}', while reading "
                               "tensor '{}'",
                               cut, catalogue.tensors[0].name, catalogue.tensors[1].name);
  CHECK_THAT(error.what(), Catch::Contains(where));
}

TEST_CASE("a shard modified in place during the load fails with 74 naming it", "[loader]") {
  const auto reader = GENERATE(ReaderKind::pread, ReaderKind::automatic);
  TempDir dir;
  const auto path = write_four_tensors(dir.path());
  const Catalogue catalogue = open_checkpoint(path);
  LoadOptions options;
  options.chunk_bytes = 4096;
  options.buffer_depth = 1;
  options.reader = reader;
  bool modified = false;
  options.on_stage_event = [&](const StageEvent& event) {
    if (event.stage != Stage::read || event.chunk != 0 || modified) return;
    // Overwrite 4 KiB of tensor 2, not read yet: same size, different bytes.
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const std::vector<char> junk(4096, '\x5a');
    REQUIRE(::pwrite(fd, junk.data(), junk.size(),
                     static_cast<off_t>(catalogue.tensors[2].file_offset)) == 4096);
    struct stat st {};
    REQUIRE(::fstat(fd, &st) == 0);
    // Move the modification time on by a whole second, whatever the write did to it: the
    // test does not depend on the filesystem's timestamp granularity.
    timespec times[2] = {{0, UTIME_OMIT}, st.st_mtim};
    times[1].tv_sec += 1;
    REQUIRE(::futimens(fd, times) == 0);
    ::close(fd);
    modified = true;
  };
  const Error error = test::expect_host_load_error(catalogue, options);
  REQUIRE(modified);
  INFO(error.what());
  CHECK(error.code() == Errc::io);
  CHECK_THAT(error.what(), Catch::Contains("random.safetensors") &&
                                Catch::Contains("changed during the load"));
}

TEST_CASE("a shard whose size changed before the load is refused with 74", "[loader]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 5, 4);
  Catalogue catalogue = open_checkpoint(path);
  std::filesystem::resize_file(path, catalogue.shards[0].file_bytes - 1);
  const Error e = test::expect_host_load_error(catalogue);
  CHECK(e.code() == Errc::io);
  CHECK_THAT(e.what(), Catch::Contains("changed since its header was read"));
}

TEST_CASE("a shard replaced by another file of its size before the load is refused with 74",
          "[loader]") {
  // The catalogue read the shard inside the checkpoint directory; replaced by a symlink to a
  // file outside it (or renamed over) before rank 0 opened it for the load, the other file's
  // bytes loaded with exit 0. Each case keeps the file whose header was read alive (moved
  // aside, not deleted), so its inode number cannot be given to the replacement: the case
  // tests the identity check, not the filesystem's inode allocator.
  const bool rename = GENERATE(false, true);
  INFO((rename ? "renamed over" : "relinked"));
  TempDir dir;
  std::filesystem::create_directory(dir / "ckpt");
  const auto original = write_random_checkpoint(dir.path(), 5, 4);
  const auto swapped = dir / "ckpt" / "model.safetensors";
  std::filesystem::copy_file(original, swapped);
  Catalogue catalogue = open_checkpoint(dir / "ckpt");
  // Same size and header, other bytes, outside the directory.
  std::string bytes;
  {
    std::ifstream in(original, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes.back() = static_cast<char>(bytes.back() ^ 0x5a);
  test::write_file(dir / "outside.safetensors", bytes);
  std::filesystem::rename(swapped, dir / "read.safetensors");  // keeps its inode in use
  if (rename) {
    std::filesystem::copy_file(dir / "outside.safetensors", dir / "ckpt" / "tmp");
    std::filesystem::rename(dir / "ckpt" / "tmp", swapped);
  } else {
    std::filesystem::create_symlink(dir / "outside.safetensors", swapped);
  }
  const Error e = test::expect_host_load_error(catalogue);
  CHECK(e.code() == Errc::io);
  CHECK_THAT(e.what(), Catch::Contains("model.safetensors: shard changed since its header "
                                       "was read") &&
                           Catch::Contains("is now another file"));
}

TEST_CASE("a shard rewritten in place (same inode, same size) before the load is refused with "
          "74",
          "[loader]") {
  // Truncated and written again with other bytes of the same length: device, inode and size
  // are what the header read saw, so only the file's times tell (a replacement that reused
  // the inode number looks the same).
  const bool restore_mtime = GENERATE(false, true);
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 5, 4);
  const Catalogue catalogue = open_checkpoint(path);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes.back() = static_cast<char>(bytes.back() ^ 0x5a);
  struct stat before {};
  REQUIRE(::stat(path.c_str(), &before) == 0);
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  struct stat after {};
  REQUIRE(::fstat(fd, &after) == 0);
  if (restore_mtime) {
    INFO("modification time put back, as cp -p or rsync -t would");
    timespec times[2] = {{0, UTIME_OMIT}, before.st_mtim};
    REQUIRE(::futimens(fd, times) == 0);
    // The status-change time is the kernel's to set; on a coarse clock it may not have moved
    // yet. Touch the inode (same mode) until it has, at most 2 s.
    for (int i = 0; i < 200; ++i) {
      REQUIRE(::fstat(fd, &after) == 0);
      if (after.st_ctim.tv_sec != before.st_ctim.tv_sec ||
          after.st_ctim.tv_nsec != before.st_ctim.tv_nsec) {
        break;
      }
      ::usleep(10'000);
      REQUIRE(::fchmod(fd, before.st_mode & 07777) == 0);
    }
  } else {
    // Move the modification time on by a whole second: the test does not depend on the
    // filesystem's timestamp granularity.
    timespec times[2] = {{0, UTIME_OMIT}, before.st_mtim};
    times[1].tv_sec += 1;
    REQUIRE(::futimens(fd, times) == 0);
  }
  ::close(fd);
  REQUIRE(::stat(path.c_str(), &after) == 0);
  REQUIRE(after.st_ino == before.st_ino);
  REQUIRE(after.st_size == before.st_size);
  const Error e = test::expect_host_load_error(catalogue);
  INFO(e.what());
  CHECK(e.code() == Errc::io);
  CHECK_THAT(e.what(), Catch::Contains("random.safetensors: shard changed since its header was "
                                       "read") &&
                           Catch::Contains(restore_mtime ? "status-change time"
                                                         : "modification time"));
}

TEST_CASE("load_async and the coroutine form give the same bytes as load", "[loader]") {
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 20, 5);
  const auto expected = tensor_digests(load(path));
  auto future = load_async(path);
  CHECK(tensor_digests(future.get()) == expected);

  boost::asio::io_context context;
  auto device = make_host_device();
  auto transport = make_local_transport();
  std::optional<LoadResult> result;
  boost::asio::co_spawn(context, async_load(open_checkpoint(path), *device, *transport),
                        [&](std::exception_ptr e, LoadResult r) {
                          REQUIRE(!e);
                          result.emplace(std::move(r));
                        });
  context.run();
  REQUIRE(result);
  CHECK(tensor_digests(*result) == expected);
}

TEST_CASE("the coroutine form loads on an executor that runs on several threads", "[loader]") {
  // A trainer's io_context run by a pool of threads: the stages must still run one at a
  // time (they share the pipeline's state), else they race and crash or lose chunks.
  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 40, 9);
  const auto expected = tensor_digests(load(path));
  auto device = make_host_device();
  auto transport = make_local_transport();
  for (int round = 0; round < 5; ++round) {
    boost::asio::thread_pool pool(4);
    LoadOptions options;
    options.chunk_bytes = 61;
    std::promise<LoadResult> promise;
    boost::asio::co_spawn(pool, async_load(open_checkpoint(path), *device, *transport, options),
                          [&](std::exception_ptr e, LoadResult r) {
                            if (e) {
                              promise.set_exception(e);
                            } else {
                              promise.set_value(std::move(r));
                            }
                          });
    pool.join();
    CHECK(tensor_digests(promise.get_future().get()) == expected);
  }
}

TEST_CASE("rank 0 keeps two broadcasts in flight and lands each chunk in plan order",
          "[loader][transport]") {
  // A root of a world of 2 whose broadcasts complete on their third poll: what the pipeline
  // posts and when it sees each land, without a peer (no MPI or NCCL stand-in: nothing is
  // sent; rank 0's arena is the source and is checked as it is).
  struct Ledger {
    int in_flight = 0;
    int most_in_flight = 0;
    std::vector<std::uint64_t> posted;  // bytes of each broadcast, in posting order
    std::size_t completed = 0;
  };
  class ThirdPoll final : public Pending {
   public:
    explicit ThirdPoll(Ledger& ledger) : _ledger(ledger) {}
    bool test() override {
      if (++_polls < 3) return false;
      if (!_done) {
        _done = true;
        --_ledger.in_flight;
        ++_ledger.completed;
      }
      return true;
    }

   private:
    Ledger& _ledger;
    int _polls = 0;
    bool _done = false;
  };
  class RootOfTwo final : public Transport {
   public:
    explicit RootOfTwo(Ledger& ledger) : _ledger(ledger) {}
    [[nodiscard]] std::string_view name() const noexcept override { return "root-of-two"; }
    [[nodiscard]] int rank() const noexcept override { return 0; }
    [[nodiscard]] int world_size() const noexcept override { return 2; }
    std::unique_ptr<Pending> broadcast(std::byte*, std::uint64_t bytes, int root) override {
      REQUIRE(root == 0);
      _ledger.posted.push_back(bytes);
      _ledger.most_in_flight = std::max(_ledger.most_in_flight, ++_ledger.in_flight);
      return std::make_unique<ThirdPoll>(_ledger);
    }

   private:
    Ledger& _ledger;
  };

  TempDir dir;
  const auto path = write_random_checkpoint(dir.path(), 40, 12);
  const auto expected = tensor_digests(load(path));
  Ledger ledger;
  RootOfTwo transport(ledger);
  auto device = make_host_device();
  LoadOptions options;
  options.chunk_bytes = 20000;
  options.buffer_depth = 4;
  std::vector<std::uint64_t> landed;  // chunks_done at each progress report
  options.on_progress = [&](const LoadProgress& progress) {
    // A chunk is reported landed only after its broadcast completed.
    CHECK(ledger.completed == progress.chunks_done);
    landed.push_back(progress.chunks_done);
  };
  const LoadResult result = load(open_checkpoint(path), *device, transport, options);
  CHECK(tensor_digests(result) == expected);
  REQUIRE(landed.size() == result.stats.chunks);
  for (std::size_t i = 0; i < landed.size(); ++i) CHECK(landed[i] == i + 1);
  CHECK(ledger.in_flight == 0);
  // Two posted at once, never more: the next chunk's broadcast is queued while one completes.
  CHECK(ledger.most_in_flight == 2);
  std::uint64_t posted_bytes = 0;
  for (std::uint64_t bytes : ledger.posted) posted_bytes += bytes;
  CHECK(posted_bytes == result.stats.bytes);
}
