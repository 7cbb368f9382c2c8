#include "weightcast/device/gpu_info.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#ifdef WEIGHTCAST_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace weightcast {

int cuda_ordinal_for_local_rank(int local_rank, int visible_devices) {
  WEIGHTCAST_EXPECT(local_rank >= 0, Errc::internal,
                    fmt::format("cuda: local rank {} is negative", local_rank));
  if (visible_devices <= 0) {
    throw Error(Errc::unavailable,
                fmt::format("cuda: local rank {}: no CUDA device is visible", local_rank));
  }
  if (visible_devices == 1) return 0;
  if (local_rank < visible_devices) return local_rank;
  throw Error(Errc::unavailable,
              fmt::format("cuda: local rank {} but this process sees {} CUDA devices (ordinals "
                          "0-{}): give each rank one GPU (CUDA_VISIBLE_DEVICES, Slurm "
                          "--gpus-per-task=1) or every rank all of the node's GPUs, with no more "
                          "ranks per node than GPUs; world.local_rank sets the local rank",
                          local_rank, visible_devices, visible_devices - 1));
}

#ifdef WEIGHTCAST_HAVE_CUDA

namespace {
// CUDA encodes versions as 1000 * major + 10 * minor; NCCL (≥ 2.9) as 10000 * major +
// 100 * minor + patch (nccl.h, NCCL_VERSION).
std::string cuda_version(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }
std::string nccl_version(int v) {
  return fmt::format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100);
}
}  // namespace

CudaProbe probe_cuda() noexcept {
  CudaProbe probe;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    try {
      probe.error = fmt::format("{}: {}", cudaGetErrorName(status), cudaGetErrorString(status));
    } catch (...) {
    }
    return probe;
  }
  probe.device_count = count;
  return probe;
}

bool built_with_cuda() noexcept { return true; }

std::string gpu_support_report() {
  std::string out = fmt::format("compiled in: CUDA runtime {} (headers), NCCL {}.{}.{}\n",
                                cuda_version(CUDART_VERSION), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  int runtime = 0;
  int driver = 0;
  const bool have_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  const CudaProbe probe = probe_cuda();
  int nccl = 0;
  const bool have_nccl = ncclGetVersion(&nccl) == ncclSuccess;
  out += fmt::format("run time: CUDA runtime {}, driver {}, {}, NCCL {}\n",
                     have_runtime ? cuda_version(runtime) : "unknown",
                     have_driver ? cuda_version(driver) : "none",
                     probe.error.empty() ? fmt::format("{} CUDA device{}", probe.device_count,
                                                       probe.device_count == 1 ? "" : "s")
                                         : fmt::format("no CUDA device ({})", probe.error),
                     have_nccl ? nccl_version(nccl) : "unknown");
  return out;
}

#else

CudaProbe probe_cuda() noexcept {
  CudaProbe probe;
  probe.error = "this build has no CUDA";
  return probe;
}

bool built_with_cuda() noexcept { return false; }

std::string gpu_support_report() {
  return "compiled in: no CUDA, no NCCL (configure with -DWEIGHTCAST_CUDA=ON for the GPU "
         "path)\nrun time: not probed (this build has no CUDA)\n";
}

#endif

}  // namespace weightcast
