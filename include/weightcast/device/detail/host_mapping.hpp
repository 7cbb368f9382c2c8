/**
 * @file host_mapping.hpp
 * @brief Anonymous host memory on a 2 MiB boundary, advised to use transparent huge pages.
 *
 * Internal (no Asio). The host arena and the staging ring are written once end to end (the
 * arena) or registered with io_uring / pinned for the GPU up front (the ring), so every page
 * is faulted in before or during the load. With 4 KiB pages that is one fault per 4 KiB,
 * which costs several times what 2 MiB pages cost per GiB (bench/RESULTS.md).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weightcast::detail {

/// The transparent huge page size on x86-64 and the usual arm64 configuration (bytes).
constexpr std::uint64_t huge_page_bytes = 2ull << 20;

/**
 * @brief Owns `bytes` of zeroed, lazily committed anonymous memory (`mmap` MAP_PRIVATE |
 * MAP_ANONYMOUS), starting on a 2 MiB boundary.
 *
 * The mapping is not advised `MADV_HUGEPAGE`: the system's transparent huge page policy
 * decides (`/sys/kernel/mm/transparent_hugepage/enabled`). Under `always` the 2 MiB start
 * lets the kernel back it with huge pages; under `madvise` (the usual default) it keeps
 * 4 KiB pages, whose first touch costs the same each time; advised huge pages measured
 * faster or several times slower on a VM, as the kernel had free ones or not (bench/RESULTS.md).
 */
class HostMapping {
 public:
  HostMapping() = default;
  /// @param what names the memory in the error (e.g. "a host arena of 1024 bytes").
  /// @param bytes the size; 0 maps nothing.
  /// @throws Error `unavailable` (69) when `mmap` fails, or @p bytes is too large to map at
  ///         all (within 2 MiB of 2^64: ENOMEM) (names @p what and errno).
  HostMapping(std::uint64_t bytes, std::string_view what);
  ~HostMapping();
  HostMapping(HostMapping&& other) noexcept;
  HostMapping& operator=(HostMapping&& other) noexcept;
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  /// @return the first byte (2 MiB aligned), or nullptr for an empty mapping.
  [[nodiscard]] std::byte* data() const noexcept { return _data; }
  /// @return the usable size in bytes.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return _bytes; }
  /// Gives back to the kernel everything past the first @p bytes (≤ `bytes()`; a multiple
  /// of the page size, else rounded up to one).
  void shrink(std::uint64_t bytes) noexcept;

 private:
  void release() noexcept;
  std::byte* _mapping = nullptr;  // what mmap returned
  std::uint64_t _mapped = 0;      // bytes mapped from _mapping
  std::byte* _data = nullptr;
  std::uint64_t _bytes = 0;
};

}  // namespace weightcast::detail
