// Config loading: built-in defaults, then a YAML file, then `--set key=value` overrides.
//
// Every key lives in one table (`key_table()` below) of {name, parser, printer}: adding a key
// is adding one entry there plus its field in `Config`. The loader never interprets a key
// itself; it only finds the entry, hands it the scalar's text and, on failure, prefixes the
// message with where the value came from (`file:line: key: ` or `--set key=value: `).
#include "weightcast/config/config.hpp"

#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/checkpoint/safetensors.hpp"

#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace weightcast {

namespace {

// The largest chunk: the staging ring allocates chunk_size bytes per slot and io_uring reads
// are limited to 2^31 bytes per request anyway; 4 GiB keeps every size in 32-bit arithmetic
// of the kernel's iovecs safe while allowing anything a user sensibly asks for.
constexpr std::uint64_t max_chunk_bytes = 4ull << 30;
constexpr std::uint32_t max_buffer_depth = 1024;
constexpr std::uint32_t max_io_depth = 4096;
// A week: long enough for any real load, short enough that a typo (`300h` for `300s`) is
// still a finite wait, and far from overflowing milliseconds.
constexpr std::chrono::milliseconds max_timeout{7LL * 24 * 3600 * 1000};

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

std::string print_size(std::uint64_t bytes);
std::string print_duration(std::chrono::milliseconds d);

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

/// Duration parsing without the key prefix and with no range but the type's.
std::chrono::milliseconds parse_duration_value(std::string_view text) {
  auto ms = duration_ms(text);
  if (!ms) {
    bad_value(fmt::format("{} is out of range (a duration is 0 to {} ms)", quote_value(text),
                          std::numeric_limits<std::int64_t>::max()));
  }
  return *ms;
}

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

/// A choice among names. @p names_aliases maps accepted spellings (lowercase) to values.
template <typename E, std::size_t N>
E parse_choice(std::string_view text, const std::array<std::pair<std::string_view, E>, N>& table,
               std::string_view allowed) {
  std::string t = lowercase(trim(text));
  for (const auto& [name, value] : table) {
    if (name == t) return value;
  }
  bad_value(fmt::format("{} is not one of {}", quote_value(text), allowed));
}

/// Shortest exact spelling of a size: "16MiB", "1GiB", "1000" (bytes).
std::string print_size(std::uint64_t bytes) {
  static constexpr std::array<std::pair<std::string_view, int>, 4> units{
      {{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}};
  for (const auto& [name, shift] : units) {
    std::uint64_t unit = 1ull << shift;
    if (bytes != 0 && bytes % unit == 0) return fmt::format("{}{}", bytes / unit, name);
  }
  return fmt::format("{}", bytes);
}

/// Exact spelling of a duration: "1h", "300s", "250ms".
std::string print_duration(std::chrono::milliseconds d) {
  auto ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return fmt::format("{}h", ms / 3'600'000);
  if (ms % 1000 == 0) return fmt::format("{}s", ms / 1000);
  return fmt::format("{}ms", ms);
}

// ---- The key table -----------------------------------------------------------------------

// What a key's value is, for the rules the loader applies to every key alike.
enum class ValueKind {
  setting,  // a word, size or duration: an empty or null value is refused ("has no value")
  integer,  // a whole number (or auto): the same
  text,     // a path or the token: "" (or a YAML null) means none, as documented (README,
            // default.yaml)
};

struct KeySpec {
  std::string_view name;
  ValueKind kind;
  void (*parse)(Config& config, std::string_view text);  // throws bad_value(reason)
  std::string (*print)(const Config& config);            // exact, re-readable spelling
};

constexpr std::array<std::pair<std::string_view, DeviceKind>, 3> device_names{{
    {"auto", DeviceKind::automatic}, {"host", DeviceKind::host}, {"cuda", DeviceKind::cuda}}};
constexpr std::array<std::pair<std::string_view, TransportKind>, 4> transport_names{{
    {"auto", TransportKind::automatic}, {"local", TransportKind::local},
    {"mpi", TransportKind::mpi}, {"nccl", TransportKind::nccl}}};
// YAML 1.1 booleans are accepted because `direct_io: true` is what people write.
constexpr std::array<std::pair<std::string_view, DirectIo>, 7> direct_io_names{{
    {"auto", DirectIo::automatic}, {"on", DirectIo::on}, {"off", DirectIo::off},
    {"true", DirectIo::on}, {"false", DirectIo::off}, {"yes", DirectIo::on},
    {"no", DirectIo::off}}};
constexpr std::array<std::pair<std::string_view, ReaderKind>, 4> reader_names{{
    {"auto", ReaderKind::automatic}, {"uring", ReaderKind::uring},
    {"io_uring", ReaderKind::uring}, {"pread", ReaderKind::pread}}};
constexpr std::array<std::pair<std::string_view, Destination>, 2> destination_names{{
    {"arena", Destination::arena}, {"discard", Destination::discard}}};
constexpr std::array<std::pair<std::string_view, PlacementMode>, 2> placement_names{{
    {"replicate", PlacementMode::replicate}, {"fsdp", PlacementMode::fsdp}}};

// As for direct_io, `verify: false` is what people write.
constexpr std::array<std::pair<std::string_view, Verify>, 8> verify_names{{
    {"none", Verify::none}, {"digest", Verify::digest}, {"true", Verify::digest},
    {"false", Verify::none}, {"yes", Verify::digest}, {"no", Verify::none},
    {"on", Verify::digest}, {"off", Verify::none}}};
constexpr std::array<std::pair<std::string_view, LogLevel>, 5> log_level_names{{
    {"error", LogLevel::error}, {"warn", LogLevel::warn}, {"warning", LogLevel::warn},
    {"info", LogLevel::info}, {"debug", LogLevel::debug}}};

std::uint32_t parse_bounded(std::string_view text, std::uint64_t lo, std::uint64_t hi,
                            std::string_view what) {
  // A negative or too large integer is a whole number out of range, not "not a whole number".
  std::string_view digits = trim(text);
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  const bool integer = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '_';
  });
  if (integer && (digits.size() != trim(text).size() || digits.size() > 19)) {
    bad_value(fmt::format("{} is out of range (must be {} to {}: {})", quote_value(text), lo,
                          hi, what));
  }
  auto value = parse_integer_value(text, what);
  if (value < lo || value > hi) {
    bad_value(fmt::format("{} is out of range (must be {} to {}: {})", quote_value(text), lo,
                          hi, what));
  }
  return static_cast<std::uint32_t>(value);
}

