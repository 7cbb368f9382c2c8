// Opening shards buffered or O_DIRECT, and the page-cache residency that `direct_io: auto`
// decides by.
#include "weightcast/io/detail/shard_files.hpp"

#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

namespace weightcast::detail {
namespace {

// cachestat(2), Linux 6.5: the same number on every architecture of the unified table.
#ifdef __NR_cachestat
constexpr long cachestat_syscall = __NR_cachestat;
#else
constexpr long cachestat_syscall = 451;
#endif

struct CachestatRange {
  std::uint64_t offset;
  std::uint64_t length;  // 0: to the end of the file
};
struct Cachestat {
  std::uint64_t nr_cache;
  std::uint64_t nr_dirty;
  std::uint64_t nr_writeback;
  std::uint64_t nr_evicted;
  std::uint64_t nr_recently_evicted;
};

// Above this fraction of resident pages, `auto` reads buffered: the bytes come from memory.
constexpr double cached_fraction = 0.5;

std::int64_t nanoseconds(const timespec& time) noexcept {
  return static_cast<std::int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

// "2026-12-01 14:05:58.123456789 UTC", for messages that compare file times.
std::string utc_text(std::int64_t ns) {
  const std::time_t seconds = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char when[32] = "?";
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &utc);
  return fmt::format("{}.{:09} UTC", when, ns % 1'000'000'000);
}

int open_file(const ShardInfo& shard, int extra_flags) {
  return open_input_nonblocking(shard.path, extra_flags);
}

}  // namespace

double page_cache_fraction(int fd, std::uint64_t file_bytes) noexcept {
  if (file_bytes == 0) return 1.0;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t pages = (file_bytes + page - 1) / page;
  CachestatRange range{0, 0};
  Cachestat stat{};
  if (syscall(cachestat_syscall, fd, &range, &stat, 0) == 0) {
    return std::min(1.0, static_cast<double>(stat.nr_cache) / static_cast<double>(pages));
  }
  // cachestat is missing (before Linux 6.5) or refused: the kernel answers it, as mincore,
  // only for a caller who may write the file (EPERM otherwise; mincore then reports every
  // page resident, a lie that made `auto` read a cold, shared read-only model buffered). A
  // one-byte read with RWF_NOWAIT needs no write access: it fails with EAGAIN where the page
  // is not in the page cache. It runs on a descriptor of its own, buffered (the shard's may
  // be O_DIRECT) and advised random, so a miss starts no readahead window.
  const int probe = ::open(fmt::format("/proc/self/fd/{}", fd).c_str(),
                           O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (probe < 0) return -1;
  static_cast<void>(posix_fadvise(probe, 0, 0, POSIX_FADV_RANDOM));
  const std::uint64_t samples = std::min<std::uint64_t>(pages, 1024);
  std::uint64_t resident = 0;
  std::byte one{};
  for (std::uint64_t s = 0; s < samples; ++s) {
    const std::uint64_t p = s * pages / samples;
    iovec iov{&one, 1};
    const ssize_t got = preadv2(probe, &iov, 1, static_cast<off_t>(p * page), RWF_NOWAIT);
    if (got == 1) {
      ++resident;
    } else if (got < 0 && errno != EAGAIN) {
      ::close(probe);
      return -1;  // RWF_NOWAIT unsupported here (EOPNOTSUPP): unknown
    }
  }
  ::close(probe);
  return static_cast<double>(resident) / static_cast<double>(samples);
}

std::uint32_t direct_io_alignment(int fd) noexcept {
  std::uint32_t alignment = 0;
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0) {
    alignment = std::max(sx.stx_dio_offset_align, sx.stx_dio_mem_align);
  }
#endif
  if (alignment == 0) {
    struct stat st {};
    if (fstat(fd, &st) == 0 && st.st_blksize > 0) alignment = static_cast<std::uint32_t>(st.st_blksize);
  }
  if (alignment == 0 || !std::has_single_bit(alignment)) alignment = fallback_direct_alignment;
  return std::max<std::uint32_t>(alignment, 512);
}

ShardFiles::ShardFiles(const Catalogue& catalogue, DirectIo policy) : _catalogue(catalogue) {
  _fds.reserve(catalogue.shards.size());
  bool told_refusal = false;
  try {
    for (const ShardInfo& shard : catalogue.shards) {
      int fd = open_file(shard, 0);
      if (fd < 0) {
        int err = errno;
        if (err == EMFILE || err == ENFILE) {
          throw system_error(Errc::io, err,
                             fmt::format("{}: cannot open shard {} of {} (rank 0 keeps every "
                                         "shard open during the load: raise the open-file "
                                         "limit, ulimit -n, above the shard count)",
                                         shard.name, _fds.size() + 1, catalogue.shards.size()));
        }
        // Gone since its header was read, or its path now leads nowhere (a directory on it
        // replaced by a file, a symlink loop): missing input, as it would have been then.
        throw_open_failure(err, shard.path.string(), "shard");
      }
      _fds.push_back(fd);
      _alignments.push_back(1);
      _cached.push_back(std::numeric_limits<double>::quiet_NaN());
      struct stat st {};
      if (fstat(fd, &st) != 0) {
        throw system_error(Errc::io, errno, fmt::format("{}: cannot stat shard", shard.name));
      }
      // Replaced since its header was read: a FIFO would block the reader, not time out.
      if (!S_ISREG(st.st_mode)) {
        throw Error(Errc::missing_input, fmt::format("{}: is {}, expected a .safetensors file",
                                                     shard.path.string(),
                                                     file_type_name(st.st_mode)));
      }
      // Another file put in its place since its header was read: bytes from a file the
      // catalogue never validated (a symlink relinked outside the checkpoint directory).
      if (shard.inode != 0 && (static_cast<std::uint64_t>(st.st_dev) != shard.device ||
                               static_cast<std::uint64_t>(st.st_ino) != shard.inode)) {
        throw Error(Errc::io, fmt::format("{}: shard changed since its header was read: {} is "
                                          "now another file (replaced, or a link changed)",
                                          shard.name, shard.path.string()));
      }
      _opened.push_back(Identity{static_cast<std::uint64_t>(st.st_size), st.st_mtim, st.st_ctim});
      if (static_cast<std::uint64_t>(st.st_size) != shard.file_bytes) {
        throw Error(Errc::io, fmt::format("{}: shard changed since its header was read: {} bytes "
                                          "then, {} bytes now",
                                          shard.name, shard.file_bytes, st.st_size));
      }
      // The same inode rewritten in place (truncated and written again, an inode number
      // reused by a file renamed over it): its times moved. The status-change time also
      // catches a rewrite whose modification time was put back (cp -p, rsync --inplace -t);
      // a chmod or a new hard link moves it too, and then the load is refused wrongly but
      // safely: run it again.
      if (shard.inode != 0 && nanoseconds(st.st_mtim) != shard.modified_ns) {
        throw Error(Errc::io, fmt::format("{}: shard changed since its header was read: {} was "
                                          "modified (modification time {} then, {} now)",
                                          shard.name, shard.path.string(),
                                          utc_text(shard.modified_ns),
                                          utc_text(nanoseconds(st.st_mtim))));
      }
      if (shard.inode != 0 && nanoseconds(st.st_ctim) != shard.changed_ns) {
        throw Error(Errc::io, fmt::format("{}: shard changed since its header was read: {} had "
                                          "its inode changed (status-change time {} then, {} "
                                          "now: rewritten, chmod, or linked)",
                                          shard.name, shard.path.string(),
                                          utc_text(shard.changed_ns),
                                          utc_text(nanoseconds(st.st_ctim))));
      }
      if (policy == DirectIo::off) continue;
      if (policy == DirectIo::automatic) {
        const double cached = page_cache_fraction(fd, shard.file_bytes);
        _cached.back() = cached;
        if (cached > cached_fraction) {
          spdlog::debug("{}: {:.0f}% in the page cache: reading buffered", shard.name,
                        cached * 100);
          continue;
        }
      }
      int direct_fd = open_file(shard, O_DIRECT);
      if (direct_fd < 0) {
        const int err = errno;
        if (policy == DirectIo::on) {
          throw system_error(Errc::io, err,
                             fmt::format("{}: direct_io: on: cannot open with O_DIRECT (the "
                                         "filesystem refuses it; use direct_io: auto or off)",
                                         shard.path.string()));
        }
        if (!told_refusal) {
          spdlog::info("{}: the filesystem refuses O_DIRECT ({}); reading buffered",
                       shard.path.string(), std::strerror(err));
          told_refusal = true;
        }
        continue;
      }
      ::close(fd);
      _fds.back() = direct_fd;
      _alignments.back() = direct_io_alignment(direct_fd);
      _max_alignment = std::max(_max_alignment, _alignments.back());
    }
  } catch (...) {
    for (int fd : _fds) ::close(fd);
    throw;
  }
}

ShardFiles::~ShardFiles() {
  for (int fd : _fds) ::close(fd);
}

void ShardFiles::check_unchanged(std::uint32_t shard) const {
  const ShardInfo& info = _catalogue.shards.at(shard);
  const Identity& then = _opened.at(shard);
  struct stat st {};
  if (fstat(_fds.at(shard), &st) != 0) {
    throw system_error(Errc::io, errno, fmt::format("{}: cannot stat shard", info.name));
  }
  const auto bytes = static_cast<std::uint64_t>(st.st_size);
  if (bytes == then.bytes && st.st_mtim.tv_sec == then.modified.tv_sec &&
      st.st_mtim.tv_nsec == then.modified.tv_nsec && st.st_ctim.tv_sec == then.changed.tv_sec &&
      st.st_ctim.tv_nsec == then.changed.tv_nsec) {
    return;
  }
  throw Error(Errc::io,
              fmt::format("{}: changed during the load (modified at {}; {} bytes when "
                          "opened, {} now): the bytes read may mix old and new contents",
                          info.name, utc_text(nanoseconds(st.st_mtim)), then.bytes, bytes));
}

double ShardFiles::resident_fraction(std::uint32_t shard) const {
  double& cached = _cached.at(shard);
  if (std::isnan(cached)) {
    cached = page_cache_fraction(_fds.at(shard), _catalogue.shards.at(shard).file_bytes);
  }
  return cached;
}

std::string ShardFiles::mode() const {
  const auto direct_count = static_cast<std::size_t>(
      std::count_if(_alignments.begin(), _alignments.end(), [](auto a) { return a > 1; }));
  if (direct_count == 0) return "buffered";
  if (direct_count == _alignments.size()) return "direct";
  return "direct+buffered";
}

}  // namespace weightcast::detail
