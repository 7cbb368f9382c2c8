// Reading the values the config writes (sizes, durations, whole numbers) and quoting a value
// or key in a message.
#include "weightcast/config/detail/config_parts.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <limits>

namespace weightcast {

namespace detail {

/// A bad value: the reason, without the location (the loader adds it).
[[noreturn]] void bad_value(std::string reason) {
  throw Error(Errc::config, std::move(reason));
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

namespace {

// Longest text a message echoes whole: a 5000-digit value would otherwise fill the screen.
constexpr std::size_t max_shown_bytes = 64;

/// @p text with its control bytes (C0 and DEL) as `\xHH`, so a message stays one line.
std::string escape_controls(std::string_view text) {
  std::string out;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

/// Where @p text is cut for a message: its first `max_shown_bytes`, backed off to the start
/// of a UTF-8 character; the whole of it when short enough.
std::string_view message_head(std::string_view text) {
  if (text.size() <= max_shown_bytes) return text;
  std::size_t cut = max_shown_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return text.substr(0, cut);
}

}  // namespace

// The one place a message shows a value or key taken from the user: control bytes escaped,
// and past 64 bytes cut with "…" and the length ("'1234…' (5000 bytes)").
/// @return @p text as a message shows it, unquoted (`--set key=value` prefixes).
std::string shown(std::string_view text) {
  const std::string_view head = message_head(text);
  if (head.size() == text.size()) return escape_controls(text);
  return fmt::format("{}… ({} bytes)", escape_controls(head), text.size());
}

/// @return @p text as a message quotes it: `'16 parsecs'`, `'1234…' (5000 bytes)`.
std::string quote_value(std::string_view text) {
  const std::string_view head = message_head(text);
  if (head.size() == text.size()) return fmt::format("'{}'", escape_controls(text));
  return fmt::format("'{}…' ({} bytes)", escape_controls(head), text.size());
}

namespace {

/// Splits "16.5 MiB" into the number (16.5) and the unit text ("MiB"). The number is a plain
/// decimal: digits with at most one '.', no exponent, no hex, so that "1e9" is refused rather
/// than silently read some other way. A leading '-' is kept apart: a negative number is a
/// number, out of every key's range, not "not a number".
struct NumberAndUnit {
  bool negative = false;    // "-5s"
  std::string_view digits;  // "16.5"
  std::string_view unit;    // "MiB", may be empty
};

std::optional<NumberAndUnit> split_number(std::string_view text) {
  text = trim(text);
  NumberAndUnit out;
  if (!text.empty() && text.front() == '-') {
    out.negative = true;
    text.remove_prefix(1);
  }
  std::size_t i = 0;
  bool seen_digit = false;
  bool has_point = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      seen_digit = true;
    } else if (c == '_' && seen_digit) {
      // YAML 1.1 allows 1_000_000; accept it for plain counts.
    } else if (c == '.' && !has_point) {
      has_point = true;
    } else {
      break;
    }
  }
  if (!seen_digit) return std::nullopt;
  out.digits = text.substr(0, i);
  out.unit = trim(text.substr(i));
  return out;
}

/// The digits of `split_number` times @p multiplier, exactly, whatever their number: nullopt
/// past 2^64 - 1. @p exact says whether the product is a whole number of units; the result
/// is then its whole part (callers refuse a fraction rather than round it).
std::optional<std::uint64_t> scale(std::string_view digits, std::uint64_t multiplier,
                                   bool& exact) {
  std::string clean;
  for (char c : digits) {
    if (c != '_') clean += c;
  }
  std::string_view number(clean);
  const auto point = number.find('.');
  const std::string_view int_part = number.substr(0, point);
  std::string_view frac_part =
      point == std::string_view::npos ? std::string_view() : number.substr(point + 1);
  while (!frac_part.empty() && frac_part.back() == '0') frac_part.remove_suffix(1);

  constexpr auto max = std::numeric_limits<std::uint64_t>::max();
  unsigned __int128 result = 0;
  for (char c : int_part) {
    result = result * 10 + static_cast<unsigned>(c - '0');
    if (result > max) return std::nullopt;
  }
  result *= multiplier;
  if (result > max) return std::nullopt;
  // multiplier × 0.d1…dk by long multiplication from the last digit: the k digits it leaves
  // behind are the product's fraction (all zero when exact), the carry its whole part. Each
  // carry is below multiplier, so nothing overflows however many digits there are.
  unsigned __int128 carry = 0;
  exact = true;
  for (auto it = frac_part.rbegin(); it != frac_part.rend(); ++it) {
    const unsigned __int128 v =
        static_cast<unsigned __int128>(static_cast<unsigned>(*it - '0')) * multiplier + carry;
    if (v % 10 != 0) exact = false;
    carry = v / 10;
  }
  result += carry;
  if (result > max) return std::nullopt;
  return static_cast<std::uint64_t>(result);
}

/// A number written with an exponent ("1.6777216e+07", "1e9": Helm's toYaml writes large
/// numbers so), which no key reads. `value` is its value when that is a whole number from 0 to
/// 2^64 - 1, for a message suggesting the plain spelling; nullopt otherwise.
struct ExponentForm {
  std::optional<std::uint64_t> value;
};

std::optional<ExponentForm> exponent_form(std::string_view text) {
  text = trim(text);
  bool negative = false;
  if (!text.empty() && (text.front() == '-' || text.front() == '+')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  const auto e = text.find_first_of("eE");
  if (e == std::string_view::npos) return std::nullopt;
  std::string_view mantissa = text.substr(0, e);
  std::string_view exponent = text.substr(e + 1);
  const auto point = mantissa.find('.');
  std::string digits;  // the mantissa's digits, less the point and '_'
  std::size_t frac_digits = 0;
  for (std::size_t i = 0; i < mantissa.size(); ++i) {
    const char c = mantissa[i];
    if (c >= '0' && c <= '9') {
      digits += c;
      if (point != std::string_view::npos && i > point) ++frac_digits;
    } else if (c != '_' && i != point) {
      return std::nullopt;
    }
  }
  bool exponent_negative = false;
  if (!exponent.empty() && (exponent.front() == '-' || exponent.front() == '+')) {
    exponent_negative = exponent.front() == '-';
    exponent.remove_prefix(1);
  }
  if (digits.empty() || exponent.empty() || exponent.size() > 4 ||
      !std::all_of(exponent.begin(), exponent.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  ExponentForm out;
  if (negative) return out;
  int power = std::stoi(std::string(exponent)) * (exponent_negative ? -1 : 1) -
              static_cast<int>(frac_digits);
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  if (digits.empty()) {
    out.value = 0;
    return out;
  }
  while (power < 0 && digits.back() == '0') {
    digits.pop_back();
    ++power;
  }
  if (power < 0 || digits.size() + static_cast<std::size_t>(power) > 20) return out;
  unsigned __int128 value = 0;
  for (char c : digits) value = value * 10 + static_cast<unsigned>(c - '0');
  for (int i = 0; i < power; ++i) value *= 10;
  if (value <= std::numeric_limits<std::uint64_t>::max()) {
    out.value = static_cast<std::uint64_t>(value);
  }
  return out;
}

/// A unit whose spelling differs from a table entry's only in case ("mb", "gib", "S"): the
/// entry, for a message suggesting it; nullptr when none does.
template <typename Unit, std::size_t N>
const Unit* unit_in_other_case(std::string_view unit, const std::array<Unit, N>& units) {
  const std::string lower = lowercase(unit);
  for (const auto& u : units) {
    if (!u.name.empty() && lowercase(u.name) == lower) return &u;
  }
  return nullptr;
}

constexpr std::string_view size_hint = "use bytes or a unit: 16MiB, 1GiB";


/// The parenthesis after "is not a size": for an exponent ("1.6777216e+07"), the plain
/// spelling of its value when that is a whole number of bytes.
std::string size_hint_for(std::string_view text) {
  const auto exponent = exponent_form(text);
  if (!exponent) return std::string(size_hint);
  if (!exponent->value) return fmt::format("an exponent is not a size: {}", size_hint);
  const std::string bytes = fmt::format("{}", *exponent->value);
  const std::string unit = print_size(*exponent->value);
  return unit == bytes ? fmt::format("an exponent is not a size: write {}", bytes)
                       : fmt::format("an exponent is not a size: write {} or {}", bytes, unit);
}

}  // namespace

/// A size's bytes, or nullopt when it is negative or past 2^64 - 1 bytes: out of range for
/// every key, which says its own range. Throws (without the location, which the loader adds)
/// for what is not a size: no number, an unknown unit, a fraction of a byte.
std::optional<std::uint64_t> size_bytes(std::string_view text) {
  auto parts = split_number(text);
  if (!parts) bad_value(fmt::format("{} is not a size ({})", quote_value(text), size_hint));

  // Binary units are what buffers are sized in; decimal units are what disks are sold in.
  // Both are accepted spelled out, as written here: units are case-sensitive, since "mb" is
  // millibits to some and "16mb" could be meant as MB or as MiB. A bare K/M/G/T is refused
  // because half the tools that accept it mean 1000 and the other half 1024.
  struct Unit {
    std::string_view name;
    std::uint64_t bytes;
  };
  static constexpr std::array<Unit, 10> units{{
      {"", 1}, {"B", 1},
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30}, {"TiB", 1ull << 40},
      {"KB", 1'000}, {"MB", 1'000'000}, {"GB", 1'000'000'000}, {"TB", 1'000'000'000'000},
  }};
  const Unit* found = nullptr;
  for (const auto& u : units) {
    if (u.name == parts->unit) found = &u;
  }
  if (found == nullptr) {
    const std::string unit = lowercase(parts->unit);
    if (unit == "k" || unit == "m" || unit == "g" || unit == "t") {
      char u = static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0])));
      bad_value(fmt::format("{} is ambiguous: write {}{}iB (binary) or {}{}B (decimal)",
                            quote_value(text), parts->digits, u, parts->digits, u));
    }
    if (const Unit* other = unit_in_other_case(parts->unit, units)) {
      const bool decimal = other->name.size() == 2;  // KB, MB, GB, TB
      bad_value(fmt::format(
          "{} is not a size: units are case-sensitive (write {}{}{})", quote_value(text),
          parts->digits, other->name,
          decimal ? fmt::format(" for decimal, or {}{}iB for binary", parts->digits,
                                other->name.front())
                  : std::string()));
    }
    bad_value(fmt::format("{} is not a size ({})", quote_value(text), size_hint_for(text)));
  }
  if (parts->negative) return std::nullopt;
  bool exact = true;
  auto bytes = scale(parts->digits, found->bytes, exact);
  if (!bytes) return std::nullopt;
  // "1.5GiB" is exact; "0.1KiB" (102.4 bytes) would be silently rounded, so it is refused.
  if (!exact) bad_value(fmt::format("{} is not a whole number of bytes", quote_value(text)));
  return *bytes;
}

