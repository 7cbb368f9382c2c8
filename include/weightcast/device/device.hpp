/**
 * @file device.hpp
 * @brief Where tensors land: the arena, and the upload from a staging slot into it.
 *
 * `host` (docs/DESIGN.md § Devices): the arena is page-aligned host memory and an upload is a
 * `memcpy`, finished when `upload()` returns. `cuda`: the arena is `cudaMalloc` memory, an
 * upload is a `cudaMemcpyAsync` on a non-blocking copy stream of the device's own, and it
 * completes when a CUDA event recorded after the copy has completed (polled, `Pending`).
 *
 * The factories exist in every build; without CUDA compiled in, the cuda ones throw
 * `Errc::unavailable`, so callers need no `#ifdef`.
 */
#pragma once

#include "weightcast/core/settings.hpp"
#include "weightcast/core/memory_kind.hpp"
#include "weightcast/device/cuda_stream.hpp"
#include "weightcast/core/pending.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

namespace weightcast {

/// A rank's destination memory; tensors are views into it.
class Arena {
 public:
  virtual ~Arena() = default;
  /// @return the first byte (host or device address, per `kind()`); null when `bytes()` is 0.
  [[nodiscard]] virtual std::byte* data() const noexcept = 0;
  /// @return the arena size, bytes.
  [[nodiscard]] virtual std::uint64_t bytes() const noexcept = 0;
  /// @return where `data()` points: host or CUDA device memory.
  [[nodiscard]] virtual MemoryKind kind() const noexcept = 0;

  /**
   * @brief Hands the arena bytes [@p offset, @p offset + @p bytes) to @p consume as host
   *        memory, in order, in one or more calls (for digests and checks, not the load path).
   *
   * Host arenas make one call pointing into the arena. Device arenas copy through two pinned
   * bounce halves of up to 4 MiB each (the next copy runs while @p consume reads the other
   * half) on a stream of their own; the arena keeps the halves and the stream from the first
   * call until it is freed (8 MiB of pinned host memory), and one call runs at a time. The
   * caller must have waited for every upload and broadcast into the range.
   * @throws Error `internal` (70) when the range leaves the arena, or for an arena kind
   *         that does not implement it; `unavailable` (69, out of pinnable memory)/`internal`
   *         when a CUDA copy fails (names the call and the CUDA error).
   */
  virtual void read_back(std::uint64_t offset, std::uint64_t bytes,
                         const std::function<void(const std::byte*, std::size_t)>& consume) const;
};

/**
 * @brief Host memory aligned to 2 MiB, committed lazily by the kernel (anonymous `mmap`).
 *
 * Not advised `MADV_HUGEPAGE`: the system's transparent huge page policy decides whether
 * the kernel backs it with 2 MiB pages (`detail::HostMapping`).
 * @param bytes arena size; 0 gives an empty arena.
 * @throws Error `unavailable` (69) when the memory cannot be mapped (names the size), also
 *         for a size within 2 MiB of 2^64 (`detail::HostMapping`).
 */
std::shared_ptr<Arena> make_host_arena(std::uint64_t bytes);

/// A destination device.
class Device {
 public:
  virtual ~Device() = default;
  /// @return "host" or "cuda:N".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// @return an arena of @p bytes on this device.
  /// @throws Error `unavailable` (69) when the memory cannot be had (`host`: as
  ///         `make_host_arena`; `cuda`: "cuda:N: cannot allocate an arena of B bytes" with the
  ///         CUDA error, `internal` (70) for a CUDA error other than out of memory or no
  ///         device, `detail::throw_cuda_error`).
  virtual std::shared_ptr<Arena> allocate_arena(std::uint64_t bytes) = 0;
  /**
   * @brief Copies @p bytes from host @p source (a staging slot) to @p destination (arena).
   * @return null when the copy is already complete (`host`; `cuda` with 0 bytes), else the
   *         copy in flight; @p source must stay valid until it completes.
   * @throws Error (`cuda`) as `detail::throw_cuda_error` when the copy cannot be queued;
   *         `host` never throws.
   */
  virtual std::unique_ptr<Pending> upload(const std::byte* source, std::byte* destination,
                                          std::uint64_t bytes) = 0;

  /// One copy of `upload_all`.
  struct Copy {
    const std::byte* source = nullptr;  ///< Host memory (a staging slot).
    std::byte* destination = nullptr;   ///< This device's memory.
    std::uint64_t bytes = 0;            ///< Length, bytes.
  };
  /**
   * @brief Copies each of @p copies as `upload` does, as one operation: `cuda` queues them
   *        all on the copy stream with one completion event after the last (a chunk of many
   *        pieces costs one event, not one per piece); by default each is an `upload` and the
   *        result completes once all have.
   * @return null when every copy is already complete, else the copies in flight; every
   *         source must stay valid until they complete.
   * @throws Error as `upload`.
   */
  virtual std::unique_ptr<Pending> upload_all(std::span<const Copy> copies);

  /**
   * @return true when a read may land in this device's arena directly, in place of staging
   *         it in a slot and calling `upload()`: the arena is ordinary host memory (`host`).
   *         The loader then reads buffered chunks whose pieces tile one arena range straight
   *         into the arena, with no copy; O_DIRECT chunks still go through a slot (their
   *         aligned superset would spill past the chunk). False for `cuda`.
   */
  [[nodiscard]] virtual bool reads_into_arena() const noexcept { return false; }

