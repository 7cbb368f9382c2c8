// The caller's CUDA stream as a value: "no stream" and CUDA's default stream (handle 0) are
// different all the way from the Python binding to the CUDA calls (issue 38: torch's default
// stream arrived as 0 and was taken for "none", so the load never waited for init kernels).
// What only a GPU can show (the load waits for work queued on each) is tests/gpu/gpu_check.sh's.
#include "weightcast/core/error.hpp"
#include "weightcast/device/cuda_stream.hpp"
#include "weightcast/pipeline/loader.hpp"

#ifdef WEIGHTCAST_HAVE_CUDA
#include "weightcast/device/detail/cuda_resources.hpp"
#endif

#include <catch2/catch.hpp>

#include <cstdint>

using weightcast::CallerStream;
using Kind = weightcast::CallerStream::Kind;

TEST_CASE("caller stream: none is not the default stream", "[cuda-stream]") {
  const CallerStream none;
  CHECK(none.is_none());
  CHECK(none == CallerStream::none());

  // torch.cuda.default_stream().cuda_stream is 0: CUDA's default stream, the legacy one.
  const CallerStream zero = CallerStream::from_handle(std::uintptr_t{0});
  CHECK_FALSE(zero.is_none());
  CHECK(zero.kind() == Kind::legacy_default);
  CHECK(zero != none);
  CHECK(zero.handle() == CallerStream::legacy_handle);  // never 0 at the CUDA call
  CHECK(CallerStream::from_handle(static_cast<const void*>(nullptr)) == zero);
  CHECK(CallerStream::from_handle(CallerStream::legacy_handle) == zero);

  const CallerStream per_thread = CallerStream::from_handle(CallerStream::per_thread_handle);
  CHECK(per_thread.kind() == Kind::per_thread_default);

  const CallerStream created = CallerStream::from_handle(std::uintptr_t{0x7f00deadbe00});
  CHECK(created.kind() == Kind::created);
  CHECK(created.handle() == 0x7f00deadbe00);
}

TEST_CASE("caller stream: cudaStreamPerThread is refused with 78, the others accepted",
          "[cuda-stream][loader]") {
  weightcast::LoadOptions options;
  CHECK(options.cuda_stream.is_none());  // the default orders nothing
  CHECK_NOTHROW(weightcast::check_load_options(options));
  options.cuda_stream = CallerStream::from_handle(std::uintptr_t{0});
  CHECK_NOTHROW(weightcast::check_load_options(options));
  options.cuda_stream = CallerStream::from_handle(std::uintptr_t{0x1234500});
  CHECK_NOTHROW(weightcast::check_load_options(options));
  options.cuda_stream = CallerStream::from_handle(CallerStream::per_thread_handle);
  try {
    weightcast::check_load_options(options);
    FAIL("cudaStreamPerThread accepted");
  } catch (const weightcast::Error& e) {
    CHECK(e.code() == weightcast::Errc::config);
    CHECK_THAT(e.what(), Catch::Contains("LoadOptions::cuda_stream is cudaStreamPerThread"));
  }
}

#ifdef WEIGHTCAST_HAVE_CUDA
// No GPU needed: the handles CUDA's headers define, against the ones the CUDA calls receive.
TEST_CASE("caller stream: the CUDA calls receive cudaStreamLegacy and cudaStreamPerThread",
          "[cuda-stream]") {
  using weightcast::detail::cuda_handle;
  CHECK(cuda_handle(CallerStream::from_handle(std::uintptr_t{0})) == cudaStreamLegacy);
  CHECK(cuda_handle(CallerStream::from_handle(CallerStream::per_thread_handle)) ==
        cudaStreamPerThread);
}
#endif