/// An integer in [@p lo, @p hi], or `auto` (returned as @p automatic).
int parse_auto_int(std::string_view text, std::uint64_t lo, std::uint64_t hi, int automatic) {
  if (lowercase(trim(text)) == "auto") return automatic;
  return static_cast<int>(parse_bounded(text, lo, hi, "a whole number or auto"));
}

std::string print_auto_int(int value, int automatic) {
  return value == automatic ? std::string("auto") : fmt::format("{}", value);
}

// What the effective config prints for a token that is set.
constexpr std::string_view token_mask = "(set)";

const std::array<KeySpec, 20>& key_table() {
  static const std::array<KeySpec, 20> table{{
      {"checkpoint", ValueKind::text,
       [](Config& c, std::string_view t) { c.checkpoint = std::string(t); },
       [](const Config& c) { return c.checkpoint; }},
      {"device", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.device = parse_choice(t, device_names, "auto, host, cuda");
       },
       [](const Config& c) { return std::string(to_string(c.device)); }},
      {"transport", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.transport = parse_choice(t, transport_names, "auto, local, mpi, nccl");
       },
       [](const Config& c) { return std::string(to_string(c.transport)); }},
      {"chunk_size", ValueKind::setting,
       [](Config& c, std::string_view t) {
         const auto bytes = size_bytes(t);
         if (!bytes || *bytes == 0 || *bytes > max_chunk_bytes) {
           bad_value(fmt::format("{} is out of range (must be more than 0 and at most 4GiB)",
                                 quote_value(t)));
         }
         c.chunk_bytes = *bytes;
       },
       [](const Config& c) { return print_size(c.chunk_bytes); }},
      {"buffer_depth", ValueKind::integer,
       [](Config& c, std::string_view t) {
         c.buffer_depth = parse_bounded(t, 1, max_buffer_depth, "staging ring slots");
       },
       [](const Config& c) { return fmt::format("{}", c.buffer_depth); }},
      {"io_depth", ValueKind::integer,
       [](Config& c, std::string_view t) {
         c.io_depth = parse_bounded(t, 1, max_io_depth, "reads in flight");
       },
       [](const Config& c) { return fmt::format("{}", c.io_depth); }},
      {"direct_io", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.direct_io = parse_choice(t, direct_io_names, "auto, on, off (or true, false)");
       },
       [](const Config& c) { return std::string(to_string(c.direct_io)); }},
      {"reader", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.reader = parse_choice(t, reader_names, "auto, uring, pread");
       },
       [](const Config& c) { return std::string(to_string(c.reader)); }},
      {"destination", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.destination = parse_choice(t, destination_names, "arena, discard");
       },
       [](const Config& c) { return std::string(to_string(c.destination)); }},
      {"timeout", ValueKind::setting,
       [](Config& c, std::string_view t) {
         const auto d = duration_ms(t);
         // Durations are whole milliseconds ("0.0001s" is refused as not one), so the bound
         // says the unit rather than "more than 0".
         if (!d || d->count() <= 0 || *d > max_timeout) {
           bad_value(fmt::format("{} is out of range (must be at least 1ms and at most 7 days)",
                                 quote_value(t)));
         }
         c.timeout = *d;
       },
       [](const Config& c) { return print_duration(c.timeout); }},
      {"verify", ValueKind::setting,
       [](Config& c, std::string_view t) { c.verify = parse_choice(t, verify_names, "none, digest"); },
       [](const Config& c) { return std::string(to_string(c.verify)); }},
      {"placement", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.placement.mode = parse_choice(t, placement_names, "replicate, fsdp");
       },
       [](const Config& c) { return std::string(to_string(c.placement.mode)); }},
      {"trace", ValueKind::text,
       [](Config& c, std::string_view t) { c.trace = std::string(t); },
       [](const Config& c) { return c.trace; }},
      {"log_level", ValueKind::setting,
       [](Config& c, std::string_view t) {
         c.log_level = parse_choice(t, log_level_names, "error, warn, info, debug");
       },
       [](const Config& c) { return std::string(to_string(c.log_level)); }},
      // The world (world.hpp): `auto` defers to the launcher's environment.
      {"world.rank", ValueKind::integer,
       [](Config& c, std::string_view t) { c.world_rank = parse_auto_int(t, 0, 1 << 20, -1); },
       [](const Config& c) { return print_auto_int(c.world_rank, -1); }},
      {"world.size", ValueKind::integer,
       [](Config& c, std::string_view t) { c.world_size = parse_auto_int(t, 1, 1 << 20, 0); },
       [](const Config& c) { return print_auto_int(c.world_size, 0); }},
      {"world.local_rank", ValueKind::integer,
       [](Config& c, std::string_view t) {
         c.world_local_rank = parse_auto_int(t, 0, 1 << 20, -1);
       },
       [](const Config& c) { return print_auto_int(c.world_local_rank, -1); }},
      // The control plane (control_plane.hpp).
      {"rendezvous.address", ValueKind::setting,
       [](Config& c, std::string_view t) {
         std::string v(trim(t));
         c.rendezvous_address = lowercase(v) == "auto" ? std::string() : v;
       },
       [](const Config& c) {
         return c.rendezvous_address.empty() ? std::string("auto") : c.rendezvous_address;
       }},
      {"rendezvous.port", ValueKind::integer,
       [](Config& c, std::string_view t) {
         c.rendezvous_port = static_cast<std::uint16_t>(parse_bounded(t, 1, 65535, "TCP port"));
       },
       [](const Config& c) { return fmt::format("{}", c.rendezvous_port); }},
      // The token is a secret shared by the job: the effective config shows only whether
      // one is set (`token_mask`), so logs can be shared. That printout loaded back would
      // otherwise set the token to the mask itself, and every rank started from it to the
      // same wrong token: the mask is refused as a token.
      // Refused here, on every rank, when too long for a hello: otherwise only the peers find
      // out as they connect, and rank 0 waits out `timeout` for them. The value, a secret, is
      // never quoted.
      {"rendezvous.token", ValueKind::text,
       [](Config& c, std::string_view t) {
         const std::size_t limit = detail::max_token_bytes;
         if (t.size() > limit) {
           bad_value(fmt::format("{} bytes, over the {} a rank's hello to rank 0 carries",
                                 t.size(), limit));
         }
         if (t == token_mask) {
           bad_value(fmt::format("'{}' is the mask the printed config shows in place of the "
                                 "token: give the token itself (or leave it empty and set "
                                 "$WEIGHTCAST_TOKEN)",
                                 token_mask));
         }
         c.rendezvous_token = std::string(t);
       },
       [](const Config& c) {
         return c.rendezvous_token.empty() ? std::string() : std::string(token_mask);
       }},
  }};
  return table;
}


