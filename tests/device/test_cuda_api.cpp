// The CUDA runtime and NCCL are loaded at run time (device/detail/cuda_api.hpp): nothing built
// needs either to start, `device: cuda` without one fails with 69 saying what was looked for
// and where, and `device: auto` then takes host memory. Where this machine has the libraries
// (the toolkit in /usr/local/cuda, no GPU needed) the loader finds them and reads versions.
#include "weightcast/device/gpu_info.hpp"

#ifdef WEIGHTCAST_HAVE_CUDA
#include "weightcast/device/detail/cuda_api.hpp"
#endif

#include "support/paths.hpp"
#include "support/process.hpp"

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <filesystem>
#include <sstream>
#include <string>

using namespace weightcast;
using namespace weightcast::test;

namespace {

// The DT_NEEDED lines of an ELF file, from readelf.
std::string needed_of(const std::filesystem::path& file) {
  const auto r = run_process({"/usr/bin/readelf", "-d", file.string()}, {}, 60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  std::string needed;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("(NEEDED)") != std::string::npos) needed += line + "\n";
  }
  REQUIRE_FALSE(needed.empty());  // every dynamic executable needs libc at least
  return needed;
}

// Whether the dynamic loader finds @p soname by itself (the system step of the search).
bool system_has(const char* soname) {
  void* handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

}  // namespace

TEST_CASE("the launcher and the test binary link neither libcudart nor libnccl",
          "[cuda-api]") {
  if (!std::filesystem::exists("/usr/bin/readelf")) {
    WARN("skipped: /usr/bin/readelf not found (binutils)");
    return;
  }
  for (const std::filesystem::path& file :
       {cli_path(), std::filesystem::read_symlink("/proc/self/exe")}) {
    const std::string needed = needed_of(file);
    INFO(file << ":\n" << needed);
    CHECK(needed.find("libcudart") == std::string::npos);
    CHECK(needed.find("libnccl") == std::string::npos);
    CHECK(needed.find("libcuda.") == std::string::npos);
  }
}

TEST_CASE("device: cuda with no CUDA runtime to load exits 69 naming what it looked for",
          "[run][gpu-info][cuda-api]") {
  if (!built_with_cuda()) {
    WARN("skipped: this build has no CUDA (test_gpu.cpp covers its errors)");
    return;
  }
  const auto file = small_checkpoint();
  const std::string missing = "WEIGHTCAST_CUDART=/nonexistent/libcudart.so.13";
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set", "device=cuda"},
                         {missing});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 69);
  CHECK_THAT(r.err, Catch::Contains("no usable CUDA device (CUDA runtime (libcudart) not found") &&
                        Catch::Contains("/nonexistent/libcudart.so.13 (WEIGHTCAST_CUDART)") &&
                        Catch::Contains("cannot open shared object file"));

  const auto automatic = run_cli(
      {"run", "--set", "checkpoint=" + file.string(), "--set", "device=auto"}, {missing});
  INFO(automatic.out << automatic.err);
  REQUIRE(automatic.exit_status == 0);
  CHECK_THAT(automatic.err,
             Catch::Contains("device: auto: using host memory: CUDA runtime (libcudart) not found"));
  CHECK_THAT(automatic.out, Catch::Contains("device host"));

  // --version starts and says the same instead of failing.
  const auto version = run_cli({"--version"}, {missing});
  INFO(version.out << version.err);
  CHECK(version.exit_status == 0);
  CHECK_THAT(version.out, Catch::Contains("run time: CUDA runtime not loaded"));
}

// transport: nccl needs device: cuda, which fails first on a machine without a GPU; that an
// NCCL which cannot be loaded is no failure to start, and what is said about it, shows here.
TEST_CASE("an NCCL that cannot be loaded is named by --version, which still starts",
          "[gpu-info][cuda-api]") {
  if (!built_with_cuda()) {
    WARN("skipped: this build has no CUDA");
    return;
  }
  const auto r = run_cli({"--version"}, {"WEIGHTCAST_NCCL=/nonexistent/libnccl.so.2"});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains(", NCCL not loaded\n") &&
                        Catch::Contains("NCCL (libnccl) not found or not usable: tried "
                                        "/nonexistent/libnccl.so.2 (WEIGHTCAST_NCCL)"));
}

// The wheel's console script passes torch's nvidia-* folders to the CLI binary this way
// (python/weightcast/_cli.py): a folder there is searched before the system's, and one
// without the library is passed over.
TEST_CASE("the CLI loads the CUDA runtime from a folder in WEIGHTCAST_CUDA_LIBRARY_DIRS",
          "[gpu-info][cuda-api]") {
  if (!built_with_cuda()) {
    WARN("skipped: this build has no CUDA");
    return;
  }
  std::filesystem::path real;
  for (const char* dir : {"/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"}) {
    if (std::filesystem::exists(std::filesystem::path(dir) / "libcudart.so.13")) {
      real = std::filesystem::path(dir) / "libcudart.so.13";
      break;
    }
  }
  if (real.empty()) {
    WARN("skipped: no libcudart.so.13 in /usr/local/cuda to put in a folder of its own");
    return;
  }
  const TempDir folder("weightcast-cuda-dirs");
  std::filesystem::create_symlink(std::filesystem::canonical(real), folder / "libcudart.so.13");
  const std::string dirs = "WEIGHTCAST_CUDA_LIBRARY_DIRS=/nonexistent::" + folder.path().string();
  const auto r = run_cli({"--version"}, {dirs});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains("loaded: " + (folder / "libcudart.so.13").string() + ";"));
}

#ifdef WEIGHTCAST_HAVE_CUDA
TEST_CASE("the loader finds the system's CUDA runtime and NCCL and reads their versions",
          "[cuda-api]") {
  if (!system_has("libcudart.so.13") && !system_has("libcudart.so.12")) {
    WARN("skipped: the dynamic loader finds no libcudart.so.13 or .12 on this machine");
    return;
  }
  std::string why;
  const detail::CudaRuntimeApi* runtime = detail::find_cuda_runtime(&why);
  INFO(why);
  REQUIRE(runtime != nullptr);
  CHECK(runtime->version >= detail::min_cuda_runtime_version);
  CHECK_THAT(runtime->path, Catch::Contains("libcudart.so.1"));
  // Without a driver (this machine, CI) the runtime still loads; the probe then reports no
  // device and why, and never a count.
  const CudaProbe probe = probe_cuda();
  if (probe.device_count == 0) {
    CHECK_THAT(probe.error, Catch::StartsWith("cuda"));
  } else {
    CHECK(probe.error.empty());
  }

  if (!system_has("libnccl.so.2")) {
    WARN("skipped the NCCL half: the dynamic loader finds no libnccl.so.2 on this machine");
    return;
  }
  const detail::NcclApi* nccl = detail::find_nccl(&why);
  INFO(why);
  REQUIRE(nccl != nullptr);
  CHECK(nccl->version >= detail::min_nccl_version);
  CHECK_THAT(nccl->path, Catch::Contains("libnccl.so"));
}
#endif
