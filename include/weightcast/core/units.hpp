/**
 * @file units.hpp
 * @brief Sizes for people (what messages and reports print for a byte count), and the
 *        config's exact spellings of a size and a duration.
 */
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace weightcast {

/// @return "16 MiB", "1.50 GiB", "512 B": a size for people (binary units).
std::string format_bytes(std::uint64_t bytes);

/// @return the shortest exact config spelling of a size: "16MiB", "1GiB", "1000" (bytes).
std::string print_size(std::uint64_t bytes);

/// @return the exact config spelling of a duration: "1h", "300s", "250ms".
std::string print_duration(std::chrono::milliseconds duration);

}  // namespace weightcast
