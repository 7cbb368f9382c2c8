/**
 * @file plural.hpp
 * @brief Internal: a count with its noun in agreement, for messages ("1 tensor", "2 ranks").
 */
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace weightcast::detail {

/// @return "@p n @p singular" when @p n is 1, else "@p n @p plural" (@p plural empty:
///         @p singular + "s"): `counted(1, "tensor")` is "1 tensor", `counted(0, "tensor")`
///         "0 tensors", `counted(2, "entry", "entries")` "2 entries".
inline std::string counted(std::uint64_t n, std::string_view singular,
                           std::string_view plural = {}) {
  if (n == 1) return fmt::format("1 {}", singular);
  if (plural.empty()) return fmt::format("{} {}s", n, singular);
  return fmt::format("{} {}", n, plural);
}

}  // namespace weightcast::detail
