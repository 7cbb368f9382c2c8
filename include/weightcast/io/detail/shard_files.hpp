/**
 * @file shard_files.hpp
 * @brief Rank 0's open shard files, each buffered or O_DIRECT as `direct_io` decides.
 *
 * Internal (no Asio). O_DIRECT reads bypass the page cache, so a cold checkpoint streams at
 * the disk's speed without evicting the trainer's memory into page cache; a checkpoint that
 * is already cached reads faster buffered (a memory copy, no device I/O). `auto` therefore
 * picks per shard: buffered when most of the shard's pages are resident, else O_DIRECT, and
 * buffered again where the filesystem refuses O_DIRECT.
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/core/settings.hpp"

#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

namespace weightcast::detail {

/// The DIO alignment used when the kernel does not report one (`statx` STATX_DIOALIGN, Linux
/// 6.1+): 4096 bytes satisfies every logical block size in use.
constexpr std::uint32_t fallback_direct_alignment = 4096;

/**
 * @brief Fraction (0..1) of the first @p file_bytes of @p fd resident in the page cache.
 *
 * Uses the `cachestat` syscall (Linux 6.5+). Where it is missing or refused (the kernel
 * answers it, and `mincore`, only for a caller who may write the file), samples at most 1024
 * pages evenly with one-byte `preadv2(RWF_NOWAIT)` reads, which fail with EAGAIN on a page
 * not in the page cache and need only read access. @return 1 for an empty file; -1 when
 * neither works (then `auto` reads with O_DIRECT).
 */
double page_cache_fraction(int fd, std::uint64_t file_bytes) noexcept;

/**
 * @brief The O_DIRECT alignment of @p fd, bytes: max(stx_dio_offset_align, stx_dio_mem_align)
 *        from `statx` STATX_DIOALIGN where the kernel reports it, else the file's block size
 *        (st_blksize), else `fallback_direct_alignment`. Always a power of two ≥ 512.
 */
std::uint32_t direct_io_alignment(int fd) noexcept;

/// The shard files of a catalogue, opened by rank 0 only.
class ShardFiles {
 public:
  /**
   * @brief Opens every shard of @p catalogue as @p policy says.
   * @throws Error `missing_input` (66) for a shard whose path now leads to no file (removed,
   *         a symlink loop: throw_open_failure()) or to one that is not a regular file (a
   *         FIFO put in its place); `io` (74) for one that cannot be opened otherwise
   *         (permission, the open-file limit) or fstat(2)ed, that is now another file than
   *         the one whose header was read (device and inode), whose size, modification
   *         time or status-change time changed since (a rewrite in place), or
   *         (`direct_io: on`) whose filesystem refuses O_DIRECT, naming the file.
   * @note `auto` logs one notice per load when it falls back to buffered reads.
   *       @p catalogue must outlive the ShardFiles (messages name its shards).
   */
  ShardFiles(const Catalogue& catalogue, DirectIo policy);
  ~ShardFiles();
  ShardFiles(const ShardFiles&) = delete;
  ShardFiles& operator=(const ShardFiles&) = delete;

  /// @return the open descriptor of @p shard (catalogue index; `std::out_of_range` past the
  ///         last), owned by this object.
  [[nodiscard]] int fd(std::uint32_t shard) const { return _fds.at(shard); }
  /// @return every shard's descriptor, catalogue order (for `Reader::register_files`).
  [[nodiscard]] const std::vector<int>& fds() const noexcept { return _fds; }
  /// @return true when @p shard is read with O_DIRECT.
  [[nodiscard]] bool direct(std::uint32_t shard) const { return _alignments.at(shard) > 1; }
  /// @return the read alignment of @p shard, bytes: its DIO alignment, or 1 when buffered.
  [[nodiscard]] std::uint32_t alignment(std::uint32_t shard) const {
    return _alignments.at(shard);
  }
  /// @return the largest alignment of any shard (sizes the staging slots).
  [[nodiscard]] std::uint32_t max_alignment() const noexcept { return _max_alignment; }
  /// @return "direct", "buffered", or "direct+buffered" when shards differ.
  [[nodiscard]] std::string mode() const;
  /// @return the fraction (0..1) of @p shard resident in the page cache, as
  ///         `page_cache_fraction` measured it when `auto` chose buffered or O_DIRECT (at
  ///         open), else measured now and kept; -1 when it cannot be measured.
  [[nodiscard]] double resident_fraction(std::uint32_t shard) const;

  /**
   * @brief Checks that @p shard is as it was when it was opened: one `fstat` of the open file,
   *        comparing its size and modification time (st_mtim) with those seen at open.
   *
   * Call it once every read of the shard has completed: a write into the file while it was
   * read (in place, same size) moves its modification time, so bytes that may mix old and
   * new contents are refused. A change that keeps the modification time (a write through a
   * writable mmap not yet written back, a time set back with utimensat) is not seen.
   * @throws Error `io` (74) naming the shard, its new modification time and sizes; `io` when
   *         the fstat(2) itself fails.
   */
  void check_unchanged(std::uint32_t shard) const;

 private:
  /// What `check_unchanged` compares: a shard file's size, modification time and status
  /// change time (a rewrite that sets the modification time back still moves the latter).
  struct Identity {
    std::uint64_t bytes = 0;
    timespec modified{};
    timespec changed{};
  };

  const Catalogue& _catalogue;
  std::vector<int> _fds;
  std::vector<std::uint32_t> _alignments;  // per shard; 1 = buffered
  mutable std::vector<double> _cached;     // per shard: resident_fraction, NaN until measured
  std::vector<Identity> _opened;           // per shard: as seen when it was opened
  std::uint32_t _max_alignment = 1;
};

}  // namespace weightcast::detail
