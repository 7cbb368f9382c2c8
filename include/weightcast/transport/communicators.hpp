/**
 * @file communicators.hpp
 * @brief A caller's MPI or NCCL communicator as an opaque value, so that the headers that
 *        take one (job.hpp, transport_mpi.hpp, transport.hpp) need neither mpi.h nor nccl.h.
 *
 * Make one with `mpi_communicator(MPI_Comm)` (weightcast/transport/mpi.hpp) or
 * `nccl_communicator(ncclComm_t, int)` (weightcast/transport/nccl.hpp), in code that includes mpi.h or
 * nccl.h already.
 */
#pragma once

#include <cstdint>

namespace weightcast {

/// An `MPI_Comm` of the caller's. It must stay valid while weightcast uses it (until
/// `run_job` returns).
struct MpiCommunicator {
  std::uintptr_t handle = 0;  ///< The `MPI_Comm`'s bytes (Open MPI: a pointer; MPICH: an int).
};

/// An `ncclComm_t` of the caller's and the CUDA device its rank was created on. weightcast
/// broadcasts on it as it is (no new communicator is created) and never finalises, destroys
/// or aborts it: its owner does (torch's ProcessGroup frees it at its shutdown). After a
/// failure the owner must abort it (`ncclCommAbort`, the only way to end a collective in
/// flight: NCCL docs, "Error handling and communicator abort") before any other use; the
/// error says so.
struct NcclCommunicator {
  void* comm = nullptr;  ///< The `ncclComm_t`.
  int cuda_device = 0;   ///< Its CUDA device ordinal; the arena is allocated there.
};

}  // namespace weightcast