const KeySpec* find_key(std::string_view name) {
  for (const auto& spec : key_table()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  // Optimal string alignment distance: a transposition ("chnuk") counts as one edit.
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string unknown_key_reason(std::string_view key) {
  // Compare case-insensitively and with '-' as '_', so `Chunk-Size` finds `chunk_size`.
  std::string norm = lowercase(key);
  std::replace(norm.begin(), norm.end(), '-', '_');
  const KeySpec* best = nullptr;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& spec : key_table()) {
    // At least the difference in length: a key far longer than any (a megabyte of it) needs
    // no table of its length × the name's to say so.
    if (norm.size() > spec.name.size() + 2) continue;
    auto distance = edit_distance(norm, spec.name);
    if (distance < best_distance) {
      best_distance = distance;
      best = &spec;
    }
  }
  if (best != nullptr && best_distance <= 2) {
    return fmt::format("unknown key {} (did you mean '{}'?)", quote_value(key), best->name);
  }
  std::string known;
  for (const auto& spec : key_table()) {
    if (!known.empty()) known += ", ";
    known += spec.name;
  }
  return fmt::format("unknown key {} (known keys: {})", quote_value(key), known);
}

const char* node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Null: return "nothing";
    default: return "a scalar";
  }
}

// YAML's core tags, as yaml-cpp spells them once `!!` is resolved.
constexpr std::string_view core_tag_prefix = "tag:yaml.org,2002:";

/// @return @p tag as it was written: "!!binary" for yaml-cpp's "tag:yaml.org,2002:binary".
std::string written_tag(std::string_view tag) {
  if (!tag.starts_with(core_tag_prefix)) return std::string(tag);
  return "!!" + std::string(tag.substr(core_tag_prefix.size()));
}

/// Whether @p tag is one of the YAML core schema's scalar tags (`!!str`, `!!int`, `!!bool`,
/// `!!float`, `!!null`), which PyYAML writes on every value with `default_style='"'` or
/// `canonical=True` (`"chunk_size": !!int "16777216"`).
bool is_core_scalar_tag(std::string_view tag) {
  if (!tag.starts_with(core_tag_prefix)) return false;
  const std::string_view name = tag.substr(core_tag_prefix.size());
  return name == "str" || name == "int" || name == "bool" || name == "float" || name == "null";
}

/// The spellings YAML's core schema reads as null, bar the empty one.
bool is_null_spelling(std::string_view text) {
  return text == "~" || text == "null" || text == "Null" || text == "NULL";
}

/// Whether @p node carries a tag other than none ("?": plain; yaml-cpp gives "" to a node it
/// built), the non-specific "!" (a quoted scalar, or `! x`), or @p core (a core tag's name:
/// "str", "map"), which asks for what the loader does anyway.
bool has_foreign_tag(const YAML::Node& node, std::string_view core) {
  const std::string& tag = node.Tag();
  return !(tag.empty() || tag == "?" || tag == "!" ||
           (tag.starts_with(core_tag_prefix) && tag.substr(core_tag_prefix.size()) == core));
}

[[noreturn]] void refuse_tag(std::string_view where, std::string_view what,
                             const YAML::Node& node) {
  throw Error(Errc::config,
              fmt::format("{}{} has the YAML tag {}, which weightcast does not support: values "
                          "are read as the text written (remove the tag)",
                          where, what, shown(written_tag(node.Tag()))));
}

/// Applies a YAML null (`key: null`, `key: ~`, a bare `key:`, `!!null`) to one key: none for
/// the keys where "" means none, "has no value" for the rest. @p given is the null's spelling
/// ("null", "~", "!!null"), or "" where nothing was written.
void apply_null(Config& config, const KeySpec& spec, const std::string& where,
                const std::string& origin, std::string_view given) {
  if (spec.kind != ValueKind::text) {
    throw Error(Errc::config,
                given.empty() ? where + "has no value"
                              : fmt::format("{}has no value ('{}' given, which YAML reads as null)",
                                            where, given));
  }
  spec.parse(config, "");
  config.set_at.insert_or_assign(std::string(spec.name), origin);
}

