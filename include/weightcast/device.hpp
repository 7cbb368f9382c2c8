/**
 * @file device.hpp
 * @brief Where tensors land: the arena, and the upload from a staging slot into it.
 *
 * `host` (DESIGN.md layer 7): the arena is page-aligned host memory and an upload is a
 * `memcpy`, finished when `upload()` returns. A `cuda` device (later) uploads with
 * `cudaMemcpyAsync` on a copy stream and completes through a CUDA event.
 */
#pragma once

#include "weightcast/pending.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace weightcast {

/// Where an arena's memory lives.
enum class MemoryKind { host, cuda };

/// A rank's destination memory; tensors are views into it.
class Arena {
 public:
  virtual ~Arena() = default;
  /// @return the first byte (host or device address, per `kind()`); null when `bytes()` is 0.
  [[nodiscard]] virtual std::byte* data() const noexcept = 0;
  /// @return the arena size, bytes.
  [[nodiscard]] virtual std::uint64_t bytes() const noexcept = 0;
  [[nodiscard]] virtual MemoryKind kind() const noexcept = 0;
};

/**
 * @brief Page-aligned host memory, committed lazily by the kernel (anonymous `mmap`).
 * @param bytes arena size; 0 gives an empty arena.
 * @throws Error `unavailable` when the memory cannot be mapped (names the size).
 */
std::shared_ptr<Arena> make_host_arena(std::uint64_t bytes);

/// A destination device.
class Device {
 public:
  virtual ~Device() = default;
  /// @return "host" or "cuda:N".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// @return an arena of @p bytes on this device.
  virtual std::shared_ptr<Arena> allocate_arena(std::uint64_t bytes) = 0;
  /**
   * @brief Copies @p bytes from host @p source (a staging slot) to @p destination (arena).
   * @return null when the copy is already complete, else the copy in flight; @p source must
   *         stay valid until it completes.
   */
  virtual std::unique_ptr<Pending> upload(const std::byte* source, std::byte* destination,
                                          std::uint64_t bytes) = 0;
};

/// @return the host device: `memcpy` uploads into a host arena.
std::unique_ptr<Device> make_host_device();

}  // namespace weightcast