namespace {

/// Size parsing without the key prefix and with no range but the type's.
std::uint64_t parse_size_value(std::string_view text) {
  auto bytes = size_bytes(text);
  if (!bytes) {
    bad_value(fmt::format("{} is out of range (a size is 0 to {} bytes)", quote_value(text),
                          std::numeric_limits<std::uint64_t>::max()));
  }
  return *bytes;
}

constexpr std::string_view duration_hint = "use seconds or a unit: 300s, 5m, 250ms, 1h";

/// As `size_hint_for`, for a duration: a plain number is seconds.
std::string duration_hint_for(std::string_view text) {
  const auto exponent = exponent_form(text);
  if (!exponent) return std::string(duration_hint);
  constexpr std::uint64_t max_seconds =
      static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / 1000;
  if (!exponent->value || *exponent->value > max_seconds) {
    return fmt::format("an exponent is not a duration: {}", duration_hint);
  }
  const auto seconds = static_cast<std::int64_t>(*exponent->value);
  return fmt::format("an exponent is not a duration: write {}",
                     print_duration(std::chrono::milliseconds(seconds * 1000)));
}

}  // namespace

/// A duration, or nullopt when it is negative or past 2^63 - 1 ms: out of range for every
/// key. Throws for what is not a duration: no number, an unknown unit (units are
/// case-sensitive, as for sizes), or not a whole number of milliseconds ("0.5ms", "1500us"
/// would otherwise be rounded).
std::optional<std::chrono::milliseconds> duration_ms(std::string_view text) {
  auto parts = split_number(text);
  if (!parts) bad_value(fmt::format("{} is not a duration ({})", quote_value(text), duration_hint));
  struct Unit {
    std::string_view name;
    std::uint64_t ms;
  };
  static constexpr std::array<Unit, 10> units{{
      {"", 1000}, {"ms", 1}, {"s", 1000}, {"sec", 1000}, {"m", 60'000}, {"min", 60'000},
      {"h", 3'600'000}, {"hr", 3'600'000}, {"d", 86'400'000}, {"day", 86'400'000},
  }};
  const Unit* found = nullptr;
  for (const auto& u : units) {
    if (u.name == parts->unit) found = &u;
  }
  if (found == nullptr) {
    if (const Unit* other = unit_in_other_case(parts->unit, units)) {
      bad_value(fmt::format("{} is not a duration: units are case-sensitive (write {}{})",
                            quote_value(text), parts->digits, other->name));
    }
    bad_value(fmt::format("{} is not a duration ({})", quote_value(text), duration_hint_for(text)));
  }
  if (parts->negative) return std::nullopt;
  bool exact = true;
  auto ms = scale(parts->digits, found->ms, exact);
  if (!ms || *ms > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return std::nullopt;
  }
  if (!exact) bad_value(fmt::format("{} is not a whole number of milliseconds", quote_value(text)));
  return std::chrono::milliseconds(static_cast<std::int64_t>(*ms));
}

