// UniqueFd, the library's one owner of a file descriptor, and read_regular_file, the one reader
// of a whole small file that must be a regular one (an index, a config file).
#include "weightcast/core/detail/regular_file.hpp"
#include "weightcast/core/detail/unique_fd.hpp"

#include "support/expect_error.hpp"
#include "support/paths.hpp"

#include <catch2/catch.hpp>

#include <cerrno>
#include <fcntl.h>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

using weightcast::Errc;
using weightcast::detail::RegularFileNames;
using weightcast::detail::UniqueFd;
using weightcast::test::expect_error;
using weightcast::test::TempDir;

namespace {

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("UniqueFd closes what it owns once, and gives it up on release or move", "[core]") {
  int raw = -1;
  {
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    REQUIRE(fd.get() >= 0);
    raw = fd.get();
    CHECK(static_cast<bool>(fd));
    UniqueFd moved(std::move(fd));
    CHECK(moved.get() == raw);
    CHECK(fd.get() == -1);  // NOLINT(bugprone-use-after-move): a moved-from owner owns nothing
    CHECK(is_open(raw));
  }
  CHECK_FALSE(is_open(raw));

  UniqueFd kept(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int released = kept.release();
  CHECK(kept.get() == -1);
  { UniqueFd gone(std::move(kept)); }
  CHECK(is_open(released));  // released: the owner's end did not close it
  ::close(released);

  UniqueFd closing(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const int closed = closing.get();
  CHECK(closing.close() == 0);
  CHECK_FALSE(is_open(closed));
  CHECK(closing.close() == 0);  // nothing owned any more: no second close(2)
}

TEST_CASE("read_regular_file reads a whole file, and tells a file over the limit by one byte "
          "more",
          "[core]") {
  TempDir dir;
  const RegularFileNames names{"", "test file", "not a test file", Errc::config};
  write_text(dir / "small", "hello");
  CHECK(weightcast::detail::read_regular_file(dir / "small", names, 16) == "hello");
  CHECK(weightcast::detail::read_regular_file(dir / "small", names, 5) == "hello");
  // Over the limit: max_bytes + 1 bytes, however large the file is.
  CHECK(weightcast::detail::read_regular_file(dir / "small", names, 3) == "hell");
  write_text(dir / "empty", "");
  CHECK(weightcast::detail::read_regular_file(dir / "empty", names, 3).empty());
  // A file whose st_size says 0 but which holds bytes (procfs) is read to its end.
  CHECK(!weightcast::detail::read_regular_file("/proc/self/status", names, 1 << 20).empty());
}

TEST_CASE("read_regular_file refuses a FIFO without blocking and names a missing file",
          "[core]") {
  TempDir dir;
  const auto fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const RegularFileNames names{"the-name", "test file", "not a test file", Errc::config};
  const auto refused = expect_error([&] { weightcast::detail::read_regular_file(fifo, names, 16); });
  CHECK(refused.code() == Errc::config);
  CHECK(std::string(refused.what()) == "the-name: is a FIFO, not a test file");

  const auto missing = expect_error(
      [&] { weightcast::detail::read_regular_file(dir / "absent", {}, 16); });
  CHECK(missing.code() == Errc::missing_input);
  CHECK_THAT(missing.what(), Catch::Contains((dir / "absent").string() + ": no such file"));
}
