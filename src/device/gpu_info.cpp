#include "weightcast/device/gpu_info.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#ifdef WEIGHTCAST_HAVE_CUDA
#include "weightcast/device/detail/cuda_api.hpp"
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
  // No runtime to load is no GPU: the reason names what was looked for and where.
  if (detail::find_cuda_runtime(&probe.error) == nullptr) return probe;
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
  // One line of versions (tests/gpu/gpu_check.sh reads it: the device count, the trailing
  // NCCL version), then where each library came from or why none did.
  std::string runtime_why;
  const detail::CudaRuntimeApi* runtime = detail::find_cuda_runtime(&runtime_why);
  int driver = 0;
  const bool have_driver =
      runtime != nullptr && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  const CudaProbe probe = probe_cuda();
  std::string nccl_why;
  const detail::NcclApi* nccl = detail::find_nccl(&nccl_why);
  out += fmt::format("run time: CUDA runtime {}, driver {}, {}, NCCL {}\n",
                     runtime != nullptr ? cuda_version(runtime->version) : "not loaded",
                     have_driver ? cuda_version(driver) : "none",
                     probe.error.empty() ? fmt::format("{} CUDA device{}", probe.device_count,
                                                       probe.device_count == 1 ? "" : "s")
                                         : fmt::format("no CUDA device ({})", probe.error),
                     nccl != nullptr ? nccl_version(nccl->version) : "not loaded");
  // The reason a runtime is missing is in the device clause above already.
  out += fmt::format("loaded: {}; {}\n",
                     runtime != nullptr ? runtime->path : "no CUDA runtime (see above)",
                     nccl != nullptr ? nccl->path : nccl_why);
  return out;
}

#else

CudaProbe probe_cuda() noexcept {
  CudaProbe probe;
  probe.error = "this build has no CUDA";
  return probe;
}

bool built_with_cuda() noexcept { return false; }

void set_cuda_library_dirs(std::vector<std::string>) {}

std::string gpu_support_report() {
  return "compiled in: no CUDA, no NCCL (configured with -DWEIGHTCAST_CUDA=OFF, or the CUDA "
         "toolkit's headers were not found)\nrun time: not probed (this build has no CUDA)\n";
}

#endif

}  // namespace weightcast
