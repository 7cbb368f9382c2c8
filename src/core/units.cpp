#include "weightcast/core/units.hpp"

#include <fmt/core.h>

#include <array>
#include <cmath>
#include <string_view>

namespace weightcast {

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 7> units{"B",   "KiB", "MiB", "GiB",
                                                         "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  std::size_t unit = 0;
  std::uint64_t scaled = bytes;
  while (scaled >= 1024 && unit + 1 < units.size()) {
    scaled >>= 10;
    ++unit;
  }
  std::uint64_t divisor = 1ull << (10 * unit);
  if (bytes % divisor == 0) return fmt::format("{} {}", bytes / divisor, units[unit]);
  double value = static_cast<double>(bytes) / static_cast<double>(divisor);
  // 1023.999 MiB would print as "1024.00 MiB"; say "1.00 GiB" instead.
  if (std::round(value * 100.0) >= 1024.0 * 100.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, units[unit]);
}

}  // namespace weightcast
