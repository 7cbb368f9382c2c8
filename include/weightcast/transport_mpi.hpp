/**
 * @file transport_mpi.hpp
 * @brief The `mpi` data plane: host-memory broadcast with `MPI_Ibcast` (Open MPI).
 *
 * Optional at build time (`find_package(MPI COMPONENTS C)`); without MPI every function here
 * throws `Errc::unavailable` (69) saying the build has no MPI, so callers need no `#ifdef`.
 */
#pragma once

#include "weightcast/transport.hpp"

#include <memory>

namespace weightcast {

/// @return true when this build has the mpi transport.
bool mpi_compiled_in() noexcept;

/**
 * @brief The MPI library's lifetime: `MPI_Init_thread(MPI_THREAD_FUNNELED)` in the
 *        constructor, `MPI_Finalize` in the destructor.
 *
 * Only the constructing thread may call MPI (FUNNELED). If a broadcast was abandoned (a
 * failure while an `MPI_Ibcast` was in flight; a collective cannot be cancelled, MPI 4.0
 * §5.12), the destructor skips `MPI_Finalize`, which would wait for it forever: the process
 * is about to exit with an error and mpirun reaps the rest.
 * @note One per process; MPI cannot be initialised twice.
 */
class MpiSession {
 public:
  /// Sets `MPI_ERRORS_RETURN` on `MPI_COMM_WORLD`, so MPI failures come back as `Error`s
  /// naming the call instead of MPI aborting the job.
  /// @throws Error `unavailable` (69) when the build has no MPI or `MPI_Init_thread` fails.
  MpiSession();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  /// @return `MPI_Comm_rank(MPI_COMM_WORLD)`.
  [[nodiscard]] int rank() const noexcept { return _rank; }
  /// @return `MPI_Comm_size(MPI_COMM_WORLD)`.
  [[nodiscard]] int world_size() const noexcept { return _world_size; }
  /// Marks that a broadcast was left in flight: `MPI_Finalize` must not be called.
  void abandon() noexcept { _abandoned = true; }

 private:
  int _rank = 0;
  int _world_size = 1;
  bool _abandoned = false;
};

/**
 * @brief Broadcasts over `MPI_COMM_WORLD` with `MPI_Ibcast` of `MPI_BYTE`; the returned
 *        `Pending::test()` is `MPI_Test`. Counts over `INT_MAX` bytes are split into several
 *        `MPI_Ibcast`s (MPI counts are `int`).
 *
 * Destroying an unfinished broadcast does not wait (it could wait forever on a dead peer): it
 * marks @p session abandoned; the caller must exit the process soon (the arena stays
 * reachable by MPI until then).
 * @param session must outlive the transport.
 * @throws Error `unavailable` (69) when the build has no MPI. The transport's `broadcast` and
 *         its `Pending::test()` throw `unavailable` naming the byte count and MPI's error
 *         string when `MPI_Ibcast` or `MPI_Testall` fails.
 */
std::unique_ptr<Transport> make_mpi_transport(MpiSession& session);

}  // namespace weightcast
