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

#include "weightcast/checkpoint/checkpoint.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace weightcast {

/// Version of the catalogue encoding; a peer with another version is refused.
inline constexpr std::uint32_t catalogue_wire_version = 2;

/// @return @p catalogue encoded, each shard with its path, device, inode and times (so that
///         a rank reading locally opens the very file rank 0 described). Its size has no fixed
///         limit: it is bounded by the checkpoint's headers (each at most 100,000,000 bytes,
///         the format's limit), at most 4 bytes per header byte (a shape dimension: 2 bytes of
///         JSON, 8 here) plus the fixed fields, the name and the path per shard; a 96.6 MB header encodes to 77.6 MB.
///         The control plane carries it in pieces (ControlPlane::share).
/// @throws Error `internal` (70) when a count (shards, tensors, dimensions, metadata keys) is
///         over 2^32 − 1, which its u32 field cannot hold.
std::string encode_catalogue(const Catalogue& catalogue);

/**
 * @brief Decodes what `encode_catalogue` wrote, shard paths as rank 0 spelled them.
 * @param what names the sender in messages, e.g. "catalogue from rank 0".
 * @throws Error `unavailable` (69) naming the field when the bytes are truncated (every
 *         count is checked against the bytes left before anything is allocated), have
 *         trailing garbage, another magic or version, or describe an inconsistent catalogue
 *         (unknown dtype, shape × dtype ≠ bytes, a shard out of order or range, a data
 *         offset below 8 or past the file, a hole or overlap in a shard's data section).
 */
Catalogue decode_catalogue(std::string_view bytes, std::string_view what);

}  // namespace weightcast
