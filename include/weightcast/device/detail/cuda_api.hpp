/**
 * @file cuda_api.hpp
 * @brief The CUDA runtime and NCCL, loaded at run time (dlopen) rather than linked.
 *
 * Internal; only for translation units built with CUDA (`WEIGHTCAST_HAVE_CUDA`). One build
 * then serves CPU and GPU hosts: nothing weightcast builds has a DT_NEEDED entry for
 * libcudart or libnccl, so it starts, and `import weightcast` works, where neither is
 * installed; `device: cuda` and `transport: nccl` are the ones that fail there (69, naming
 * what was looked for and where), and `device: auto` takes host memory.
 *
 * The toolkit's headers give the types, enums and signatures at build time. Each function
 * weightcast calls is a slot in a table (`CudaRuntimeApi`, `NcclApi`) filled with dlsym when
 * the library is first needed, and inside `namespace weightcast` a function object of the
 * same name (`cudaMalloc`, `ncclSend`, ...) forwards to its slot. Code in the namespace
 * therefore reads, and calls, exactly as it would call the linked library: unqualified
 * lookup finds the object before the global declaration, and an object suppresses
 * argument-dependent lookup ([basic.lookup.argdep]/3), so there is no ambiguity. A call that
 * escapes the namespace names the global function, which no build links: it fails at link
 * time, never silently at run time.
 *
 * Where a library is searched for (the first that loads and has every function wins):
 *   1. the path in `WEIGHTCAST_CUDART` / `WEIGHTCAST_NCCL`, when set: only that one (an
 *      override that a found library could overrule would not be one);
 *   2. a copy already loaded in the process, by soname (torch's, once torch is imported: a
 *      communicator torch's NCCL made must be driven by that same NCCL, and two CUDA
 *      runtimes in one process do not share streams or events);
 *   3. the directories in `WEIGHTCAST_CUDA_LIBRARY_DIRS` (colon-separated; the wheel's
 *      `weightcast` console script sets it to torch's `nvidia-*` wheels' folders, since the
 *      CLI binary cannot ask Python where they are), then those given to
 *      `set_cuda_library_dirs` (the Python package passes the same folders: nvidia/cu13/lib,
 *      nvidia/cuda_runtime/lib, nvidia/nccl/lib); a folder without the soname is passed over;
 *   4. the system's sonames through the dynamic loader's search (LD_LIBRARY_PATH,
 *      ld.so.cache): libcudart.so.13, libcudart.so.12; libnccl.so.2.
 * A library found is never unloaded: the CUDA runtime must outlive every static destructor.
 */
#pragma once

#include "weightcast/device/gpu_info.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>
#include <type_traits>
#include <utility>

// Every CUDA runtime function weightcast calls. The names go through the headers' macros
// (a header may map a name to a versioned symbol): the slot and the symbol looked up are the
// expanded name, so they always agree with the signature compiled against.
#define WEIGHTCAST_CUDART_FUNCTIONS(X)  \
  X(cudaRuntimeGetVersion)              \
  X(cudaDriverGetVersion)               \
  X(cudaGetDeviceCount)                 \
  X(cudaGetErrorName)                   \
  X(cudaGetErrorString)                 \
  X(cudaGetLastError)                   \
  X(cudaGetDevice)                      \
  X(cudaSetDevice)                      \
  X(cudaGetDriverEntryPointByVersion)   \
  X(cudaMemGetInfo)                     \
  X(cudaStreamCreateWithFlags)          \
  X(cudaStreamDestroy)                  \
  X(cudaStreamQuery)                    \
  X(cudaStreamSynchronize)              \
  X(cudaStreamWaitEvent)                \
  X(cudaEventCreateWithFlags)           \
  X(cudaEventDestroy)                   \
  X(cudaEventQuery)                     \
  X(cudaEventRecord)                    \
  X(cudaEventSynchronize)               \
  X(cudaFree)                           \
  X(cudaFreeHost)                       \
  X(cudaHostRegister)                   \
  X(cudaHostUnregister)                 \
  X(cudaMemcpyAsync)

// The ones cuda_runtime.h (which nccl.h includes) also declares as C++ templates
// (`cudaMalloc(T**, size_t)`), whose address `decltype` cannot take: named with the C
// function's type.
#define WEIGHTCAST_CUDART_OVERLOADED_FUNCTIONS(X)              \
  X(cudaMalloc, cudaError_t (*)(void**, size_t))               \
  X(cudaHostAlloc, cudaError_t (*)(void**, size_t, unsigned int))

// Every NCCL function weightcast calls.
#define WEIGHTCAST_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)                  \
  X(ncclGetErrorString)              \
  X(ncclGetLastError)                \
  X(ncclGetUniqueId)                 \
  X(ncclCommInitRankConfig)          \
  X(ncclCommGetAsyncError)           \
  X(ncclCommFinalize)                \
  X(ncclCommDestroy)                 \
  X(ncclCommAbort)                   \
  X(ncclCommUserRank)                \
  X(ncclCommCount)                   \
  X(ncclCommCuDevice)                \
  X(ncclGroupStart)                  \
  X(ncclGroupEnd)                    \
  X(ncclSend)                        \
  X(ncclRecv)                        \
  X(ncclBroadcast)

