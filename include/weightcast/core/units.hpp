/**
 * @file units.hpp
 * @brief Sizes for people: what messages and reports print for a byte count.
 */
#pragma once

#include <cstdint>
#include <string>

namespace weightcast {

/// @return "16 MiB", "1.50 GiB", "512 B": a size for people (binary units).
std::string format_bytes(std::uint64_t bytes);

}  // namespace weightcast
