/**
 * @file gpu_info.hpp
 * @brief What GPU support this build has, and what the machine offers at run time.
 *
 * For `weightcast --version` and for `device: auto`. Every function exists in every build;
 * without CUDA compiled in they say so instead of failing.
 */
#pragma once

#include <string>
#include <vector>

namespace weightcast {

/// The outcome of asking the CUDA runtime for devices.
struct CudaProbe {
  int device_count = 0;  ///< Devices this process can use; 0 on failure.
  std::string error;     ///< Empty on success, else e.g. "cudaErrorNoDevice: no CUDA-capable
                         ///< device is detected" or "this build has no CUDA".
};

/// @return `cudaGetDeviceCount`'s answer. Never throws.
CudaProbe probe_cuda() noexcept;

/**
 * @brief The CUDA device a rank uses, from its local rank and the devices it can see.
 *
 * The rule: a process that sees exactly one device uses it (ordinal 0), whatever its local
 * rank — one GPU per rank, as Slurm's `--gpus-per-task=1` or a per-rank
 * `CUDA_VISIBLE_DEVICES` gives; a process that sees several uses ordinal @p local_rank (one
 * process per GPU of the node, all GPUs visible: torchrun, mpirun). A local rank past the last
 * visible device is refused rather than wrapped (`local_rank % visible`): wrapping would put
 * two ranks on one GPU, which NCCL refuses later with a less clear error ("Duplicate GPU
 * detected" before 2.30, NCCL docs, "Creating a Communicator"; from 2.30 "Multiple Ranks are
 * using the same GPU/Partition", unless NCCL_MULTI_RANK_GPU_ENABLE=1) and which doubles the
 * memory a GPU holds under the mpi transport.
 * @param local_rank this process's rank on its node (`World::local_rank`), ≥ 0.
 * @param visible_devices `cudaGetDeviceCount` (after `CUDA_VISIBLE_DEVICES`), ≥ 0.
 * @return the ordinal, 0 ≤ ordinal < @p visible_devices.
 * @throws Error `unavailable` (69) when no device is visible, or when @p local_rank ≥
 *         @p visible_devices > 1 (names both and what to set); `internal` (70) for a negative
 *         @p local_rank.
 */
[[nodiscard]] int cuda_ordinal_for_local_rank(int local_rank, int visible_devices);

/// @return true when the cuda device and the nccl transport are compiled in.
[[nodiscard]] bool built_with_cuda() noexcept;

/**
 * @return lines for `--version`: what was compiled in (the CUDA runtime and NCCL versions of
 *         the headers), what was found at run time (`cudaRuntimeGetVersion`,
 *         `cudaDriverGetVersion`, `cudaGetDeviceCount` with the error when it fails,
 *         `ncclGetVersion`), and the files the CUDA runtime and NCCL were loaded from (or why
 *         none was). Each line ends in a newline.
 */
std::string gpu_support_report();

/**
 * @brief Directories to look in for the CUDA runtime and NCCL before the system's
 *        (device/detail/cuda_api.hpp lists the whole search); the Python package passes
 *        those of torch's `nvidia-*` wheels.
 *
 * Takes effect only before the first CUDA or NCCL use in the process (the outcome of a search
 * is kept). A directory that does not exist is skipped. Does nothing in a build without CUDA.
 */
void set_cuda_library_dirs(std::vector<std::string> dirs);

}  // namespace weightcast