/// Applies one key's value. @p where is prepended to every message ("x.yaml:7: chunk_size: "),
/// @p origin is recorded as where the key was set ("x.yaml:7", "--set").
void apply(Config& config, const YAML::Node& value, const KeySpec& spec,
           const std::string& where, const std::string& origin) {
  std::string text;
  if (value.IsScalar()) {
    text = value.Scalar();
  } else {
    throw Error(Errc::config,
                fmt::format("{}expects a single value, got {}", where, node_kind(value)));
  }
  const bool secret = spec.name == "rendezvous.token";  // never quoted
  const std::string shown_value = secret ? std::string("the value") : quote_value(text);
  // A tag other than the core schema's scalar ones asks for a type the loader would not
  // honour: `!!binary aGVsbG8=` would be taken as its base64 text. The core scalar tags are
  // taken, and the key's own parser reads the text as written (`!!int "16777216"` is
  // 16777216, `!!int "0x10"` is refused as it would be untagged); !!null is null.
  if (has_foreign_tag(value, "str")) {
    if (!is_core_scalar_tag(value.Tag())) refuse_tag(where, "the value", value);
    if (value.Tag() == std::string(core_tag_prefix) + "null") {
      if (!text.empty() && !is_null_spelling(text)) {
        throw Error(Errc::config, fmt::format("{}{} has the YAML tag !!null but is not null "
                                              "(remove the tag)",
                                              where, shown_value));
      }
      apply_null(config, spec, where, origin, "!!null");
      return;
    }
  }
  // No key takes a NUL byte, and a path would silently end there (`checkpoint: "a\0b"` would
  // load `a`).
  if (const auto nul = text.find('\0'); nul != std::string::npos) {
    throw Error(Errc::config, fmt::format("{}{} holds a NUL byte at byte {}: no setting can hold "
                                          "one, and a path would end there",
                                          where, shown_value, nul));
  }
  // An empty value is "no value" for every key but the few where "" means none (a quoted ''
  // would otherwise turn `rendezvous.address` into auto, or a choice into its default).
  if (spec.kind != ValueKind::text && trim(text).empty()) {
    throw Error(Errc::config, where + "has no value");
  }
  try {
    spec.parse(config, text);
  } catch (const Error& e) {
    throw Error(Errc::config, where + e.what());
  }
  config.set_at.insert_or_assign(std::string(spec.name), origin);
}

int line_of(const YAML::Node& key, const YAML::Node& value) {
  // Value marks are the more precise place, but a null value has no mark of its own.
  if (value.IsDefined() && !value.IsNull() && value.Mark().line >= 0) return value.Mark().line + 1;
  return key.Mark().line + 1;
}

/// Walks a mapping; a key with no table entry whose value is a mapping is read as a prefix
/// (`rendezvous: {port: 1}` is the key `rendezvous.port`), so nested and dotted spellings of
/// future keys behave alike. @p seen holds each full key's line, across the whole file.
/// @return how the null @p value was written in @p source ("null", "~"), or "" for nothing
/// (`key:`), whose mark is where the next token begins.
std::string_view null_spelling(const YAML::Node& value, std::string_view source) {
  const auto pos = value.Mark().pos;
  if (pos < 0 || static_cast<std::size_t>(pos) >= source.size()) return {};
  const std::string_view rest = source.substr(static_cast<std::size_t>(pos));
  for (std::string_view spelling : {"~", "null", "Null", "NULL"}) {
    if (!rest.starts_with(spelling)) continue;
    if (rest.size() == spelling.size() ||
        std::string_view(" \t\r\n,}]#").find(rest[spelling.size()]) != std::string_view::npos) {
      return spelling;
    }
  }
  return {};
}

// `placement_rules`: a list of mappings, each `match: GLOB` and exactly one action
// (`shard: {dim: D[, ranks: [...]][, group: G]}`, `replicate: true`, `skip: true`,
// `ranks: [...]`). A list, so not in the table of scalar keys. @p where names the place
// ("x.yaml:12: " or "--set placement_rules=...: ").
constexpr std::string_view rules_key = "placement_rules";

