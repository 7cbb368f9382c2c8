// Rank 0's mapping of a cached shard (io/detail/mapped_shard.hpp): the file's own bytes, pages
// released and read again, and a file that shrinks under the mapping: zeros and a count
// instead of a SIGBUS that ends the process.
#include "weightcast/io/detail/mapped_shard.hpp"

#include "weightcast/core/error.hpp"

#include "support/paths.hpp"

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

using namespace weightcast;
using weightcast::detail::MappedShard;

namespace {

constexpr std::size_t file_bytes = 64 * 4096 + 123;  // pages and a partial page

std::string pattern() {
  std::string bytes(file_bytes, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  return bytes;
}

// pattern() written to @p dir/shard.safetensors.
std::filesystem::path write_pattern(const test::TempDir& dir) {
  const auto path = dir / "shard.safetensors";
  const std::string bytes = pattern();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<long>(bytes.size()));
  return path;
}

struct OpenFile {
  explicit OpenFile(const std::filesystem::path& path) : fd(::open(path.c_str(), O_RDONLY)) {
    REQUIRE(fd >= 0);
  }
  ~OpenFile() { ::close(fd); }
  int fd;
};

}  // namespace

TEST_CASE("mapped shard: the mapping holds the file's bytes - also after pages are released",
          "[io][mapped]") {
  test::TempDir dir;
  const auto path = write_pattern(dir);
  const std::string bytes = pattern();
  OpenFile file(path);
  MappedShard map(file.fd, bytes.size(), "shard.safetensors");
  REQUIRE(map.size() == bytes.size());
  CHECK(std::memcmp(map.data(), bytes.data(), bytes.size()) == 0);
  // Released pages (one cut mid-page, as chunk boundaries are) read the same when touched
  // again; the page cache keeps them.
  map.release(5000, 20000);
  map.release(bytes.size() - 10, 10);
  CHECK(std::memcmp(map.data(), bytes.data(), bytes.size()) == 0);
  CHECK(map.truncated() == 0);
}

TEST_CASE("mapped shard: a file cut short under the mapping reads zeros past its new end and "
          "counts them - no SIGBUS", "[io][mapped]") {
  test::TempDir dir;
  const auto path = write_pattern(dir);
  const std::string bytes = pattern();
  OpenFile file(path);
  {
    MappedShard map(file.fd, bytes.size(), "shard.safetensors");
    std::filesystem::resize_file(path, 10 * 4096);
    // Before the cut: the file's bytes. Past it: what mmap(2) would raise SIGBUS for.
    CHECK(std::memcmp(map.data(), bytes.data(), 10 * 4096) == 0);
    std::uint64_t nonzero = 0;
    for (std::size_t i = 10 * 4096; i < bytes.size(); ++i) {
      nonzero += map.data()[i] != std::byte{0} ? 1 : 0;
    }
    CHECK(nonzero == 0);
    CHECK(map.truncated() == 55);  // pages 10 to 64: 54 whole and the partial last one
  }
  // A second mapping of the same file: its own count, from zero.
  MappedShard again(file.fd, bytes.size(), "shard.safetensors");
  CHECK(again.truncated() == 0);
  CHECK(std::memcmp(again.data(), bytes.data(), 10 * 4096) == 0);
  CHECK(again.data()[20 * 4096] == std::byte{0});
  CHECK(again.truncated() == 1);
}

TEST_CASE("mapped shard: an empty file maps to nothing", "[io][mapped]") {
  test::TempDir dir;
  const auto path = dir / "empty.safetensors";
  std::ofstream(path, std::ios::binary).flush();
  OpenFile file(path);
  MappedShard map(file.fd, 0, "empty.safetensors");
  CHECK(map.data() == nullptr);
  CHECK(map.size() == 0);
  map.release(0, 100);
  CHECK(map.truncated() == 0);
}

// The loader catches this and reads the shard instead (map_cached_shards); that fallback
// needs a placed load on several ranks holding 1024 mappings, which no test makes.
TEST_CASE("mapped shard: past 1024 live mappings one more is refused with 69 naming the shard",
          "[io][mapped]") {
  test::TempDir dir;
  const auto path = write_pattern(dir);
  OpenFile file(path);
  std::vector<std::unique_ptr<MappedShard>> maps;
  for (int i = 0; i < 1024; ++i) {
    maps.push_back(std::make_unique<MappedShard>(file.fd, 4096, "shard.safetensors"));
  }
  try {
    MappedShard one_more(file.fd, 4096, "shard.safetensors");
    FAIL("a 1025th mapping was made");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Catch::Matchers::Contains("shard.safetensors") &&
                             Catch::Matchers::Contains("1024 shards are mapped already"));
  }
  maps.pop_back();  // a free entry again
  MappedShard again(file.fd, 4096, "shard.safetensors");
  CHECK(std::memcmp(again.data(), pattern().data(), 4096) == 0);
}
