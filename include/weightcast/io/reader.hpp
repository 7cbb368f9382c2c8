/**
 * @file reader.hpp
 * @brief Rank 0's read stage back ends: io_uring, or a pread thread pool, signalled through
 *        an eventfd.
 *
 * A reader knows nothing of Asio: it exposes an eventfd that becomes readable when
 * completions are waiting, and `reap()` collects them. The loader awaits the eventfd on its
 * `io_context` (docs/DESIGN.md § Reads). Short reads are re-queued and EINTR/EAGAIN retried inside
 * the reader, so a request completes only when all its bytes arrived, the file ended, or the
 * kernel returned an error.
 */
#pragma once

#include "weightcast/core/settings.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace weightcast {

/// One read of `bytes` bytes at `file_offset` of `fd` into `destination`.
///
/// For O_DIRECT the loader asks for an aligned superset of the bytes it wants: `file_offset`,
/// `bytes` and `destination` are multiples of `alignment`, and only the first
/// `required_bytes` must arrive (the superset may run past the end of the file, where the
/// kernel returns a short read).
struct ReadRequest {
  int fd = -1;                     ///< Open file descriptor (not owned).
  std::byte* destination = nullptr;///< Where the bytes go; must stay valid until completion.
  std::uint64_t bytes = 0;         ///< Bytes asked for (> 0).
  std::uint64_t file_offset = 0;   ///< Absolute file offset, bytes.
  std::uint64_t user = 0;          ///< Caller's tag (the loader's slot index).
  /// Bytes that must arrive (≤ `bytes`); 0 means all of `bytes`. The end of the file after
  /// this many bytes completes the request normally.
  std::uint64_t required_bytes = 0;
  /// A short read that ends off a multiple of this (O_DIRECT: the file's DIO alignment) is
  /// the end of the file: the rest is not asked for again (an O_DIRECT read at an unaligned
  /// offset fails with EINVAL). 1 for buffered reads.
  std::uint32_t alignment = 1;
  // Filled by the reader:
  std::uint64_t bytes_done = 0;    ///< Bytes read so far.
  int error = 0;                   ///< errno of a failed read, 0 otherwise.
  bool end_of_file = false;        ///< The file ended before `required_bytes` were read.
};

/// Interface of the read back ends (io_uring; a pread thread pool).
class Reader {
 public:
  virtual ~Reader() = default;
  /// @return the back end's name for the summary: "io_uring" or "pread".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// @return an eventfd that is readable while completions wait in `reap()`. Owned by the
  ///         reader; callers may `dup()` it.
  [[nodiscard]] virtual int completion_fd() const noexcept = 0;
  /// Queues @p request (not owned; must outlive its completion) and resets its `bytes_done`,
  /// `error` and `end_of_file`. Never blocks: requests past the queue depth wait in a
  /// backlog. A failed read is the request's `error`, not an exception; so is a failed
  /// `io_uring_submit` (io_uring): the requests the kernel did not take finish with its errno
  /// and, as SQEs cannot be taken back from the ring, so does every later request. A short
  /// submit is not a failure: the rest is offered again (once reads in flight complete, where
  /// the kernel answers EAGAIN or EBUSY). Only reads the kernel took are waited for by the
  /// destructor.
  virtual void submit(ReadRequest* request) = 0;
  /// Moves every finished request (complete, failed, ended early, or never sent because
  /// `io_uring_submit` failed) into @p finished and clears the eventfd; short reads and
  /// EINTR/EAGAIN are queued again here (io_uring). @return the number appended.
  virtual std::size_t reap(std::vector<ReadRequest*>& finished) = 0;
  /// @return requests submitted and not yet reaped.
  [[nodiscard]] virtual std::size_t pending() const noexcept = 0;
  /// @return true when a completion of @p request (submitted, not yet reaped) already
  ///         waits for `reap()`: io_uring completes a buffered read of cached pages inside
  ///         `submit`. A hint for pacing: false says nothing (the pread pool always answers
  ///         false), and `reap()` still decides whether the request is finished.
  [[nodiscard]] virtual bool completed(const ReadRequest& request) noexcept {
    (void)request;
    return false;
  }
  /**
   * @brief Registers @p buffers (the staging slots) so reads into them skip the kernel's
   *        per-read page pinning (io_uring fixed buffers). Call before the first `submit`.
   * @return true when registered; false when the back end or kernel cannot (RLIMIT_MEMLOCK,
   *         an old kernel): reads still work, unregistered. Never throws for that.
   */
  virtual bool register_buffers(std::span<const std::span<std::byte>> buffers) {
    (void)buffers;
    return false;
  }
  /**
   * @brief Registers @p fds (the shard files) as fixed files, saving a file-table lookup
   *        per read. Call before the first `submit`. @return true when registered; false
   *        when the back end or kernel cannot (reads still work). Never throws for that.
   */
  virtual bool register_files(std::span<const int> fds) {
    (void)fds;
    return false;
  }
};

/**
 * @brief Creates the io_uring reader.
 * @param queue_depth reads in flight at most (`io_depth`, ≥ 1; 0 is taken as 1).
 * @throws Error `unavailable` (69) with "io_uring unavailable: <reason>" when the ring cannot
 *         be created (seccomp EPERM, ENOSYS, `kernel.io_uring_disabled`), lacks
 *         IORING_OP_READ (kernels before 5.6) or cannot register its eventfd; `internal` (70)
 *         when the eventfd cannot be created.
 */
std::unique_ptr<Reader> make_uring_reader(unsigned queue_depth);

/**
 * @brief Creates the pread reader: @p threads threads each running one `pread` at a time.
 * @param threads reads in flight at most (`io_depth`, ≥ 1; 0 is taken as 1).
 * @throws Error `internal` (70) when the eventfd or a thread cannot be created.
 */
std::unique_ptr<Reader> make_pread_reader(unsigned threads);

/**
 * @brief Creates the reader `reader:` asks for.
 *
 * `uring` and `pread` give that back end or fail; `auto` gives io_uring and falls back to
 * pread, with one warning, when io_uring is unavailable (seccomp, ENOSYS, disabled).
 * @throws Error `unavailable` (69) for `uring` when io_uring is unavailable (the message
 *         adds "use reader: auto or pread"); `internal` (70) as `make_uring_reader` and
 *         `make_pread_reader` when an eventfd or a thread cannot be created.
 */
std::unique_ptr<Reader> make_reader(ReaderKind kind, unsigned queue_depth);

namespace detail {

/// What a reader does with a request after a read of it returned.
enum class ReadStep { finished, again };

/**
 * @brief Applies one read's result @p res (bytes, 0 at end of file, or -errno) to @p request.
 *
 * Shared by the back ends so they agree on short reads and the end of file: EINTR/EAGAIN and
 * short reads (at an aligned point) go again; end of file completes the request when
 * `required_bytes` arrived, else sets `end_of_file`.
 */
ReadStep advance(ReadRequest& request, long long res) noexcept;

}  // namespace detail

}  // namespace weightcast