std::vector<PlacementRule> parse_placement_rules(const YAML::Node& node,
                                                 const std::string& file,
                                                 const std::string& set_where = {}) {
  auto at = [&](const YAML::Node& n) {
    return file.empty() ? fmt::format("--set {}: ", rules_key)
                        : fmt::format("{}:{}: {}: ", file, n.Mark().line + 1, rules_key);
  };
  // The whole value's place, as every key's messages say it.
  const std::string where = file.empty() ? set_where : at(node);
  if (node.IsNull()) throw Error(Errc::config, where + "has no value");
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    if (const auto nul = text.find('\0'); nul != std::string::npos) {
      throw Error(Errc::config, fmt::format("{}{} holds a NUL byte at byte {}: no setting can "
                                            "hold one, and a path would end there",
                                            where, quote_value(text), nul));
    }
    if (trim(text).empty()) throw Error(Errc::config, where + "has no value");
  }
  if (!node.IsSequence()) {
    throw Error(Errc::config, fmt::format("{}expects a list of rules, got {}", at(node),
                                          node_kind(node)));
  }
  auto integer = [&](const YAML::Node& n, std::string_view what, long long lo, long long hi) {
    long long value = 0;
    const std::string text = n.IsScalar() ? n.Scalar() : std::string();
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (!n.IsScalar() || ec != std::errc() || end != text.data() + text.size() || value < lo ||
        value > hi) {
      throw Error(Errc::config, fmt::format("{}{}: {} is not an integer from {} to {}", at(n),
                                            what, n.IsScalar() ? quote_value(text)
                                                               : std::string(node_kind(n)),
                                            lo, hi));
    }
    return value;
  };
  auto rank_list = [&](const YAML::Node& n, std::string_view what) {
    if (!n.IsSequence()) {
      throw Error(Errc::config, fmt::format("{}{}: expects a list of ranks, got {}", at(n),
                                            what, node_kind(n)));
    }
    std::vector<int> ranks;
    for (const auto& r : n) ranks.push_back(static_cast<int>(integer(r, what, 0, 1 << 24)));
    return ranks;
  };
  auto yes = [&](const YAML::Node& n, std::string_view what) {
    if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "True" && n.Scalar() != "yes")) {
      throw Error(Errc::config, fmt::format("{}{}: write `{}: true`", at(n), what, what));
    }
  };
  std::vector<PlacementRule> rules;
  for (std::size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    const std::string name = fmt::format("rule {}", i + 1);
    if (!item.IsMap()) {
      throw Error(Errc::config, fmt::format("{}{}: expects a mapping (match: GLOB and an "
                                            "action), got {}",
                                            at(item), name, node_kind(item)));
    }
    PlacementRule rule;
    int actions = 0;
    bool matched = false;
    for (const auto& entry : item) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string();
      const YAML::Node& value = entry.second;
      if (key == "match") {
        if (!value.IsScalar() || value.Scalar().empty()) {
          throw Error(Errc::config, fmt::format("{}{}: match: expects a glob of tensor names",
                                                at(value), name));
        }
        rule.pattern = value.Scalar();
        matched = true;
      } else if (key == "replicate" || key == "skip") {
        yes(value, key);
        rule.action = key == "skip" ? PlacementRule::Action::skip
                                    : PlacementRule::Action::replicate;
        ++actions;
      } else if (key == "ranks") {
        rule.action = PlacementRule::Action::ranks;
        rule.ranks = rank_list(value, "ranks");
        ++actions;
      } else if (key == "shard") {
        rule.action = PlacementRule::Action::shard;
        ++actions;
        if (!value.IsMap()) {
          throw Error(Errc::config, fmt::format("{}{}: shard: expects {{dim: D}} (and "
                                                "optionally ranks: [...] or group: G), got {}",
                                                at(value), name, node_kind(value)));
        }
        bool dim = false;
        for (const auto& s : value) {
          const std::string k = s.first.IsScalar() ? s.first.Scalar() : std::string();
          if (k == "dim") {
            rule.dim = static_cast<std::uint32_t>(integer(s.second, "shard.dim", 0, 63));
            dim = true;
          } else if (k == "ranks") {
            rule.ranks = rank_list(s.second, "shard.ranks");
          } else if (k == "group") {
            rule.group = static_cast<std::uint32_t>(integer(s.second, "shard.group", 1, 1 << 24));
          } else {
            throw Error(Errc::config, fmt::format("{}{}: shard: unknown key {} (known: dim, "
                                                  "ranks, group)",
                                                  at(s.first), name, quote_value(k)));
          }
        }
        if (!dim) {
          throw Error(Errc::config, fmt::format("{}{}: shard: needs dim", at(value), name));
        }
      } else {
        throw Error(Errc::config, fmt::format("{}{}: unknown key {} (known: match, shard, "
                                              "replicate, skip, ranks)",
                                              at(entry.first), name, quote_value(key)));
      }
    }
    if (!matched) throw Error(Errc::config, fmt::format("{}{}: needs match: GLOB", at(item), name));
    if (actions != 1) {
      throw Error(Errc::config, fmt::format("{}{}: needs exactly one of shard, replicate, skip, "
                                            "ranks (has {})",
                                            at(item), name, actions));
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

std::string print_placement_rules(const std::vector<PlacementRule>& rules) {
  YAML::Emitter out;
  out << YAML::Flow << YAML::BeginSeq;
  for (const PlacementRule& rule : rules) {
    out << YAML::BeginMap << YAML::Key << "match" << YAML::Value << YAML::DoubleQuoted
        << rule.pattern;
    switch (rule.action) {
      case PlacementRule::Action::replicate:
        out << YAML::Key << "replicate" << YAML::Value << "true";
        break;
      case PlacementRule::Action::skip:
        out << YAML::Key << "skip" << YAML::Value << "true";
        break;
      case PlacementRule::Action::ranks:
        out << YAML::Key << "ranks" << YAML::Value << YAML::Flow << rule.ranks;
        break;
      case PlacementRule::Action::shard:
        out << YAML::Key << "shard" << YAML::Value << YAML::BeginMap << YAML::Key << "dim"
            << YAML::Value << rule.dim;
        if (!rule.ranks.empty()) out << YAML::Key << "ranks" << YAML::Value << YAML::Flow << rule.ranks;
        if (rule.group > 1) out << YAML::Key << "group" << YAML::Value << rule.group;
        out << YAML::EndMap;
        break;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  return out.c_str();
}

void apply_mapping(Config& config, const YAML::Node& mapping, const std::string& prefix,
                   const std::string& file, std::string_view source,
                   std::map<std::string, int>& seen) {
  // A key given twice in this mapping is refused even when its values are mappings (two
  // `rendezvous:` blocks), which yaml-cpp keeps both of; before any value is read, so that
  // what the first block holds does not hide it.
  std::map<std::string, int> here;
  for (const auto& entry : mapping) {
    const YAML::Node& key_node = entry.first;
    if (!key_node.IsScalar()) continue;  // refused below
    const int key_line = key_node.Mark().line + 1;
    if (auto [it, inserted] = here.emplace(key_node.Scalar(), key_line); !inserted) {
      throw Error(Errc::config, fmt::format("{}:{}: {}: given twice (first at line {})", file,
                                            key_line, shown(prefix + key_node.Scalar()),
                                            it->second));
    }
  }
  for (const auto& entry : mapping) {
    const YAML::Node& key_node = entry.first;
    const YAML::Node& value = entry.second;
    int key_line = key_node.Mark().line + 1;
    if (!key_node.IsScalar()) {
      throw Error(Errc::config,
                  fmt::format("{}:{}: a key must be a name, got {}", file, key_line,
                              node_kind(key_node)));
    }
    const std::string at = fmt::format("{}:{}: ", file, key_line);
    if (has_foreign_tag(key_node, "str")) {
      refuse_tag(at, fmt::format("the key {}", quote_value(key_node.Scalar())), key_node);
    }
    // YAML 1.1's merge key, which yaml-cpp reads as a key named "<<": say what it is.
    if (key_node.Scalar() == "<<" && key_node.Tag() == "?") {
      throw Error(Errc::config, fmt::format("{}YAML merge keys ('<<') are not supported: write "
                                            "the keys out",
                                            at));
    }
    std::string key = prefix + key_node.Scalar();
    if (key == rules_key) {
      if (auto [it, inserted] = seen.emplace(key, key_line); !inserted) {
        throw Error(Errc::config, fmt::format("{}:{}: {}: given twice (first at line {})", file,
                                              key_line, key, it->second));
      }
      if (value.IsNull()) {
        const std::string_view given = null_spelling(value, source);
        const std::string where = fmt::format("{}:{}: {}: ", file, line_of(key_node, value), key);
        throw Error(Errc::config,
                    given.empty() ? where + "has no value"
                                  : fmt::format("{}has no value ('{}' given, which YAML reads "
                                                "as null)",
                                                where, given));
      }
      config.placement.rules = parse_placement_rules(value, file);
      config.set_at.insert_or_assign(key, fmt::format("{}:{}", file, key_line));
      continue;
    }
    const KeySpec* spec = find_key(key);
    if (spec == nullptr && value.IsMap()) {
      if (has_foreign_tag(value, "map")) refuse_tag(at + shown(key) + ": ", "the mapping", value);
      apply_mapping(config, value, key + ".", file, source, seen);
      continue;
    }
    if (spec == nullptr) {
      throw Error(Errc::config,
                  fmt::format("{}:{}: {}", file, key_line, unknown_key_reason(key)));
    }
    if (auto [it, inserted] = seen.emplace(key, key_line); !inserted) {
      throw Error(Errc::config, fmt::format("{}:{}: {}: given twice (first at line {})", file,
                                            key_line, key, it->second));
    }
    int line = line_of(key_node, value);
    if (value.IsNull()) {
      apply_null(config, *spec, fmt::format("{}:{}: {}: ", file, line, key),
                 fmt::format("{}:{}", file, line), null_spelling(value, source));
      continue;
    }
    apply(config, value, *spec, fmt::format("{}:{}: {}: ", file, line, key),
          fmt::format("{}:{}", file, line));
  }
}

// A config is a few hundred bytes of key: value lines; 1 MiB leaves ample room for comments
// and refuses a checkpoint or /dev/zero named by mistake before it is read into memory.
constexpr std::size_t max_config_bytes = 1 << 20;

// The safetensors layout: a little-endian u64 header length within the format's limit,
// then the header's opening brace. YAML text never starts with such a length (its first
// eight bytes are printable, so the u64 is far above the limit).
bool looks_like_safetensors(std::string_view path, std::string_view first_bytes) {
  if (path.ends_with(".safetensors") || path.ends_with(".safetensors.index.json")) return true;
  if (first_bytes.size() < 9 || first_bytes[8] != '{') return false;
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(first_bytes[i]);
  }
  return header_bytes >= 2 && header_bytes <= max_header_bytes;
}

[[noreturn]] void refuse_checkpoint_as_config(const std::string& path) {
  throw Error(Errc::config,
              fmt::format("{}: this looks like a checkpoint, not a YAML config file: use --set "
                          "checkpoint={}",
                          path, path));
}

/// What a config in UTF-16 or UTF-32 (Notepad's "Unicode") is, from its byte-order mark or,
/// without one, its first NULs as YAML 1.2 §5.2 tells them apart: "UTF-16 (byte-order mark
/// FF FE)"; "" for anything else. Otherwise such a file said "holds a NUL byte (byte 3)".
std::string utf16_or_utf32(std::string_view text) {
  const auto bytes = [&](std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
      out += fmt::format("{}{:02X}", i == 0 ? "" : " ", static_cast<unsigned char>(text[i]));
    }
    return out;
  };
  using namespace std::string_view_literals;
  if (text.starts_with("\xff\xfe\0\0"sv) || text.starts_with("\0\0\xfe\xff"sv)) {
    return fmt::format("UTF-32 (byte-order mark {})", bytes(4));
  }
  if (text.starts_with("\xff\xfe"sv) || text.starts_with("\xfe\xff"sv)) {
    return fmt::format("UTF-16 (byte-order mark {})", bytes(2));
  }
  if (text.size() >= 4 && text[0] != '\0' && text.substr(1, 3) == "\0\0\0"sv) {
    return "UTF-32 (little-endian, without a byte-order mark)";
  }
  if (text.size() >= 4 && text.substr(0, 3) == "\0\0\0"sv && text[3] != '\0') {
    return "UTF-32 (big-endian, without a byte-order mark)";
  }
  if (text.size() >= 2 && text[0] != '\0' && text[1] == '\0') {
    return "UTF-16 (little-endian, without a byte-order mark)";
  }
  if (text.size() >= 2 && text[0] == '\0' && text[1] != '\0') {
    return "UTF-16 (big-endian, without a byte-order mark)";
  }
  return {};
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    detail::throw_open_failure(ec ? ec.value() : ENOENT, path, "config file");
  }
  if (std::filesystem::is_directory(status)) {
    throw Error(Errc::config, fmt::format("{}: is a directory, not a YAML config file (a "
                                          "checkpoint directory? use --set checkpoint={})",
                                          path, path));
  }
  if (looks_like_safetensors(path, {})) refuse_checkpoint_as_config(path);
  // Non-blocking open: a FIFO would otherwise wait for a writer forever.
  const int fd = detail::open_input_nonblocking(path);
  if (fd < 0) detail::throw_open_failure(errno, path, "config file");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw system_error(Errc::io, errno, fmt::format("{}: cannot stat config file", path));
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(Errc::config, fmt::format("{}: is {}, not a YAML config file", path,
                                          detail::file_type_name(st.st_mode)));
  }
  // At most one byte past the limit: enough to tell "too large", also where st_size says 0
  // (files in /proc) or the file grows while it is read.
  std::string text(std::min<std::uint64_t>(static_cast<std::uint64_t>(st.st_size),
                                           max_config_bytes) + 1,
                   '\0');
  std::size_t done = 0;
  while (done <= max_config_bytes) {
    if (done == text.size()) text.resize(std::min(text.size() * 2, max_config_bytes + 1));
    const ssize_t got = ::read(fd, text.data() + done, text.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw system_error(Errc::io, errno, fmt::format("{}: cannot read", path));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  text.resize(done);
  if (looks_like_safetensors("", text)) refuse_checkpoint_as_config(path);
  if (const auto encoding = utf16_or_utf32(text); !encoding.empty()) {
    throw Error(Errc::config, fmt::format("{}: is {}: save it as UTF-8", path, encoding));
  }
  // YAML allows no NUL byte in a stream (YAML 1.2 §5.1), and yaml-cpp reads a raw one as if
  // it were a backslash: `trace: my<NUL>nreport.json` wrote to "my\nreport.json".
  if (const auto nul = text.find('\0'); nul != std::string::npos && done <= max_config_bytes) {
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
    throw Error(Errc::config, fmt::format("{}:{}: holds a NUL byte (byte {} of the file), which "
                                          "YAML does not allow",
                                          path, line, nul));
  }
  if (done > max_config_bytes) {
    throw Error(Errc::config,
                fmt::format("{}: is larger than a config file can be ({} bytes at most; a config "
                            "is a few lines of YAML key: value)",
                            path, max_config_bytes));
  }
  return text;
}

/// @p text with every run of CRs that ends a line (before an LF, or at the end of the file)
/// removed: CRLF, and the CRCRLF of a file converted twice, are line endings. A CR followed
/// by other text is refused: YAML 1.2 reads it as a line break and yaml-cpp does not (a file
/// of old Mac line endings read as "illegal map value", `trace: a<CR>b` as a path holding a
/// CR), and either reading of `# note<CR>more` is a guess at whether `more` is content.
std::string line_endings_to_lf(std::string text, const std::string& path) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\r') {
      out += text[i];
      continue;
    }
    const std::size_t end = std::min(text.find_first_not_of('\r', i), text.size());
    if (end == text.size() || text[end] == '\n') {
      i = end - 1;  // the run is part of the line ending
      continue;
    }
    const auto line =
        1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(i), '\n');
    throw Error(Errc::config,
                fmt::format("{}:{}: a carriage return inside the line (byte {} of the file): a CR "
                            "inside a line is not supported (YAML would read it as a line break, "
                            "so what follows, comment text too, would become content); use LF or "
                            "CRLF line endings, and \"\\r\" in a double-quoted value",
                            path, line, i));
  }
  return out;
}

