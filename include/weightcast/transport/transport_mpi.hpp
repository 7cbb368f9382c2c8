/**
 * @file transport_mpi.hpp
 * @brief The `mpi` data plane: host-memory broadcast with `MPI_Ibcast` (Open MPI).
 *
 * Optional at build time (`find_package(MPI COMPONENTS C)`); without MPI every function here
 * throws `Errc::unavailable` (69) saying the build has no MPI, so callers need no `#ifdef`.
 */
#pragma once

#include "weightcast/transport/communicators.hpp"
#include "weightcast/transport/transport.hpp"

#include <cstdint>
#include <memory>
#include <utility>

namespace weightcast {

/// @return true when this build has the mpi transport.
bool mpi_compiled_in() noexcept;

/// @return true when MPI is initialised in this process and not finalised (`MPI_Initialized`,
///         `MPI_Finalized`); false without MPI in the build.
bool mpi_initialized() noexcept;

/**
 * @brief weightcast's use of MPI for one job: MPI initialised if it is not yet, and a
 *        communicator of weightcast's own to broadcast on.
 *
 * If MPI is already initialised (`MPI_Initialized`: the trainer did), the session uses it and
 * never finalises it; otherwise it calls `MPI_Init_thread(MPI_THREAD_FUNNELED)` and, in the
 * destructor, `MPI_Finalize`. MPI is never initialised twice. Before initialising MPI for a
 * job that Open MPI's launcher put on one node (`one_node`), it sets `OMPI_MCA_pml=ob1` in
 * this process's environment unless `OMPI_MCA_pml` is set already (by the user, or by
 * `mpirun --mca pml ...`): shared memory is all such a job uses, and Open MPI left to choose
 * also opens its cm PML, whose MTLs probe network hardware, which makes `MPI_Init_thread`
 * several times slower (bench/RESULTS.md). The session broadcasts on a
 * duplicate (`MPI_Comm_dup`, collective: every rank of the base communicator constructs its
 * session) of `MPI_COMM_WORLD` or of the caller's communicator, with `MPI_ERRORS_RETURN` set
 * on that duplicate only: the caller's collectives on its own communicator cannot match ours
 * (MPI 4.0 §6.12: collectives on one communicator are matched in posting order), and its
 * error handler stays as it was. The destructor frees the duplicate.
 *
 * Only the constructing thread may call MPI through the session. If a broadcast was
 * abandoned (a failure while an `MPI_Ibcast` was in flight; a collective cannot be cancelled,
 * MPI 4.0 §5.12), the destructor makes no MPI call (`MPI_Comm_free`, `MPI_Finalize` would wait
 * for it forever): the process should end soon, and no MPI call may be made in it again.
 */
class MpiSession {
 public:
  /// Broadcasts on a duplicate of `MPI_COMM_WORLD`, initialising MPI if need be.
  /// @throws Error `unavailable` (69) when the build has no MPI, MPI was finalised already,
  ///         `MPI_Init_thread` or `MPI_Comm_dup` fails, or MPI was initialised (by the caller)
  ///         with a thread level below `MPI_THREAD_SERIALIZED` and this is not the thread that
  ///         initialised it (MPI 4.0 §11.2.1: only that thread may call MPI).
  MpiSession();
  /// Broadcasts on a duplicate of the caller's @p communicator; MPI must be initialised.
  /// @throws Error `unavailable` (69) as above, and when MPI is not initialised.
  explicit MpiSession(const MpiCommunicator& communicator);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  /// @return this rank in the session's communicator (`MPI_Comm_rank`).
  [[nodiscard]] int rank() const noexcept { return _rank; }
  /// @return the size of the session's communicator (`MPI_Comm_size`).
  [[nodiscard]] int world_size() const noexcept { return _world_size; }
  /// @return whether this session initialised MPI (and so finalises it).
  [[nodiscard]] bool initialised_mpi() const noexcept { return _owns_mpi; }
  /// Marks that a broadcast was left in flight: no MPI call may be made any more.
  void abandon() noexcept { _abandoned = true; }
  /// @return whether a broadcast was left in flight (`abandon`).
  [[nodiscard]] bool abandoned() const noexcept { return _abandoned; }
  /// @return the session's communicator (an `MPI_Comm`, as `MpiCommunicator::handle`).
  [[nodiscard]] std::uintptr_t communicator() const noexcept { return _comm; }
  /// @return whether every rank of the communicator shares this node's memory: Open MPI's
  ///         launcher put the whole job on one node (`OMPI_COMM_WORLD_LOCAL_SIZE` equal to
  ///         `OMPI_COMM_WORLD_SIZE`); false where that is not known.
  [[nodiscard]] bool one_node() const noexcept { return _one_node; }

 private:
  void open(const MpiCommunicator* base);

  int _rank = 0;
  int _world_size = 1;
  bool _abandoned = false;
  bool _owns_mpi = false;
  bool _have_comm = false;
  bool _one_node = false;
  std::uintptr_t _comm = 0;
};

/// @return the rank and the size of @p communicator (`MPI_Comm_rank`, `MPI_Comm_size`: local
///         calls, no peer is waited for).
/// @throws Error `unavailable` (69) when the build has no MPI, MPI is not initialised, or
///         the calls fail (an invalid communicator: MPI's error string).
std::pair<int, int> mpi_rank_and_size(const MpiCommunicator& communicator);

/**
 * @brief Broadcasts over the session's communicator with `MPI_Ibcast` of `MPI_BYTE`; the returned
 *        `Pending::test()` is `MPI_Test`. Counts over `INT_MAX` bytes are split into several
 *        `MPI_Ibcast`s (MPI counts are `int`).
 *
 * Where the session does not know every rank to be on one node (`MpiSession::one_node`),
 * creating the transport is collective: it splits the communicator by node
 * (`MPI_Comm_split_type`, `MPI_COMM_TYPE_SHARED`) and into the nodes' leaders (each node's
 * lowest rank), and where there are several nodes and some has several ranks, a broadcast
 * from rank 0 goes in two levels: `MPI_Ibcast` among the leaders, then on each node from its
 * leader (posted inside `Pending::test()` once the first level, and every earlier broadcast's,
 * has completed), so each other node receives one copy (docs/DESIGN.md § Transports).
 *
 * Destroying an unfinished broadcast does not wait (it could wait forever on a dead peer): it
 * marks @p session abandoned; the caller must exit the process soon (the arena stays
 * reachable by MPI until then).
 * @param session must outlive the transport.
 * @throws Error `unavailable` (69) when the build has no MPI. The transport's `broadcast` and
 *         its `Pending::test()` throw `unavailable` naming the byte count and MPI's error
 *         string when `MPI_Ibcast` or `MPI_Testall` fails; creation throws `unavailable`
 *         naming the call when a split of the communicator fails.
 */
std::unique_ptr<Transport> make_mpi_transport(MpiSession& session);

}  // namespace weightcast
