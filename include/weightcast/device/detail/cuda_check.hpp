/**
 * @file cuda_check.hpp
 * @brief `WEIGHTCAST_CUDA_TRY` / `WEIGHTCAST_NCCL_TRY`: a failed CUDA or NCCL call becomes a
 *        `weightcast::Error` naming the call, the error name and its description.
 *
 * Internal; only for translation units built with CUDA (`WEIGHTCAST_HAVE_CUDA`). The message
 * is built only on failure, in an out-of-line function.
 */
#pragma once

#include "weightcast/device/detail/cuda_api.hpp"

namespace weightcast::detail {

/**
 * @brief Throws `Error` for a failed CUDA runtime call: "cudaMalloc(&p, bytes) failed:
 *        cudaErrorMemoryAllocation: out of memory".
 *
 * Class `unavailable` (69) where the machine lacks what is needed (no device or driver, out
 * of memory, device busy), else `internal` (70). Clears the thread's last error first
 * (`cudaGetLastError`) so a non-sticky error does not resurface in a later call.
 */
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call);

/**
 * @brief Throws `Error` for a failed NCCL call: "ncclBroadcast(...) failed: ncclRemoteError
 *        (remote process exited or there was a network error); last NCCL error: ...",
 *        with `ncclGetErrorString` and `ncclGetLastError(comm)` (NCCL docs, "Error handling").
 *
 * Class `unavailable` (69) for system, remote, CUDA and internal failures (a peer or the
 * fabric is gone); `internal` (70) for invalid arguments or usage (a weightcast bug).
 */
[[noreturn]] void throw_nccl_error(ncclResult_t status, const char* call, ncclComm_t comm);

}  // namespace weightcast::detail

/// Evaluates a CUDA runtime call; throws `weightcast::Error` unless it returns `cudaSuccess`.
#define WEIGHTCAST_CUDA_TRY(call)                                          \
  do {                                                                     \
    const cudaError_t weightcast_cuda_status_ = (call);                    \
    if (weightcast_cuda_status_ != cudaSuccess) [[unlikely]] {             \
      ::weightcast::detail::throw_cuda_error(weightcast_cuda_status_, #call); \
    }                                                                      \
  } while (0)

/// Evaluates an NCCL call on communicator @p comm (may be null); throws `weightcast::Error`
/// unless it returns `ncclSuccess` or `ncclInProgress` (non-blocking communicators return
/// the latter while work is still being enqueued; poll `ncclCommGetAsyncError`).
#define WEIGHTCAST_NCCL_TRY(call, comm)                                           \
  do {                                                                            \
    const ncclResult_t weightcast_nccl_status_ = (call);                          \
    if (weightcast_nccl_status_ != ncclSuccess &&                                 \
        weightcast_nccl_status_ != ncclInProgress) [[unlikely]] {                 \
      ::weightcast::detail::throw_nccl_error(weightcast_nccl_status_, #call, (comm)); \
    }                                                                             \
  } while (0)