namespace {

/// Duration parsing without the key prefix and with no range but the type's.
std::chrono::milliseconds parse_duration_value(std::string_view text) {
  auto ms = duration_ms(text);
  if (!ms) {
    bad_value(fmt::format("{} is out of range (a duration is 0 to {} ms)", quote_value(text),
                          std::numeric_limits<std::int64_t>::max()));
  }
  return *ms;
}

}  // namespace

std::uint64_t parse_integer_value(std::string_view text, std::string_view what) {
  std::string_view t = trim(text);
  std::string clean;
  for (char c : t) {
    if (c != '_') clean += c;
  }
  std::uint64_t value = 0;
  auto [p, ec] = std::from_chars(clean.data(), clean.data() + clean.size(), value);
  bool digits_only = !clean.empty() && std::all_of(clean.begin(), clean.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  if (!digits_only || ec != std::errc() || p != clean.data() + clean.size()) {
    if (const auto exponent = exponent_form(text); exponent && exponent->value) {
      bad_value(fmt::format("{} is not a whole number ({}; an exponent is not a whole number: "
                            "write {})",
                            quote_value(text), what, *exponent->value));
    }
    bad_value(fmt::format("{} is not a whole number ({})", quote_value(text), what));
  }
  return value;
}

}  // namespace detail

using detail::parse_duration_value;
using detail::parse_size_value;

std::uint64_t parse_size(std::string_view text, std::string_view key) {
  try {
    return parse_size_value(text);
  } catch (const Error& e) {
    throw Error(Errc::config, fmt::format("{}: {}", key, e.what()));
  }
}

std::chrono::milliseconds parse_duration(std::string_view text, std::string_view key) {
  try {
    return parse_duration_value(text);
  } catch (const Error& e) {
    throw Error(Errc::config, fmt::format("{}: {}", key, e.what()));
  }
}

}  // namespace weightcast
