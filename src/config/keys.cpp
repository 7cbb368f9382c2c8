// The key table: each config key's setting (core/settings.hpp) and how its value is read
// into and printed from a Config; suggestions for an unknown key.
#include "weightcast/config/detail/config_parts.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace weightcast::detail {

namespace {

/// A whole number of @p setting: a count, or an auto_count's number.
std::int64_t parse_bounded(const Setting& setting, std::string_view text) {
  // A negative or too large integer is a whole number out of range, not "not a whole number".
  std::string_view digits = trim(text);
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  const bool integer = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '_';
  });
  if (integer && (digits.size() != trim(text).size() || digits.size() > 19)) {
    bad_value(out_of_range(setting, quote_value(text)));
  }
  const auto value = parse_integer_value(text, setting.what);
  if (!setting.admits(value)) bad_value(out_of_range(setting, quote_value(text)));
  return static_cast<std::int64_t>(value);
}

// What the effective config prints for a token that is set.
constexpr std::string_view token_mask = "(set)";

/// The table's entry for @p s.
constexpr KeySpec key(const Setting& s, void (*parse)(Config&, std::string_view),
                      std::string (*print)(const Config&)) {
  return KeySpec{&s, s.name, parse, print};
}

template <typename E>
E choice(const Setting& s, std::string_view text) {
  return static_cast<E>(parse_setting(s, text));
}

