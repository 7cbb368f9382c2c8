/**
 * @file digest.hpp
 * @brief Per-tensor digests: XXH3-64 of the bytes that landed, for reports and verification.
 *
 * XXH3-64 with seed 0 (xxHash 0.8), the digest `../shared/corpus/real/MANIFEST.json` lists
 * as `xxh3`, printed as 16 lowercase hex digits.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace weightcast {

struct LoadResult;

/// @return XXH3-64 (seed 0) of @p bytes bytes at @p data (host memory).
std::uint64_t xxh3_64(const void* data, std::size_t bytes) noexcept;

/// @return @p digest as 16 lowercase hex digits, e.g. "00dbaed781317522".
std::string digest_hex(std::uint64_t digest);

/**
 * @brief XXH3-64 of every tensor of @p result, in catalogue order.
 *
 * Host arenas are hashed in place. Device (cuda) arenas are copied back a chunk at a time
 * through a small pinned buffer (`Arena::read_back`) and hashed on the host, so the digests
 * say what landed in GPU memory, in the same format as the host path. After a load with
 * `destination: discard` (no arena), returns `LoadResult::digests`, taken as the bytes
 * streamed past (empty when `LoadOptions::digest_discarded` was false).
 * @throws Error as `Arena::read_back` does when a copy back fails; `internal` (70) when the
 *         hashing state cannot be allocated.
 * @note Call it after the load has returned: every upload and broadcast has completed.
 */
std::vector<std::uint64_t> tensor_digests(const LoadResult& result);

/**
 * @brief XXH3-64 digests computed as tensor bytes stream past, without keeping them.
 *
 * Feed each tensor's pieces in order (the plan delivers them in order); `finish` closes a
 * tensor. The digest equals `xxh3_64` of the whole tensor. At most a few tensors are open at
 * a time (chunks follow file order), so the hashing state stays small whatever the model.
 * Used by `destination: discard`; reusable wherever digests are wanted while loading.
 */
class StreamingDigests {
 public:
  /// @param tensors number of tensors (catalogue order); each digest starts as that of no bytes.
  explicit StreamingDigests(std::size_t tensors);
  ~StreamingDigests();
  StreamingDigests(StreamingDigests&&) noexcept;
  StreamingDigests& operator=(StreamingDigests&&) noexcept;
  StreamingDigests(const StreamingDigests&) = delete;
  StreamingDigests& operator=(const StreamingDigests&) = delete;

  /// Hashes the next @p bytes bytes of @p tensor (below the count given to the constructor;
  /// `std::out_of_range` otherwise, a caller's bug) at @p data (host memory).
  /// @throws Error `internal` (70) when the hashing state cannot be allocated.
  void update(std::uint32_t tensor, const void* data, std::size_t bytes);
  /// Ends @p tensor: its digest is final and its state freed. A tensor that was never
  /// updated keeps the digest of no bytes; finishing one twice changes nothing.
  void finish(std::uint32_t tensor);
  /// @return every tensor's digest, catalogue order (finished tensors only are meaningful).
  [[nodiscard]] const std::vector<std::uint64_t>& digests() const noexcept { return _digests; }

 private:
  struct State;
  std::vector<std::uint64_t> _digests;
  // Per tensor, non-null while it has bytes and is not finished.
  std::vector<std::unique_ptr<State>> _open;
};

}  // namespace weightcast
