// The CUDA runtime and NCCL, found and bound at run time (device/detail/cuda_api.hpp says
// where they are looked for and why in that order).
#include "weightcast/device/detail/cuda_api.hpp"

#include "weightcast/core/error.hpp"

#include <dlfcn.h>
#include <link.h>

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>

// The symbol a name stands for after the headers' macros (see WEIGHTCAST_CUDART_FUNCTIONS).
#define WEIGHTCAST_SYMBOL_TEXT(x) #x
#define WEIGHTCAST_SYMBOL(x) WEIGHTCAST_SYMBOL_TEXT(x)

namespace weightcast {

namespace {

std::mutex& dirs_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<std::string>& dirs() {
  static std::vector<std::string> value;
  return value;
}

/// What a library is, where it is overridden, and the sonames to ask the dynamic loader for.
struct LibrarySpec {
  const char* what;    // "CUDA runtime (libcudart)"
  const char* env;     // "WEIGHTCAST_CUDART"
  std::vector<std::string> sonames;
  const char* advice;  // how to provide one
};

/// Where a library may come from, in the order tried (cuda_api.hpp, the search).
struct Candidate {
  std::string name;  // a path, or a soname for the dynamic loader
  int flags;
  const char* how;   // "already loaded", "torch's wheel", ...
};

std::vector<Candidate> candidates(const LibrarySpec& spec) {
  std::vector<Candidate> out;
  if (const char* path = std::getenv(spec.env); path != nullptr && *path != '\0') {
    out.push_back({path, RTLD_NOW | RTLD_LOCAL, spec.env});
    return out;
  }
  for (const std::string& soname : spec.sonames) {
    out.push_back({soname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, "already loaded"});
  }
  // The environment's folders (the console script passes torch's there), then the ones the
  // process gave; a folder without the soname is passed over, as the loader's path would be.
  std::vector<std::pair<std::string, const char*>> folders;
  if (const char* list = std::getenv("WEIGHTCAST_CUDA_LIBRARY_DIRS"); list != nullptr) {
    std::string_view rest(list);
    while (!rest.empty()) {
      const std::size_t colon = rest.find(':');
      const std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) folders.emplace_back(std::string(dir), "WEIGHTCAST_CUDA_LIBRARY_DIRS");
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
  }
  {
    const std::lock_guard lock(dirs_mutex());
    for (const std::string& dir : dirs()) folders.emplace_back(dir, "given directory");
  }
  for (const auto& [dir, how] : folders) {
    for (const std::string& soname : spec.sonames) {
      const std::filesystem::path path = std::filesystem::path(dir) / soname;
      std::error_code ignored;
      if (std::filesystem::exists(path, ignored)) {
        out.push_back({path.string(), RTLD_NOW | RTLD_LOCAL, how});
      }
    }
  }
  for (const std::string& soname : spec.sonames) {
    out.push_back({soname, RTLD_NOW | RTLD_LOCAL, "system"});
  }
  return out;
}

std::string file_of(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      *map->l_name != '\0') {
    return map->l_name;
  }
  return fallback;
}

std::string cuda_version_text(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }
std::string nccl_version_text(int v) {
  return fmt::format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100);
}

/// Resolves every slot of @p api from @p handle; @return the names that are missing.
std::string resolve(void* handle, detail::CudaRuntimeApi& api) {
  std::string missing;
#define WEIGHTCAST_RESOLVE(name)                                                      \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(handle, WEIGHTCAST_SYMBOL(name))); \
  if (api.name == nullptr) missing += " " WEIGHTCAST_SYMBOL(name);
  WEIGHTCAST_CUDART_FUNCTIONS(WEIGHTCAST_RESOLVE)
#define WEIGHTCAST_RESOLVE_TYPED(name, type) WEIGHTCAST_RESOLVE(name)
  WEIGHTCAST_CUDART_OVERLOADED_FUNCTIONS(WEIGHTCAST_RESOLVE_TYPED)
#undef WEIGHTCAST_RESOLVE_TYPED
  return missing;
}

std::string resolve(void* handle, detail::NcclApi& api) {
  std::string missing;
  WEIGHTCAST_NCCL_FUNCTIONS(WEIGHTCAST_RESOLVE)
#undef WEIGHTCAST_RESOLVE
  return missing;
}

/// @return the library's version, or an empty optional with @p why set.
std::optional<int> version_of(const detail::CudaRuntimeApi& api, std::string& why) {
  int version = 0;
  const cudaError_t status = api.cudaRuntimeGetVersion(&version);
  if (status != cudaSuccess) {
    why = fmt::format("cudaRuntimeGetVersion failed: {}", api.cudaGetErrorName(status));
    return std::nullopt;
  }
  if (version < detail::min_cuda_runtime_version) {
    why = fmt::format("CUDA runtime {} is older than {}, the oldest weightcast uses",
                      cuda_version_text(version),
                      cuda_version_text(detail::min_cuda_runtime_version));
    return std::nullopt;
  }
  return version;
}