// The line where the second document of @p text begins: its root node's mark, or, for an
// empty document (a null node has no useful mark), its "---" marker's line.
int second_document_line(std::string_view text, const std::vector<YAML::Node>& documents) {
  const YAML::Node& first = documents[0];
  const YAML::Node& second = documents[1];
  if (!second.IsNull() && second.Mark().line >= 0) return second.Mark().line + 1;
  std::vector<int> markers;  // lines starting with "---" (document markers), 1-based
  int line = 1;
  for (std::size_t at = 0; at < text.size(); ++line) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view row = text.substr(at, end - at);
    if (row.starts_with("---") &&
        (row.size() == 3 || std::isspace(static_cast<unsigned char>(row[3])) != 0)) {
      markers.push_back(line);
    }
    at = end + 1;
  }
  if (markers.empty()) return 1;
  if (!first.IsNull() && first.Mark().line >= 0) {
    for (int marker : markers) {
      if (marker > first.Mark().line + 1) return marker;
    }
    return markers.back();
  }
  // An empty first document: it began at the first marker unless it had none.
  return markers.size() >= 2 ? markers[1] : markers[0];
}

void apply_file(Config& config, const std::string& path) {
  std::string text = line_endings_to_lf(read_file(path), path);
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::ParserException& e) {
    throw Error(Errc::config, fmt::format("{}:{}:{}: invalid YAML: {}", path, e.mark.line + 1,
                                          e.mark.column + 1, e.msg));
  }
  // A second document would otherwise be ignored without a word, bad keys and all.
  if (documents.size() > 1) {
    throw Error(Errc::config,
                fmt::format("{}:{}: a second YAML document (after '---'): a config file is one "
                            "document; merge the two or remove the '---'",
                            path, second_document_line(text, documents)));
  }
  const YAML::Node root = documents.empty() ? YAML::Node() : documents.front();
  // An empty file (or one of comments only) is a valid config that changes nothing.
  if (root.IsNull()) return;
  if (!root.IsMap()) {
    throw Error(Errc::config,
                fmt::format("{}:{}: the top level must be a mapping of key: value, got {}", path,
                            root.Mark().line + 1, node_kind(root)));
  }
  if (has_foreign_tag(root, "map")) {
    refuse_tag(fmt::format("{}:{}: ", path, root.Mark().line + 1), "the top level", root);
  }
  std::map<std::string, int> seen;
  apply_mapping(config, root, "", path, text, seen);
}

