// The [gpu] tests' guard: run where a CUDA device is usable, else skip saying why, or fail
// where WEIGHTCAST_REQUIRE_GPU=1 says this machine has a GPU to use (tests/gpu/gpu_check.sh sets
// it, so a driver too old for the toolkit is a failure there, not a pass).
#pragma once

#include "weightcast/device/gpu_info.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <string_view>

namespace weightcast::test {

inline bool gpu_required() {
  const char* value = std::getenv("WEIGHTCAST_REQUIRE_GPU");
  return value != nullptr && std::string_view(value) == "1";
}

/// @return whether a CUDA device is usable; when not, WARNs why the calling [gpu] test is
///         skipped, or FAILs it under WEIGHTCAST_REQUIRE_GPU=1.
inline bool gpu_available() {
  const CudaProbe probe = probe_cuda();
  if (probe.device_count > 0) return true;
  const std::string why = probe.error.empty() ? "none found" : probe.error;
  if (gpu_required()) FAIL("WEIGHTCAST_REQUIRE_GPU=1 but no usable CUDA device: " << why);
  WARN("skipped: needs a CUDA device: " << why);
  return false;
}

}  // namespace weightcast::test

/// First statement of a [gpu] test: returns (skips) where no CUDA device is usable.
#define WEIGHTCAST_REQUIRE_GPU() \
  if (!::weightcast::test::gpu_available()) return
