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
 * say what landed in GPU memory, in the same format as the host path.
 * @throws Error as `Arena::read_back` does when a copy back fails.
 * @note Call it after the load has returned: every upload and broadcast has completed.
 */
std::vector<std::uint64_t> tensor_digests(const LoadResult& result);

}  // namespace weightcast