namespace weightcast {

namespace detail {

/// The oldest CUDA runtime weightcast accepts, as `cudaRuntimeGetVersion` encodes it:
/// 12.5, the first with `cudaGetDriverEntryPointByVersion` (CUDA Runtime API, "Driver Entry
/// Point Access"), which `CudaDeviceScope` reaches the driver's context calls through.
inline constexpr int min_cuda_runtime_version = 12050;

/// The oldest NCCL weightcast accepts, as `ncclGetVersion` encodes it: 2.14, the release that
/// brought `ncclCommInitRankConfig` with `ncclConfig_t`, non-blocking communicators
/// (`config.blocking = 0`: calls return `ncclInProgress`, the state is polled with
/// `ncclCommGetAsyncError`) and `ncclCommFinalize` (NCCL release notes 2.14; NCCL docs,
/// "Creating a communicator with options" and "Fault Tolerance": only a non-blocking
/// communicator lets the caller give up on a stalled peer with `ncclCommAbort` instead of
/// hanging in the call). The transport relies on all three (transport_nccl.cpp); a library
/// that lacks one of the functions is refused by the symbol check as well.
inline constexpr int min_nccl_version = 21400;

/// The CUDA runtime's functions, resolved from one loaded library.
struct CudaRuntimeApi {
#define WEIGHTCAST_CUDA_API_SLOT(name) decltype(&::name) name = nullptr;
#define WEIGHTCAST_CUDA_API_TYPED_SLOT(name, type) std::type_identity_t<type> name = nullptr;
  WEIGHTCAST_CUDART_FUNCTIONS(WEIGHTCAST_CUDA_API_SLOT)
  WEIGHTCAST_CUDART_OVERLOADED_FUNCTIONS(WEIGHTCAST_CUDA_API_TYPED_SLOT)
#undef WEIGHTCAST_CUDA_API_TYPED_SLOT
  std::string path;  ///< The library's file (dlinfo), for --version and messages.
  int version = 0;   ///< `cudaRuntimeGetVersion`: 1000 * major + 10 * minor.
};

/// NCCL's functions, resolved from one loaded library.
struct NcclApi {
  WEIGHTCAST_NCCL_FUNCTIONS(WEIGHTCAST_CUDA_API_SLOT)
#undef WEIGHTCAST_CUDA_API_SLOT
  std::string path;  ///< The library's file (dlinfo).
  int version = 0;   ///< `ncclGetVersion`: 10000 * major + 100 * minor + patch.
};

/// @return the CUDA runtime, loaded by the first call (the outcome, failure too, is kept),
///         or nullptr with @p why (when given) set to what was looked for, where, and what
///         each attempt said. Never throws.
const CudaRuntimeApi* find_cuda_runtime(std::string* why = nullptr) noexcept;

/// @return NCCL, as `find_cuda_runtime` does the runtime.
const NcclApi* find_nccl(std::string* why = nullptr) noexcept;

/// @return the CUDA runtime.
/// @throws Error `unavailable` (69) naming what was looked for and where when none loads or
///         the one found is older than `min_cuda_runtime_version`.
const CudaRuntimeApi& cuda_runtime();

/// @return NCCL. @throws Error `unavailable` (69) as `cuda_runtime` does.
const NcclApi& nccl();

/// The function object behind each name: calls slot @p Slot of the loaded CUDA runtime.
template <auto Slot>
struct CudaRuntimeCall {
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    return (cuda_runtime().*Slot)(std::forward<Args>(args)...);
  }
};

/// The function object behind each name: calls slot @p Slot of the loaded NCCL.
template <auto Slot>
struct NcclCall {
  template <class... Args>
  decltype(auto) operator()(Args&&... args) const {
    return (nccl().*Slot)(std::forward<Args>(args)...);
  }
};

}  // namespace detail

// `cudaMalloc(&p, n)` in namespace weightcast calls the loaded runtime's cudaMalloc (see the
// file comment); the first such call loads it, or throws Error 69 saying why it cannot.
#define WEIGHTCAST_CUDA_API_CALL(name) \
  inline constexpr detail::CudaRuntimeCall<&detail::CudaRuntimeApi::name> name{};
WEIGHTCAST_CUDART_FUNCTIONS(WEIGHTCAST_CUDA_API_CALL)
#define WEIGHTCAST_CUDA_API_TYPED_CALL(name, type) WEIGHTCAST_CUDA_API_CALL(name)
WEIGHTCAST_CUDART_OVERLOADED_FUNCTIONS(WEIGHTCAST_CUDA_API_TYPED_CALL)
#undef WEIGHTCAST_CUDA_API_TYPED_CALL
#undef WEIGHTCAST_CUDA_API_CALL
#define WEIGHTCAST_NCCL_API_CALL(name) \
  inline constexpr detail::NcclCall<&detail::NcclApi::name> name{};
WEIGHTCAST_NCCL_FUNCTIONS(WEIGHTCAST_NCCL_API_CALL)
#undef WEIGHTCAST_NCCL_API_CALL

}  // namespace weightcast
