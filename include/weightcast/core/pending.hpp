/**
 * @file pending.hpp
 * @brief An operation in flight on a device or transport that the loader polls.
 */
#pragma once

namespace weightcast {

/// An asynchronous operation (an H2D copy, a broadcast) that completes on its own.
/// The loader polls `test()` from its `io_context`; the destructor of an unfinished operation
/// must wait for it (never leave the hardware writing freed memory), or, where waiting could
/// last forever on a dead peer, make sure the memory outlives it: `nccl` aborts the
/// communicator and then waits; `mpi` cannot (a collective cannot be cancelled) and marks its
/// `MpiSession` abandoned, after which the process must exit (transport_mpi.hpp).
class Pending {
 public:
  virtual ~Pending() = default;
  /// @return true once the operation has completed.
  /// @throws Error when the operation failed (names the operation and the reason; usually
  ///         `unavailable` (69), `internal` (70) for a CUDA error that is a bug).
  virtual bool test() = 0;
};

}  // namespace weightcast
