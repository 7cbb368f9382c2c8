// 64-bit offsets: a sparse checkpoint larger than 4 GiB whose last tensor starts past 2^32
// loads bit-exact. Only the touched pages exist on disk.
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/pipeline/loader.hpp"

#include "support/paths.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <xxhash.h>

#include <fcntl.h>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

using namespace weightcast;

TEST_CASE("a sparse checkpoint over 4 GiB with a tensor past 2^32 loads bit-exact",
          "[loader][large]") {
  test::TempDir dir;
  const auto path = dir / "sparse.safetensors";
  const std::uint64_t hole_bytes = (std::uint64_t{1} << 32) + 4099;  // odd, crosses 2^32
  const std::uint64_t tail_bytes = 70001;
  std::string header = fmt::format(
      R"({{"hole":{{"dtype":"U8","shape":[{}],"data_offsets":[0,{}]}},)"
      R"("tail":{{"dtype":"U8","shape":[{}],"data_offsets":[{},{}]}}}})",
      hole_bytes, hole_bytes, tail_bytes, hole_bytes, hole_bytes + tail_bytes);
  const std::uint64_t n = header.size();  // unpadded on purpose: odd data offset

  std::string tail(tail_bytes, '\0');
  std::mt19937_64 rng(99);
  for (auto& c : tail) c = static_cast<char>(rng());

  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, &n, 8, 0) == 8);
  REQUIRE(::pwrite(fd, header.data(), n, 8) == static_cast<ssize_t>(n));
  const std::uint64_t tail_offset = 8 + n + hole_bytes;
  REQUIRE(tail_offset > (std::uint64_t{1} << 32));
  REQUIRE(::pwrite(fd, tail.data(), tail.size(), static_cast<off_t>(tail_offset)) ==
          static_cast<ssize_t>(tail.size()));
  ::close(fd);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  REQUIRE(static_cast<std::uint64_t>(st.st_size) == tail_offset + tail_bytes);
  INFO("allocated on disk: " << st.st_blocks * 512 << " bytes");

  LoadOptions options;
  options.chunk_bytes = 64ull << 20;
  const LoadResult result = load(path, options);
  REQUIRE(result.catalogue.tensors.size() == 2);
  const auto tail_view = result.find("tail");
  REQUIRE(tail_view);
  CHECK(tail_view->info->file_offset == tail_offset);
  CHECK(xxh3_64(tail_view->data, tail_bytes) == xxh3_64(tail.data(), tail.size()));

  // The hole reads back as zeros: hash the arena against a zero stream.
  const auto hole_view = result.find("hole");
  REQUIRE(hole_view);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::string zeros(1 << 20, '\0');
  for (std::uint64_t done = 0; done < hole_bytes; done += zeros.size()) {
    XXH3_64bits_update(state, zeros.data(), std::min<std::uint64_t>(zeros.size(), hole_bytes - done));
  }
  CHECK(xxh3_64(hole_view->data, hole_bytes) == XXH3_64bits_digest(state));
  XXH3_freeState(state);
}