const std::array<KeySpec, 20> table{{
    key(setting::checkpoint,
        [](Config& c, std::string_view t) { c.checkpoint = std::string(t); },
        [](const Config& c) { return c.checkpoint; }),
    key(setting::device,
        [](Config& c, std::string_view t) { c.device = choice<DeviceKind>(setting::device, t); },
        [](const Config& c) { return std::string(to_string(c.device)); }),
    key(setting::transport,
        [](Config& c, std::string_view t) {
          c.transport = choice<TransportKind>(setting::transport, t);
        },
        [](const Config& c) { return std::string(to_string(c.transport)); }),
    key(setting::chunk_size,
        [](Config& c, std::string_view t) {
          c.chunk_bytes = static_cast<std::uint64_t>(parse_setting(setting::chunk_size, t));
        },
        [](const Config& c) { return print_size(c.chunk_bytes); }),
    key(setting::buffer_depth,
        [](Config& c, std::string_view t) {
          c.buffer_depth = static_cast<std::uint32_t>(parse_setting(setting::buffer_depth, t));
        },
        [](const Config& c) { return fmt::format("{}", c.buffer_depth); }),
    key(setting::io_depth,
        [](Config& c, std::string_view t) {
          c.io_depth = static_cast<std::uint32_t>(parse_setting(setting::io_depth, t));
        },
        [](const Config& c) { return fmt::format("{}", c.io_depth); }),
    key(setting::direct_io,
        [](Config& c, std::string_view t) {
          c.direct_io = choice<DirectIo>(setting::direct_io, t);
        },
        [](const Config& c) { return std::string(to_string(c.direct_io)); }),
    key(setting::reader,
        [](Config& c, std::string_view t) { c.reader = choice<ReaderKind>(setting::reader, t); },
        [](const Config& c) { return std::string(to_string(c.reader)); }),
    key(setting::destination,
        [](Config& c, std::string_view t) {
          c.destination = choice<Destination>(setting::destination, t);
        },
        [](const Config& c) { return std::string(to_string(c.destination)); }),
    key(setting::timeout,
        [](Config& c, std::string_view t) {
          c.timeout = std::chrono::milliseconds(parse_setting(setting::timeout, t));
        },
        [](const Config& c) { return print_duration(c.timeout); }),
    key(setting::verify,
        [](Config& c, std::string_view t) { c.verify = choice<Verify>(setting::verify, t); },
        [](const Config& c) { return std::string(to_string(c.verify)); }),
    key(setting::placement,
        [](Config& c, std::string_view t) {
          c.placement.mode = choice<PlacementMode>(setting::placement, t);
        },
        [](const Config& c) { return std::string(to_string(c.placement.mode)); }),
    key(setting::trace,
        [](Config& c, std::string_view t) { c.trace = std::string(t); },
        [](const Config& c) { return c.trace; }),
    key(setting::log_level,
        [](Config& c, std::string_view t) {
          c.log_level = choice<LogLevel>(setting::log_level, t);
        },
        [](const Config& c) { return std::string(to_string(c.log_level)); }),
    // The world (world.hpp): `auto` defers to the launcher's environment.
    key(setting::world_rank,
        [](Config& c, std::string_view t) {
          c.world_rank = static_cast<int>(parse_setting(setting::world_rank, t));
        },
        [](const Config& c) { return spell(setting::world_rank, c.world_rank); }),
    key(setting::world_size,
        [](Config& c, std::string_view t) {
          c.world_size = static_cast<int>(parse_setting(setting::world_size, t));
        },
        [](const Config& c) { return spell(setting::world_size, c.world_size); }),
    key(setting::world_local_rank,
        [](Config& c, std::string_view t) {
          c.world_local_rank = static_cast<int>(parse_setting(setting::world_local_rank, t));
        },
        [](const Config& c) { return spell(setting::world_local_rank, c.world_local_rank); }),
    // The control plane (control_plane.hpp).
    key(setting::rendezvous_address,
        [](Config& c, std::string_view t) {
          std::string v(trim(t));
          c.rendezvous_address = lowercase(v) == "auto" ? std::string() : v;
        },
        [](const Config& c) {
          return c.rendezvous_address.empty() ? std::string("auto") : c.rendezvous_address;
        }),
    key(setting::rendezvous_port,
        [](Config& c, std::string_view t) {
          c.rendezvous_port =
              static_cast<std::uint16_t>(parse_setting(setting::rendezvous_port, t));
        },
        [](const Config& c) { return fmt::format("{}", c.rendezvous_port); }),
    // The token is a secret shared by the job: the effective config shows only whether
    // one is set (`token_mask`), so logs can be shared. That printout loaded back would
    // otherwise set the token to the mask itself, and every rank started from it to the
    // same wrong token: the mask is refused as a token.
    // Refused here, on every rank, when too long for a hello: otherwise only the peers find
    // out as they connect, and rank 0 waits out `timeout` for them. The value, a secret, is
    // never quoted.
    key(setting::rendezvous_token,
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
        }),
}};

}  // namespace

std::int64_t parse_setting(const Setting& setting, std::string_view text) {
  switch (setting.type) {
    case SettingType::size: {
      const auto bytes = size_bytes(text);
      if (!bytes || !setting.admits(*bytes)) bad_value(out_of_range(setting, quote_value(text)));
      return static_cast<std::int64_t>(*bytes);
    }
    case SettingType::duration: {
      const auto ms = duration_ms(text);
      if (!ms || !setting.admits(std::int64_t{ms->count()})) {
        bad_value(out_of_range(setting, quote_value(text)));
      }
      return ms->count();
    }
    case SettingType::auto_count:
      if (lowercase(trim(text)) == "auto") return setting.default_value;
      return parse_bounded(setting, text);
    case SettingType::count: return parse_bounded(setting, text);
    case SettingType::choice: {
      const int value = choice_value(setting, text);
      if (value < 0) bad_value(not_a_choice(setting, quote_value(text)));
      return value;
    }
    case SettingType::text:
    case SettingType::address:
    case SettingType::rules: break;
  }
  throw Error(Errc::internal, fmt::format("{}: not a value parse_setting reads", setting.name));
}

std::span<const KeySpec> key_table() { return table; }

const KeySpec* find_key(std::string_view name) {
  for (const auto& spec : table) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

namespace {

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

}  // namespace

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

}  // namespace weightcast::detail