void apply_override(Config& config, const std::string& item) {
  auto eq = item.find('=');
  if (eq == std::string::npos) {
    throw Error(Errc::usage,
                fmt::format("--set {}: expected key=value, e.g. --set chunk_size=16MiB",
                            shown(item)));
  }
  std::string key(trim(std::string_view(item).substr(0, eq)));
  std::string raw = item.substr(eq + 1);
  std::string where = fmt::format("--set {}: ", shown(item));
  if (key.empty()) {
    throw Error(Errc::usage, fmt::format("{}the key is empty (expected key=value)", where));
  }
  if (key == rules_key) {
    // A list: the value is read as YAML (flow style: [{match: "*.o_proj.*", shard: {dim: 1}}]).
    if (trim(raw).empty()) throw Error(Errc::config, where + "has no value");
    YAML::Node value;
    try {
      value = YAML::Load(raw);
    } catch (const YAML::ParserException& e) {
      throw Error(Errc::config, fmt::format("{}not valid YAML ({})", where, e.msg));
    }
    config.placement.rules = parse_placement_rules(value, "", where);
    config.set_at.insert_or_assign(key, "--set");
    return;
  }
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) throw Error(Errc::config, where + unknown_key_reason(key));
  // The job token is a secret: its messages name the key alone.
  if (spec->name == "rendezvous.token") where = fmt::format("--set {}: ", spec->name);
  // The value is taken as written: read as YAML, `model #v2.safetensors` would be `model` (a
  // comment), and `~`, `null`, `!x`, `&x` would be no value or a tag. Only a value that starts
  // with a quote is YAML's quoted scalar (`'/x/y: z'`, `"a b"`, `''` for an empty string).
  const std::string_view text = trim(raw);
  if (text.empty()) throw Error(Errc::config, where + "has no value");
  if (text.front() != '\'' && text.front() != '"') {
    apply(config, YAML::Node(std::string(text)), *spec, where, "--set");
    return;
  }
  // `'a'.b`, `'a' # x'`, `"a" "b"`: a quoted string and more text, which YAML would drop.
  // Where the opening quote's string ends: single quotes escape themselves (''), double
  // quotes take backslash escapes.
  const char quote = text.front();
  std::size_t close = std::string_view::npos;
  for (std::size_t i = 1; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') {
      ++i;
    } else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;
      } else {
        close = i;
        break;
      }
    }
  }
  if (close != text.size() - 1) {
    throw Error(Errc::config, fmt::format("{}a value that starts with a quote must be one "
                                          "quoted string (quote all of it)",
                                          where));
  }
  YAML::Node value;
  try {
    value = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    throw Error(Errc::config,
                fmt::format("{}the quoted value is not valid YAML ({})", where, e.msg));
  }
  apply(config, value, *spec, where, "--set");
}

