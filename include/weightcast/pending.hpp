/**
 * @file pending.hpp
 * @brief An operation in flight on a device or transport that the loader polls.
 */
#pragma once

namespace weightcast {

/// An asynchronous operation (an H2D copy, a broadcast) that completes on its own.
/// The loader polls `test()` from its `io_context`; the destructor of an unfinished operation
/// must wait for it (never leave the hardware writing freed memory).
class Pending {
 public:
  virtual ~Pending() = default;
  /// @return true once the operation has completed.
  /// @throws Error when the operation failed (names the operation and the reason).
  virtual bool test() = 0;
};

}  // namespace weightcast
