/**
 * @file gpu_info.hpp
 * @brief What GPU support this build has, and what the machine offers at run time.
 *
 * For `weightcast --version` and for `device: auto`. Every function exists in every build;
 * without CUDA compiled in they say so instead of failing.
 */
#pragma once

#include <string>

namespace weightcast {

/// The outcome of asking the CUDA runtime for devices.
struct CudaProbe {
  int device_count = 0;  ///< Devices this process can use; 0 on failure.
  std::string error;     ///< Empty on success, else e.g. "cudaErrorNoDevice: no CUDA-capable
                         ///< device is detected" or "this build has no CUDA".
};

/// @return `cudaGetDeviceCount`'s answer. Never throws.
CudaProbe probe_cuda() noexcept;

/// @return true when the cuda device and the nccl transport are compiled in.
[[nodiscard]] bool built_with_cuda() noexcept;

/**
 * @return lines for `--version`: what was compiled in (the CUDA runtime and NCCL versions of
 *         the headers) and what was found at run time (`cudaRuntimeGetVersion`,
 *         `cudaDriverGetVersion`, `cudaGetDeviceCount` with the error when it fails,
 *         `ncclGetVersion`). Each line ends in a newline.
 */
std::string gpu_support_report();

}  // namespace weightcast
