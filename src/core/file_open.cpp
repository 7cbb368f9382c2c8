// Opening inputs and outputs with O_NONBLOCK, so a FIFO never blocks open(2).
#include "weightcast/core/detail/file_open.hpp"

#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <system_error>
#include <utility>

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

// Whether a symbolic link on the way from @p path to its file is one of procfs's
// (/dev/stdout is /proc/self/fd/1): those name an open file, not a place in a directory, and
// what they name is written in place (renamed over, `--report /dev/stdout > out` would send
// the report to a new out.txt and the rest of stdout to the old, now unnamed, one).
bool through_procfs_link(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path hop = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat link {};
    if (::lstat(hop.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return false;
    const int fd = ::open(hop.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return false;
    struct statfs fs_info {};
    const bool procfs = ::fstatfs(fd, &fs_info) == 0 && fs_info.f_type == PROC_SUPER_MAGIC;
    ::close(fd);
    if (procfs) return true;
    std::error_code ec;
    const fs::path next = fs::read_symlink(hop, ec);
    if (ec) return false;
    hop = next.is_absolute() ? next : hop.parent_path() / next;
  }
  return false;
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

void throw_open_failure(int err, std::string_view name, std::string_view what) {
  if (err == ENOENT) throw Error(Errc::missing_input, fmt::format("{}: no such file", name));
  throw system_error(unreachable_path(err) ? Errc::missing_input : Errc::io, err,
                     fmt::format("{}: cannot open{}{}", name, what.empty() ? "" : " ", what));
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

int create_fresh(const std::filesystem::path& path, mode_t mode) noexcept {
  ::unlink(path.c_str());
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

std::filesystem::path follow_links(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path target = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat link {};
    if (::lstat(target.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) break;
    std::error_code ec;
    const fs::path next = fs::read_symlink(target, ec);
    if (ec) break;
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  return target;
}

OutputFile::OutputFile(const std::filesystem::path& path, std::string_view what)
    : _path(path), _what(what) {
  expect_path_without_nul(path, what);
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  if (!existed && errno != ENOENT) {  // ENOTDIR, EACCES, ELOOP: open(2) says it as before
    _fd = open_output_file(path, what, true);
    return;
  }
  if (existed) {
    // Opened as before, untruncated: a type refused (a FIFO) or a file this process may not
    // write fails here, with the same message. A device is then written in place.
    _fd = open_output_file(path, what, false);
    if (::fstat(_fd, &st) != 0) fail(errno, "");
    if (!S_ISREG(st.st_mode)) return;
  }
  _target = follow_links(path);
  if (existed) {
    // Reached through a link of procfs's (/dev/stdout), or something else than symbolic
    // links: there is no name of its own to rename over, so the file is written in place.
    struct stat target {};
    const bool procfs = through_procfs_link(path);
    if (procfs) {
      // This process's own stdout or stderr (`--report /dev/stdout > out.txt`): written
      // through that descriptor, at its offset and not truncated. A second open file of its
      // own started at offset 0, truncated what stdout had written (a `>>` log too), and the
      // summary printed after overwrote the report's first bytes.
      for (const int standard : {STDOUT_FILENO, STDERR_FILENO}) {
        struct stat open_st {};
        if (::fstat(standard, &open_st) != 0 || open_st.st_dev != st.st_dev ||
            open_st.st_ino != st.st_ino) {
          continue;
        }
        std::fflush(standard == STDOUT_FILENO ? stdout : stderr);
        const int shared = ::fcntl(standard, F_DUPFD_CLOEXEC, 0);
        if (shared < 0) continue;
        ::close(_fd);
        _fd = shared;
        _target.clear();
        return;
      }
    }
    if (procfs || ::stat(_target.c_str(), &target) != 0 ||
        target.st_dev != st.st_dev || target.st_ino != st.st_ino) {
      if (::ftruncate(_fd, 0) != 0) fail(errno, "");
      _target.clear();
      return;
    }
  }
  _temp = _target;
  _temp += fmt::format(".partial-{}", ::getpid());
  // Whatever holds the name (a temporary left by an earlier process of this pid, a FIFO, a
  // symbolic link) is removed and never opened: the write would block or go elsewhere.
  const int temp = create_fresh(_temp, existed ? 0600 : 0666);  // new: 0666 less the umask
  if (temp < 0) {
    const int err = errno;
    _temp.clear();
    if (err == EACCES || err == EPERM || err == ENAMETOOLONG || err == EROFS) {
      // The directory takes no new name (a writable file in a read-only directory, or a file
      // bind-mounted into one): write in place, as before.
      if (existed) {
        if (::ftruncate(_fd, 0) != 0) fail(errno, "");
      } else {
        _fd = open_output_file(path, what, true);
      }
      _target.clear();
      return;
    }
    if (existed) {
      fail(err, fmt::format("cannot create {}.partial-{} to write", _target.filename().string(),
                            ::getpid()));
    }
    throw system_error(Errc::io, err, fmt::format("{}: cannot create {}", path.string(), what));
  }
  if (existed) {
    // The previous file's permission bits, owner and group (the last two only where this
    // process may set them: root, or a group it belongs to).
    // Where neither may be set, the file becomes this process's, as any file it creates.
    if (::fchown(temp, st.st_uid, st.st_gid) != 0) {
      (void)::fchown(temp, static_cast<uid_t>(-1), st.st_gid);
    }
    // After fchown, which clears set-user-ID and set-group-ID. It cannot fail on a file this
    // process created; if it did, the file would keep 0600.
    (void)::fchmod(temp, st.st_mode & 07777);
    ::close(_fd);
  }
  _fd = temp;
}

OutputFile::~OutputFile() {
  if (_fd >= 0) ::close(_fd);
  if (!_temp.empty()) ::unlink(_temp.c_str());
}

void OutputFile::fail(int err, std::string_view how) {
  if (_fd >= 0) ::close(_fd);
  _fd = -1;
  if (!_temp.empty()) ::unlink(_temp.c_str());
  _temp.clear();
  throw system_error(Errc::io, err,
                     fmt::format("{}: {} {}", _path.string(),
                                 how.empty() ? std::string_view("cannot write") : how, _what));
}

void OutputFile::write(std::string_view data) {
  while (!data.empty()) {
    const ssize_t wrote = ::write(_fd, data.data(), data.size());
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) fail(wrote < 0 ? errno : ENOSPC, "");
    data.remove_prefix(static_cast<std::size_t>(wrote));
  }
}

void OutputFile::commit() {
  // Each step checked: a file system that is full, or over quota, may say so only at fsync
  // or close (NFS, and delayed allocation elsewhere).
  if (!_temp.empty() && ::fsync(_fd) != 0) fail(errno, "");
  const int fd = std::exchange(_fd, -1);
  if (::close(fd) != 0) fail(errno, "");
  if (_temp.empty()) return;
  if (::rename(_temp.c_str(), _target.c_str()) == 0) {
    _temp.clear();
    return;
  }
  const int err = errno;
  // A target that may be written but not replaced: a file bind-mounted in place (a
  // container's `-v host.json:/out/report.json`: EBUSY), another user's file in a sticky
  // directory such as /tmp (EPERM), a read-only directory (EROFS, EACCES). It is written in
  // place from the finished temporary, as it was before reports were renamed into place.
  if (err != EBUSY && err != EPERM && err != EACCES && err != EROFS && err != EXDEV) {
    fail(err, fmt::format("cannot rename {} over", _temp.filename().string()));
  }
  copy_temp_in_place();
}

void OutputFile::copy_temp_in_place() {
  const UniqueFd from_fd(::open(_temp.c_str(), O_RDONLY | O_CLOEXEC));
  const int from = from_fd.get();
  if (from < 0) fail(errno, fmt::format("cannot read back {} for", _temp.filename().string()));
  _fd = open_output_file(_path, _what, true);
  char buffer[1 << 16];
  for (;;) {
    const ssize_t got = ::read(from, buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(errno, fmt::format("cannot read back {} for", _temp.filename().string()));
    if (got == 0) break;
    write(std::string_view(buffer, static_cast<std::size_t>(got)));
  }
  if (::fsync(_fd) != 0 && errno != EINVAL && errno != EROFS) fail(errno, "");
  const int fd = std::exchange(_fd, -1);
  if (::close(fd) != 0) fail(errno, "");
  ::unlink(_temp.c_str());
  _temp.clear();
}

}  // namespace weightcast::detail
