/**
 * @file unique_fd.hpp
 * @brief Internal: UniqueFd, the one owner of a POSIX file descriptor in the library.
 */
#pragma once

#include <unistd.h>

#include <utility>

namespace weightcast::detail {

/**
 * @brief Owns a file descriptor and closes it when destroyed: move-only, as
 *        `std::unique_ptr` owns a pointer.
 *
 * A descriptor below 0 is "none" (what a failed open(2) returns), so
 * `UniqueFd fd(::open(...)); if (fd.get() < 0) ...` keeps errno for the message. The
 * destructor ignores close(2)'s result; a writer that must know of a deferred write error
 * (NFS reports some only at close) calls close() and checks it.
 */
class UniqueFd {
 public:
  UniqueFd() noexcept = default;
  /// Takes ownership of @p fd (below 0: owns nothing).
  explicit UniqueFd(int fd) noexcept : _fd(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : _fd(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  /// @return the descriptor, still owned; -1 (or the negative value given) when none.
  [[nodiscard]] int get() const noexcept { return _fd; }
  /// @return whether a descriptor is owned.
  [[nodiscard]] explicit operator bool() const noexcept { return _fd >= 0; }
  /// Gives up ownership without closing. @return the descriptor (the caller closes it).
  [[nodiscard]] int release() noexcept { return std::exchange(_fd, -1); }
  /// Closes the owned descriptor, if any, and takes @p fd instead.
  void reset(int fd = -1) noexcept {
    if (const int old = std::exchange(_fd, fd); old >= 0) ::close(old);
  }
  /// Closes the owned descriptor now. @return close(2)'s result (0 when none was owned);
  ///         on -1 errno says why. The descriptor is gone either way.
  int close() noexcept {
    const int fd = release();
    return fd >= 0 ? ::close(fd) : 0;
  }

 private:
  int _fd = -1;
};

}  // namespace weightcast::detail
