// The settings registry's spellings and range messages, which every surface (YAML, --set,
// LoadOptions, Python keywords) shares.
#include "weightcast/core/settings.hpp"

#include "weightcast/core/units.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <initializer_list>

namespace weightcast {

namespace {

/// A bound of a duration for people: "7 days", "1ms".
std::string describe_duration(std::int64_t ms) {
  constexpr std::int64_t day = 86'400'000;
  if (ms != 0 && ms % day == 0) return fmt::format("{} day{}", ms / day, ms == day ? "" : "s");
  return print_duration(std::chrono::milliseconds(ms));
}

}  // namespace

std::span<const Setting> settings() noexcept { return setting::registry; }

const Setting* find_setting(std::string_view name) noexcept {
  for (const Setting& s : setting::registry) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

int choice_value(const Setting& setting, std::string_view text) noexcept {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  for (const Spelling& s : setting.spellings) {
    if (s.name.size() == text.size() &&
        std::equal(s.name.begin(), s.name.end(), text.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      return s.value;
    }
  }
  return -1;
}

std::optional<DeviceKind> device_kind(std::string_view text) noexcept {
  // As spelt, unlike a config's value: torch's device strings are lower case and exact.
  for (const auto names : {std::span<const Spelling>(setting::device_spellings),
                           std::span<const Spelling>(setting::device_aliases)}) {
    for (const Spelling& s : names) {
      if (s.name == text && s.value != static_cast<int>(DeviceKind::automatic)) {
        return static_cast<DeviceKind>(s.value);
      }
    }
  }
  return std::nullopt;
}

std::string_view choice_name(const Setting& setting, int value) noexcept {
  for (const Spelling& s : setting.spellings) {
    if (s.value == value) return s.name;
  }
  return {};
}

std::string spell(const Setting& setting, std::int64_t value) {
  switch (setting.type) {
    case SettingType::size:
      return value < 0 ? fmt::format("{}", value) : print_size(static_cast<std::uint64_t>(value));
    case SettingType::duration: return print_duration(std::chrono::milliseconds(value));
    case SettingType::auto_count:
      if (value == setting.default_value) return "auto";
      return fmt::format("{}", value);
    case SettingType::choice: return std::string(choice_name(setting, static_cast<int>(value)));
    case SettingType::count:
    case SettingType::text:
    case SettingType::address:
    case SettingType::rules: break;
  }
  return fmt::format("{}", value);
}

std::string default_text(const Setting& setting) {
  switch (setting.type) {
    case SettingType::text: return "";
    case SettingType::address: return "auto";
    case SettingType::rules: return "[]";
    default: return spell(setting, setting.default_value);
  }
}

std::string bound_text(const Setting& setting, std::int64_t value) {
  switch (setting.type) {
    case SettingType::size:
      return value < 0 ? fmt::format("{}", value) : print_size(static_cast<std::uint64_t>(value));
    case SettingType::duration: return describe_duration(value);
    default: return fmt::format("{}", value);
  }
}

std::string out_of_range(const Setting& setting, std::string_view shown) {
  switch (setting.type) {
    case SettingType::size:
      if (setting.min == 1) {
        return fmt::format("{} is out of range (must be more than 0 and at most {})", shown,
                           print_size(static_cast<std::uint64_t>(setting.max)));
      }
      return fmt::format("{} is out of range (must be {} to {})", shown,
                         print_size(static_cast<std::uint64_t>(setting.min)),
                         print_size(static_cast<std::uint64_t>(setting.max)));
    case SettingType::duration:
      return fmt::format("{} is out of range (must be at least {} and at most {})", shown,
                         describe_duration(setting.min), describe_duration(setting.max));
    default:
      return fmt::format("{} is out of range (must be {} to {}: {})", shown, setting.min,
                         setting.max, setting.what);
  }
}

std::string not_a_choice(const Setting& setting, std::string_view shown) {
  return fmt::format("{} is not one of {}", shown, setting.what);
}

std::string_view to_string(DeviceKind kind) noexcept {
  return choice_name(setting::device, static_cast<int>(kind));
}
std::string_view to_string(TransportKind kind) noexcept {
  return choice_name(setting::transport, static_cast<int>(kind));
}
std::string_view to_string(DirectIo mode) noexcept {
  return choice_name(setting::direct_io, static_cast<int>(mode));
}
std::string_view to_string(ReaderKind kind) noexcept {
  return choice_name(setting::reader, static_cast<int>(kind));
}
std::string_view to_string(Destination destination) noexcept {
  return choice_name(setting::destination, static_cast<int>(destination));
}
std::string_view to_string(Verify verify) noexcept {
  return choice_name(setting::verify, static_cast<int>(verify));
}
std::string_view to_string(LogLevel level) noexcept {
  return choice_name(setting::log_level, static_cast<int>(level));
}

}  // namespace weightcast
