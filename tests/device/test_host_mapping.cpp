// The host arena's and the staging ring's memory: 2 MiB aligned, zeroed, huge pages as the
// system's transparent huge page policy has them.
#include "support/paths.hpp"
#include "weightcast/device/detail/host_mapping.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/core/error.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

using weightcast::detail::huge_page_bytes;
using weightcast::detail::HostMapping;
using weightcast::test::read_file;

namespace {

bool aligned(const std::byte* p) {
  return reinterpret_cast<std::uintptr_t>(p) % huge_page_bytes == 0;
}

/// The `THPeligible:` value /proc/self/smaps gives the mapping that contains @p p, or -1.
int thp_eligible(const std::byte* p) {
  std::istringstream smaps(read_file("/proc/self/smaps"));
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= address && address < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

}  // namespace

TEST_CASE("a host mapping is zeroed, 2 MiB aligned, and can be shrunk and moved",
          "[host_mapping]") {
  const std::uint64_t bytes = 3 * huge_page_bytes + 4096;
  HostMapping memory(bytes, "a test mapping");
  REQUIRE(memory.bytes() == bytes);
  REQUIRE(aligned(memory.data()));
  CHECK(std::all_of(memory.data(), memory.data() + bytes,
                    [](std::byte b) { return b == std::byte{0}; }));
  std::fill(memory.data(), memory.data() + bytes, std::byte{0x5a});

  memory.shrink(huge_page_bytes);
  CHECK(memory.bytes() == huge_page_bytes);
  CHECK(memory.data()[huge_page_bytes - 1] == std::byte{0x5a});

  HostMapping moved(std::move(memory));
  CHECK(memory.data() == nullptr);
  CHECK(memory.bytes() == 0);
  REQUIRE(moved.bytes() == huge_page_bytes);
  CHECK(moved.data()[0] == std::byte{0x5a});

  HostMapping empty(0, "nothing");
  CHECK(empty.data() == nullptr);
  moved = std::move(empty);
  CHECK(moved.data() == nullptr);
}

TEST_CASE("host arenas take huge pages as the system's THP policy has them - never advised",
          "[host_mapping]") {
  const std::string setting = read_file("/sys/kernel/mm/transparent_hugepage/enabled");
  if (setting.empty() || setting.find("[never]") != std::string::npos) {
    WARN("transparent huge pages are off or absent here (" << setting << "): nothing to check");
    return;
  }
  auto arena = weightcast::make_host_arena(4 * huge_page_bytes);
  REQUIRE(aligned(arena->data()));
  // `always`: every aligned anonymous mapping is eligible; `madvise` (Debian's default): only
  // an advised one, and weightcast advises none (its faults cost several times more there).
  const bool always = setting.find("[always]") != std::string::npos;
  CHECK(thp_eligible(arena->data()) == (always ? 1 : 0));
}

TEST_CASE("a host mapping that cannot be mapped fails with 69 naming what it was for",
          "[host_mapping]") {
  try {
    HostMapping memory(std::uint64_t{1} << 62, "a host arena of 4 EiB");
    FAIL("mapped 4 EiB");
  } catch (const weightcast::Error& e) {
    CHECK(e.code() == weightcast::Errc::unavailable);
    CHECK(weightcast::exit_status(e.code()) == 69);
    CHECK_THAT(e.what(), Catch::Contains("cannot allocate a host arena of 4 EiB"));
  }
}

TEST_CASE("a host mapping within 2 MiB of 2^64 bytes fails with 69, not a small mapping",
          "[host_mapping]") {
  // The mapping asks for one huge page more than the size; near 2^64 that sum wrapped to
  // under 2 MiB, mmap(2) granted it, and an arena claiming 2^64 - 1 bytes came back.
  for (const std::uint64_t bytes : {~std::uint64_t{0}, ~std::uint64_t{0} - (1u << 20)}) {
    try {
      HostMapping memory(bytes, "a host arena near 2^64 bytes");
      FAIL("mapped " << memory.bytes() << " bytes");
    } catch (const weightcast::Error& e) {
      CHECK(e.code() == weightcast::Errc::unavailable);
      CHECK_THAT(e.what(), Catch::Contains("cannot allocate a host arena near 2^64 bytes"));
    }
  }
  try {
    const auto arena = weightcast::make_host_arena(~std::uint64_t{0});
    FAIL("an arena of " << arena->bytes() << " bytes");
  } catch (const weightcast::Error& e) {
    CHECK(e.code() == weightcast::Errc::unavailable);
  }
}
