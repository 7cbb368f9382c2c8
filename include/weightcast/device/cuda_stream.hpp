/**
 * @file cuda_stream.hpp
 * @brief The caller's CUDA stream a load is ordered with, or none: "no stream" and CUDA's
 *        default stream are different values.
 *
 * CUDA gives a stream handle of 0 a meaning of its own (CUDA Runtime API, "Stream
 * synchronization behavior"): the default stream, which is the legacy default stream
 * (`cudaStreamLegacy`, handle 1) in code built without `--default-stream per-thread`. torch
 * is built that way: `torch.cuda.default_stream().cuda_stream` is 0, and that stream is where
 * `init_weights()` after `to_empty()` queues its kernels. A null `void*` therefore cannot
 * also mean "nothing to order with": this type keeps the two apart from the Python binding to
 * the CUDA calls. Plain data; no CUDA header needed.
 */
#pragma once

#include <cstdint>

namespace weightcast {

/// A CUDA stream on the load's device that the load is ordered with, or none.
class CallerStream {
 public:
  enum class Kind : std::uint8_t {
    none,                ///< nothing to order with (host memory, a CPU-only caller)
    legacy_default,      ///< the legacy default stream (handle 0 or `cudaStreamLegacy`)
    per_thread_default,  ///< `cudaStreamPerThread` (handle 2): the calling thread's own
    created,             ///< a stream from `cudaStreamCreate*` (torch.cuda.Stream's handle)
  };

  /// No stream: the load orders nothing (the default).
  constexpr CallerStream() noexcept = default;
  [[nodiscard]] static constexpr CallerStream none() noexcept { return {}; }

  /// @return the stream a `cudaStream_t` handle names, read as CUDA reads it: 0 and 1
  ///         (`cudaStreamLegacy`) the legacy default stream, 2 (`cudaStreamPerThread`) the
  ///         per-thread default stream, anything else a created stream. Never `none`.
  [[nodiscard]] static constexpr CallerStream from_handle(std::uintptr_t handle) noexcept {
    if (handle == 0 || handle == legacy_handle) return CallerStream(Kind::legacy_default, legacy_handle);
    if (handle == per_thread_handle) return CallerStream(Kind::per_thread_default, handle);
    return CallerStream(Kind::created, handle);
  }
  [[nodiscard]] static CallerStream from_handle(const void* handle) noexcept {
    return from_handle(reinterpret_cast<std::uintptr_t>(handle));
  }

  [[nodiscard]] constexpr Kind kind() const noexcept { return _kind; }
  [[nodiscard]] constexpr bool is_none() const noexcept { return _kind == Kind::none; }
  /// @return the handle to pass to CUDA: `cudaStreamLegacy` (never 0, whose meaning depends
  ///         on how the calling code was compiled) for the legacy default stream; 0 for none.
  [[nodiscard]] constexpr std::uintptr_t handle() const noexcept { return _handle; }

  friend constexpr bool operator==(const CallerStream&, const CallerStream&) noexcept = default;

  static constexpr std::uintptr_t legacy_handle = 1;      ///< `cudaStreamLegacy`
  static constexpr std::uintptr_t per_thread_handle = 2;  ///< `cudaStreamPerThread`

 private:
  constexpr CallerStream(Kind kind, std::uintptr_t handle) noexcept : _kind(kind), _handle(handle) {}
  Kind _kind = Kind::none;
  std::uintptr_t _handle = 0;
};

}  // namespace weightcast
