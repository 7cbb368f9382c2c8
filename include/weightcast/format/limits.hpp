/**
 * @file limits.hpp
 * @brief The safetensors format's own limits, for every layer that reads or recognises a
 *        shard (the header parser, and the config loader telling a checkpoint from YAML).
 */
#pragma once

#include <cstdint>

namespace weightcast {

/// Largest header the format allows, bytes (the safetensors crate's `MAX_HEADER_SIZE`).
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

}  // namespace weightcast
