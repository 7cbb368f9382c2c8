/**
 * @file catalogue_wire.hpp
 * @brief The catalogue as the control plane carries it from rank 0 to the other ranks.
 *
 * A compact versioned little-endian binary (docs/DESIGN.md § Checkpoints):
 * magic "WCAT", version 1, the shards (name, file size, data offset — never the path: other
 * ranks never open a file), the tensors (name, dtype, shape, shard, file offset, bytes) and
 * the merged `__metadata__`. Strings are a u32 byte count and bytes.
 *
 * The decoder never trusts the peer: every count is checked against the bytes left before
 * anything is allocated, and the result must satisfy what the plan relies on (dtype known,
 * shape × dtype = bytes, each shard's tensors tile its data section exactly, in order).
 */
#pragma once

#include "weightcast/checkpoint.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace weightcast {

/// Version of the catalogue encoding; a peer with another version is refused.
inline constexpr std::uint32_t catalogue_wire_version = 1;

/// Largest encoded catalogue either side accepts, bytes (a 70B index is well under 1 MiB).
inline constexpr std::uint64_t max_catalogue_wire_bytes = 64ull << 20;

/// @return @p catalogue encoded (shard paths left out).
/// @throws Error `internal` (70) when the encoding would exceed `max_catalogue_wire_bytes`.
std::string encode_catalogue(const Catalogue& catalogue);

/**
 * @brief Decodes what `encode_catalogue` wrote. Shard paths are empty.
 * @param what names the sender in messages, e.g. "catalogue from rank 0".
 * @throws Error `unavailable` (69) naming the field when the bytes are over
 *         `max_catalogue_wire_bytes`, truncated, have trailing garbage, another magic or
 *         version, or describe an inconsistent catalogue (unknown dtype, more than 64
 *         dimensions, shape × dtype ≠ bytes, a shard out of order or range, a data offset
 *         below 8 or past the file, a hole or overlap in a shard's data section).
 */
Catalogue decode_catalogue(std::string_view bytes, std::string_view what);

}  // namespace weightcast
