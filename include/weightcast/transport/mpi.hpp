/**
 * @file mpi.hpp
 * @brief Hands a caller's `MPI_Comm` to weightcast (`JobOptions::mpi_communicator`).
 *
 * The one weightcast header that includes mpi.h: include it where you have an `MPI_Comm`.
 * It must be the MPI weightcast was built with (Open MPI in the project's builds).
 */
#pragma once

#include "weightcast/transport/communicators.hpp"

#include <mpi.h>

#include <cstring>

namespace weightcast {

/// @return @p comm as the opaque value `JobOptions::mpi_communicator` takes. Never throws.
inline MpiCommunicator mpi_communicator(MPI_Comm comm) noexcept {
  static_assert(sizeof(MPI_Comm) <= sizeof(MpiCommunicator::handle),
                "an MPI_Comm must fit the opaque handle");
  MpiCommunicator out;
  std::memcpy(&out.handle, &comm, sizeof comm);
  return out;
}

}  // namespace weightcast