std::optional<int> version_of(const detail::NcclApi& api, std::string& why) {
  int version = 0;
  const ncclResult_t status = api.ncclGetVersion(&version);
  if (status != ncclSuccess) {
    why = fmt::format("ncclGetVersion failed: {}", api.ncclGetErrorString(status));
    return std::nullopt;
  }
  if (version < detail::min_nccl_version) {
    why = fmt::format("NCCL {} is older than {}, the oldest weightcast uses",
                      nccl_version_text(version), nccl_version_text(detail::min_nccl_version));
    return std::nullopt;
  }
  return version;
}

template <class Api>
struct Outcome {
  std::optional<Api> api;
  std::string why;  // empty when found
};

/// Tries each candidate in turn; the first that opens, has every function and is new enough
/// is kept (and never closed). A rejected one is closed only if this search opened it.
template <class Api>
Outcome<Api> load(const LibrarySpec& spec) noexcept {
  Outcome<Api> outcome;
  try {
    std::string tried;
    for (const Candidate& candidate : candidates(spec)) {
      static_cast<void>(dlerror());
      void* handle = dlopen(candidate.name.c_str(), candidate.flags);
      if (handle == nullptr) {
        // A soname not already loaded is not worth a line: the system step tries it again.
        if ((candidate.flags & RTLD_NOLOAD) == 0) {
          const char* error = dlerror();
          tried += fmt::format("; {} ({}): {}", candidate.name, candidate.how,
                               error != nullptr ? error : "cannot load");
        }
        continue;
      }
      Api api;
      api.path = file_of(handle, candidate.name);
      std::string why;
      const std::string missing = resolve(handle, api);
      std::optional<int> version;
      if (!missing.empty()) {
        why = fmt::format("lacks{} (too old)", missing);
      } else {
        version = version_of(api, why);
      }
      if (version) {
        api.version = *version;
        spdlog::debug("{}: {} ({})", spec.what, api.path, candidate.how);
        outcome.api = std::move(api);
        return outcome;
      }
      tried += fmt::format("; {} ({}): {}", api.path, candidate.how, why);
      // Never close a copy someone else loaded (torch's): the reference this dlopen took is
      // dropped, the library stays.
      dlclose(handle);
    }
    outcome.why = fmt::format("{} not found or not usable: tried{}; {}", spec.what,
                              tried.empty() ? std::string(" nothing") : tried.substr(1),
                              spec.advice);
  } catch (...) {
    outcome.why = fmt::format("{}: the search for it failed (out of memory)", spec.what);
  }
  return outcome;
}

const LibrarySpec& cuda_runtime_spec() {
  static const LibrarySpec spec{
      "CUDA runtime (libcudart)", "WEIGHTCAST_CUDART",
#if CUDART_VERSION >= 13000
      {"libcudart.so.13", "libcudart.so.12"},
#else
      {"libcudart.so.12"},
#endif
      "install torch with CUDA (its nvidia-cuda-runtime wheel) or the CUDA toolkit, or set "
      "WEIGHTCAST_CUDART to the path of libcudart.so"};
  return spec;
}

const LibrarySpec& nccl_spec() {
  static const LibrarySpec spec{
      "NCCL (libnccl)", "WEIGHTCAST_NCCL", {"libnccl.so.2"},
      "install torch with CUDA (its nvidia-nccl wheel) or NCCL, or set WEIGHTCAST_NCCL to the "
      "path of libnccl.so.2"};
  return spec;
}

const Outcome<detail::CudaRuntimeApi>& runtime_outcome() noexcept {
  static const Outcome<detail::CudaRuntimeApi> outcome =
      load<detail::CudaRuntimeApi>(cuda_runtime_spec());
  return outcome;
}

const Outcome<detail::NcclApi>& nccl_outcome() noexcept {
  static const Outcome<detail::NcclApi> outcome = load<detail::NcclApi>(nccl_spec());
  return outcome;
}

}  // namespace

void set_cuda_library_dirs(std::vector<std::string> given) {
  const std::lock_guard lock(dirs_mutex());
  dirs() = std::move(given);
}

namespace detail {

const CudaRuntimeApi* find_cuda_runtime(std::string* why) noexcept {
  const auto& outcome = runtime_outcome();
  if (outcome.api) return &*outcome.api;
  if (why != nullptr) {
    try {
      *why = outcome.why;
    } catch (...) {
    }
  }
  return nullptr;
}

const NcclApi* find_nccl(std::string* why) noexcept {
  const auto& outcome = nccl_outcome();
  if (outcome.api) return &*outcome.api;
  if (why != nullptr) {
    try {
      *why = outcome.why;
    } catch (...) {
    }
  }
  return nullptr;
}

const CudaRuntimeApi& cuda_runtime() {
  const auto& outcome = runtime_outcome();
  if (outcome.api) [[likely]] return *outcome.api;
  throw Error(Errc::unavailable, outcome.why);
}

const NcclApi& nccl() {
  const auto& outcome = nccl_outcome();
  if (outcome.api) [[likely]] return *outcome.api;
  throw Error(Errc::unavailable, outcome.why);
}

}  // namespace detail

}  // namespace weightcast
