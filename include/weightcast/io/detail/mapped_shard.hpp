/**
 * @file mapped_shard.hpp
 * @brief A read-only mapping of a shard that is already in the page cache: rank 0 sends the
 *        cache's own pages instead of copying them into the staging ring first.
 *
 * Internal (no Asio). In a placed load over MPI on one node, the receivers copy their slices
 * out of rank 0's memory themselves (Open MPI's single-copy CMA path), so a chunk read into a
 * staging slot costs rank 0 a copy of every byte only to have it copied again. Where a shard's
 * pages are resident, the mapping is that slot: rank 0 copies only its own local shards, the
 * receivers copy theirs in parallel, and host RAM still holds a bounded window: each chunk's
 * pages are unmapped from rank 0 (`release`, MADV_DONTNEED: they stay in the page cache) as
 * soon as its sends complete.
 *
 * A mapped file that shrinks under the mapping raises SIGBUS on the next read past its new end
 * (mmap(2)). That must not end the process: a process-wide SIGBUS handler, installed with the
 * first mapping, puts a zero page over the faulting page of a registered mapping, counts it,
 * and lets the read go on; `truncated()` then says so and the loader fails the load with `io`
 * (74) naming the shard, as it does for a shard that changed under a read. A SIGBUS at any
 * other address goes to the handler that was installed before ours, or takes the default
 * action.
 */
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace weightcast::detail {

/// A whole shard file mapped read-only and shared (its page-cache pages).
class MappedShard {
 public:
  /**
   * @brief Maps the first @p bytes of @p fd read-only (MAP_SHARED); nothing is faulted in.
   * @param name the shard's name, for the messages below.
   * @throws Error `io` (74) naming @p name when mmap(2) fails; `unavailable` (69) when 1024
   *         mappings are registered already (the SIGBUS table's size). The loader reads a
   *         shard it cannot map instead.
   */
  MappedShard(int fd, std::uint64_t bytes, const std::string& name);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  /// @return the file's first byte in this process.
  [[nodiscard]] const std::byte* data() const noexcept { return _data; }
  [[nodiscard]] std::uint64_t size() const noexcept { return _bytes; }

  /// Drops this process's mapping of the pages inside [@p offset, @p offset + @p bytes)
  /// (MADV_DONTNEED): rank 0's RSS falls back; the page cache keeps them, and a later read
  /// of a page dropped this way maps it again. Pages the range shares with a neighbour are
  /// dropped too (a neighbour still in flight re-faults them: correct, and rare).
  void release(std::uint64_t offset, std::uint64_t bytes) noexcept;

  /// @return the pages of this mapping a SIGBUS replaced with zeros: the file shrank while
  ///         mapped, or the kernel could not read a page (an I/O error). Nonzero means bytes
  ///         read from the mapping may be wrong.
  [[nodiscard]] std::uint64_t truncated() const noexcept {
    return _zeroed.load(std::memory_order_acquire);
  }

 private:
  const std::byte* _data = nullptr;
  std::uint64_t _bytes = 0;
  std::atomic<std::uint64_t> _zeroed{0};
  int _slot = -1;  // the SIGBUS table's entry
};

}  // namespace weightcast::detail
