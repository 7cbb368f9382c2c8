/**
 * @file reader.hpp
 * @brief Rank 0's read stage back end: io_uring reads signalled through an eventfd.
 *
 * The reader knows nothing of Asio: it exposes an eventfd that becomes readable when
 * completions are waiting, and `reap()` collects them. The loader awaits the eventfd on its
 * `io_context` (DESIGN.md layer 5). Short reads are re-queued and EINTR/EAGAIN retried inside
 * the reader, so a request completes only when all its bytes arrived, the file ended, or the
 * kernel returned an error.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace weightcast {

/// One read of `bytes` bytes at `file_offset` of `fd` into `destination`.
struct ReadRequest {
  int fd = -1;                     ///< Open file descriptor (not owned).
  std::byte* destination = nullptr;///< Where the bytes go; must stay valid until completion.
  std::uint64_t bytes = 0;         ///< Bytes wanted (> 0).
  std::uint64_t file_offset = 0;   ///< Absolute file offset, bytes.
  std::uint64_t user = 0;          ///< Caller's tag (the loader's slot index).
  // Filled by the reader:
  std::uint64_t bytes_done = 0;    ///< Bytes read so far.
  int error = 0;                   ///< errno of a failed read, 0 otherwise.
  bool end_of_file = false;        ///< The file ended before `bytes` were read.
};

/// Interface of the read back ends (io_uring; a pread thread pool comes later).
class Reader {
 public:
  virtual ~Reader() = default;
  /// @return the back end's name for the summary, e.g. "io_uring".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// @return an eventfd that is readable while completions wait in `reap()`. Owned by the
  ///         reader; callers may `dup()` it.
  [[nodiscard]] virtual int completion_fd() const noexcept = 0;
  /// Queues @p request (not owned; must outlive its completion). Never blocks: requests past
  /// the queue depth wait in a backlog.
  virtual void submit(ReadRequest* request) = 0;
  /// Moves every finished request (complete, failed or ended early) into @p finished and
  /// clears the eventfd. @return the number appended.
  virtual std::size_t reap(std::vector<ReadRequest*>& finished) = 0;
  /// @return requests submitted and not yet reaped.
  [[nodiscard]] virtual std::size_t pending() const noexcept = 0;
};

/**
 * @brief Creates the io_uring reader.
 * @param queue_depth reads in flight at most (`io_depth`, ≥ 1).
 * @throws Error `unavailable` (69) with "io_uring unavailable: <reason>" when the ring cannot
 *         be created (seccomp EPERM, ENOSYS, `kernel.io_uring_disabled`).
 */
std::unique_ptr<Reader> make_uring_reader(unsigned queue_depth);

}  // namespace weightcast