  /// @return true when staging slots should be page-locked with `pin()` before use: `cuda`
  ///         (an async H2D copy from pageable memory is staged by the driver, CUDA
  ///         Programming Guide, "Page-Locked Host Memory"). False for `host`.
  [[nodiscard]] virtual bool wants_pinned_staging() const noexcept { return false; }
  /**
   * @brief Page-locks @p bytes of host memory at @p host (page-aligned) for this device.
   * @throws Error `unavailable` when the driver refuses (e.g. `ulimit -l`, out of pinnable
   *         memory); the caller may retry with less or stage from pageable memory.
   * @note Pair every successful `pin` with `unpin(host)` once no copy reads the memory.
   */
  virtual void pin(std::byte* host, std::uint64_t bytes) {
    static_cast<void>(host);
    static_cast<void>(bytes);
  }
  /// Undoes `pin(host, ...)`. Never throws (logs a failure).
  virtual void unpin(std::byte* host) noexcept { static_cast<void>(host); }
  /**
   * @return the CUDA event (a `cudaEvent_t`) recorded on the copy stream after the most
   *         recent upload, or null when uploads complete synchronously (`host`).
   * @note CUDA stream order: a stream that `cudaStreamWaitEvent`s on it runs after every
   *       upload issued so far, the last one included. The event is re-recorded by the next
   *       upload, so use it right away, on the thread that issues the uploads.
   * @note For embedders that chain `upload` and `Transport::broadcast_group` themselves.
   *       `load` does not use it: its upload stage polls each chunk's own copies and hands a
   *       chunk to the broadcast only once they completed, since the latest event would also
   *       wait for the next chunk's copies.
   */
  [[nodiscard]] virtual void* upload_event() const noexcept { return nullptr; }

  /**
   * @brief Orders this device's later uploads after the work queued so far on the caller's
   *        @p stream (on this device; the legacy default stream included): the copy stream
   *        waits on an event recorded on it (`cudaStreamWaitEvent`, no host wait). Nothing
   *        when @p stream is none; `host`: nothing to order.
   * @throws Error as `detail::throw_cuda_error` when the event cannot be recorded or waited.
   */
  virtual void order_after(const CallerStream& stream) { static_cast<void>(stream); }
  /**
   * @brief Makes the caller's @p stream wait for every upload issued so far (an event
   *        recorded on the copy stream after them). Nothing when @p stream is none; `host`:
   *        nothing to order.
   * @throws Error as `order_after`.
   */
  virtual void order_before(const CallerStream& stream) { static_cast<void>(stream); }

  /**
   * @brief Hands @p bytes of this device's memory at @p data (an arena's, or a caller's
   *        in-place destination on this device) to @p consume, in order, in one or more calls,
   *        as `Arena::read_back` does: for digests of what landed, not the load path.
   *
   * `host` makes one call pointing at @p data; `cuda` copies through two pinned bounce halves
   * of up to 4 MiB, kept by the device from the first call. The caller must have waited for
   * every copy and transfer into the range.
   * @throws Error as `Arena::read_back` does for a CUDA copy that fails.
   */
  virtual void read_back(const std::byte* data, std::uint64_t bytes,
                         const std::function<void(const std::byte*, std::size_t)>& consume) const {
    if (bytes != 0) consume(data, bytes);
  }
};

/// @return the host device: `memcpy` uploads into a host arena.
std::unique_ptr<Device> make_host_device();

/// @return the number of CUDA devices this process can use; 0 when the build has no CUDA
///         or `cudaGetDeviceCount` fails (no driver, no device, `CUDA_VISIBLE_DEVICES=`).
int cuda_device_count() noexcept;

/**
 * @brief The CUDA device @p ordinal: `cudaMalloc` arenas, pinned staging, H2D copies on a
 *        non-blocking copy stream.
 * @param ordinal the CUDA device (after `CUDA_VISIBLE_DEVICES`); `make_device` picks it from
 *        the local rank with `cuda_ordinal_for_local_rank` (gpu_info.hpp).
 * @throws Error `unavailable` (69) when the build has no CUDA ("this build has no CUDA"),
 *         when there is no such device, or when the CUDA runtime cannot start (names the
 *         CUDA error); `internal` (70) when creating the copy stream or event fails otherwise
 *         (`detail::throw_cuda_error`).
 * @note Creates its stream on construction and releases it in the destructor; do not keep
 *       a device in a static (CUDA resources must not be released from static destructors).
 */
std::unique_ptr<Device> make_cuda_device(int ordinal);

/**
 * @brief The device the config's `device` key asks for.
 *
 * `host` → host; `cuda` → `make_cuda_device(cuda_ordinal_for_local_rank(local_rank, N))` for
 * the N visible devices (the only one when N is 1, else the local rank's: gpu_info.hpp);
 * `auto` → cuda when the build has CUDA and `cudaGetDeviceCount` > 0, else host with a
 * notice on the log saying why.
 * @param local_rank this process's rank on its node (`World::local_rank`).
 * @throws Error as `make_cuda_device` and `cuda_ordinal_for_local_rank` do: for `cuda`, and
 *         for `auto` once a CUDA device was found (e.g. `local_rank` 2 on a node with 2
 *         visible GPUs: 69, "local rank 2 but this process sees 2 CUDA devices").
 */
std::unique_ptr<Device> make_device(DeviceKind kind, int local_rank);

}  // namespace weightcast
