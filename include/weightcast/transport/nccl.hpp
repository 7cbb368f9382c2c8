/**
 * @file nccl.hpp
 * @brief Hands a caller's `ncclComm_t` to weightcast (`JobOptions::nccl_communicator`).
 *
 * The one weightcast header that includes nccl.h: include it where you have an
 * `ncclComm_t`.
 */
#pragma once

#include "weightcast/transport/communicators.hpp"

#include <nccl.h>

namespace weightcast {

/// @return @p comm, created on CUDA device @p cuda_device, as the opaque value
///         `JobOptions::nccl_communicator` takes. Never throws.
inline NcclCommunicator nccl_communicator(ncclComm_t comm, int cuda_device) noexcept {
  return NcclCommunicator{static_cast<void*>(comm), cuda_device};
}

}  // namespace weightcast