/// Whether @p text holds a C0 control (tab too), DEL, a C1 control (U+0080 to U+009F) or a
/// line or paragraph separator (U+2028, U+2029), which `to_yaml` prints escaped.
bool needs_escapes(std::string_view text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x20 || byte == 0x7f) return true;
    const std::string_view rest = text.substr(i);
    if (byte == 0xc2 && rest.size() >= 2 && static_cast<unsigned char>(rest[1]) >= 0x80 &&
        static_cast<unsigned char>(rest[1]) <= 0x9f) {
      return true;
    }
    if (rest.starts_with("\xe2\x80\xa8") || rest.starts_with("\xe2\x80\xa9")) return true;
  }
  return false;
}

/// @p text as a YAML double-quoted scalar that reads back as @p text: `"`, `\`, and what
/// `needs_escapes` finds as escapes (`\t`, `\n`, `\r`, `\xHH`, `\u2028`); anything else,
/// bytes that are not UTF-8 included, as it is (YAML has no escape for a byte).
std::string double_quoted(std::string_view text) {
  std::string out = "\"";
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const std::string_view rest = text.substr(i);
    if (byte == '"' || byte == '\\') {
      out += '\\';
      out += text[i];
    } else if (byte == '\t') {
      out += "\\t";
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else if (byte == 0xc2 && rest.size() >= 2 && static_cast<unsigned char>(rest[1]) >= 0x80 &&
               static_cast<unsigned char>(rest[1]) <= 0x9f) {
      // `\x85`, not `\N`: yaml-cpp reads `\N` as the lone byte 0x85 rather than U+0085.
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(rest[1]));
      ++i;
    } else if (rest.starts_with("\xe2\x80\xa8") || rest.starts_with("\xe2\x80\xa9")) {
      out += rest[2] == '\xa8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out + "\"";
}

}  // namespace

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

std::string Config::to_yaml() const {
  std::string yaml;
  for (const auto& spec : key_table()) {
    const std::string value = spec.print(*this);
    // A control character is printed escaped, never raw: a CR, DEL, C1 control or line
    // separator would reach the terminal as it is, and a raw CR would not load back.
    if (needs_escapes(value)) {
      yaml += fmt::format("{}: {}\n", spec.name, double_quoted(value));
      continue;
    }
    YAML::Emitter out;
    out << YAML::BeginMap << YAML::Key << std::string(spec.name) << YAML::Value;
    // Quote what YAML would otherwise read as null or not at all (an empty path), and
    // anything not plain; the emitter decides the rest.
    if (value.empty() || value == "~" || lowercase(value) == "null") {
      out << YAML::DoubleQuoted << value;
    } else {
      out << value;
    }
    out << YAML::EndMap;
    yaml += std::string(out.c_str()) + "\n";
    if (spec.name == "placement") {
      yaml += fmt::format("{}: {}\n", rules_key, print_placement_rules(placement.rules));
    }
  }
  return yaml;
}

std::string_view Config::where_set(std::string_view key) const {
  const auto it = set_at.find(key);
  return it == set_at.end() ? std::string_view() : std::string_view(it->second);
}

Config load_config(const std::string& yaml_path, const std::vector<std::string>& overrides) {
  Config config;
  if (!yaml_path.empty()) apply_file(config, yaml_path);
  for (const auto& item : overrides) apply_override(config, item);
  return config;
}

}  // namespace weightcast
