#include "weightcast/core/units.hpp"

#include <fmt/core.h>

#include <array>
#include <cmath>
#include <string_view>
#include <utility>

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

std::string print_size(std::uint64_t bytes) {
  static constexpr std::array<std::pair<std::string_view, int>, 4> units{
      {{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}};
  for (const auto& [name, shift] : units) {
    const std::uint64_t unit = 1ull << shift;
    if (bytes != 0 && bytes % unit == 0) return fmt::format("{}{}", bytes / unit, name);
  }
  return fmt::format("{}", bytes);
}

std::string print_duration(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  if (ms != 0 && ms % 3'600'000 == 0) return fmt::format("{}h", ms / 3'600'000);
  if (ms % 1000 == 0) return fmt::format("{}s", ms / 1000);
  return fmt::format("{}ms", ms);
}

}  // namespace weightcast
