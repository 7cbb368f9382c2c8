// Opening inputs and outputs with O_NONBLOCK, so a FIFO never blocks open(2).
#include "weightcast/detail/file_open.hpp"

#include "weightcast/error.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcast::detail {
namespace {

// Clears O_NONBLOCK on @p fd; on failure closes it and returns -1 with errno set.
int clear_nonblocking(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

bool writable_type(mode_t mode) noexcept { return S_ISREG(mode) || S_ISCHR(mode); }

[[noreturn]] void refuse_output(const std::filesystem::path& path, std::string_view what,
                                mode_t mode) {
  throw Error(Errc::io, fmt::format("{}: is {}, not a regular file: writing {} there would "
                                    "block or fail; give a file path (or /dev/null)",
                                    path.string(), file_type_name(mode), what));
}

}  // namespace

std::string_view file_type_name(mode_t mode) noexcept {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

void expect_path_without_nul(const std::filesystem::path& path, std::string_view what) {
  const std::string& text = path.native();
  const auto nul = text.find('\0');
  if (nul == std::string::npos) return;
  throw Error(Errc::usage, fmt::format("{} path '{}' holds a NUL byte at byte {}: a path ends at "
                                       "its first NUL, so it would name '{}'",
                                       what, text, nul, text.substr(0, nul)));
}

int open_input_nonblocking(const std::filesystem::path& path, int extra_flags) noexcept {
  if (path.native().find('\0') != std::string::npos) {
    errno = EINVAL;
    return -1;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
  if (fd < 0 && errno == ENXIO) {
    // A socket (or a device node with no device): open(2) refuses it with ENXIO, "No such
    // device or address", which would read as a missing file. O_PATH opens any file without
    // access, so the caller's fstat(2) names its type like a FIFO's.
    const int path_fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
    if (path_fd >= 0) return path_fd;
    errno = ENXIO;
    return -1;
  }
  if (fd < 0) return -1;
  return clear_nonblocking(fd);
}

int open_output_file(const std::filesystem::path& path, std::string_view what, bool truncate) {
  expect_path_without_nul(path, what);
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  // A directory is left to open(2), whose EISDIR says it plainly.
  if (existed && !writable_type(st.st_mode) && !S_ISDIR(st.st_mode)) {
    refuse_output(path, what, st.st_mode);
  }
  // An existing file is not created: an immutable one, say, "cannot be opened for writing".
  const std::string cannot =
      existed && !S_ISDIR(st.st_mode)
          ? fmt::format("{}: cannot open {} for writing", path.string(), what)
          : fmt::format("{}: cannot create {}", path.string(), what);
  // O_TRUNC only once the type is known good: it is ignored on a FIFO or a device anyway.
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (truncate ? O_TRUNC : 0),
                        0666);
  if (fd < 0) {
    // ENXIO: a FIFO with no reader, made after the stat above.
    throw system_error(Errc::io, errno, cannot);
  }
  struct stat opened {};
  if (::fstat(fd, &opened) != 0) {
    const int err = errno;
    ::close(fd);
    throw system_error(Errc::io, err, fmt::format("{}: cannot stat {}", path.string(), what));
  }
  if (!writable_type(opened.st_mode)) {
    ::close(fd);
    refuse_output(path, what, opened.st_mode);
  }
  if (clear_nonblocking(fd) < 0) throw system_error(Errc::io, errno, cannot);
  return fd;
}

}  // namespace weightcast::detail
