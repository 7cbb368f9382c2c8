// The key table: each config key's setting (core/settings.hpp) and how its value is read
// into and printed from a Config; suggestions for an unknown key.
#include "weightcast/config/detail/config_parts.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
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

// A plain key's value, read as its setting's type says, into the field's type.
template <class Key>
void parse_plain(Config& c, std::string_view text) {
  auto& field = c.*Key::member;
  using Field = std::remove_cvref_t<decltype(field)>;
  if constexpr (std::is_same_v<Field, std::string>) {
    field = std::string(text);
  } else if constexpr (std::is_same_v<Field, std::chrono::milliseconds>) {
    field = std::chrono::milliseconds(parse_setting(Key::setting, text));
  } else {
    field = static_cast<Field>(parse_setting(Key::setting, text));
  }
}

// A plain key's value as the effective config prints it: the exact, re-readable spelling.
template <class Key>
std::string print_plain(const Config& c) {
  const auto& field = c.*Key::member;
  using Field = std::remove_cvref_t<decltype(field)>;
  if constexpr (std::is_same_v<Field, std::string>) {
    return field;
  } else if constexpr (std::is_enum_v<Field>) {
    return std::string(to_string(field));
  } else if constexpr (std::is_same_v<Field, std::chrono::milliseconds>) {
    return print_duration(field);
  } else if constexpr (Key::setting.type == SettingType::size) {
    return print_size(field);
  } else if constexpr (Key::setting.type == SettingType::auto_count) {
    return spell(Key::setting, field);
  } else {
    return fmt::format("{}", field);
  }
}

template <class... Keys>
std::vector<KeySpec> plain_specs(const std::tuple<Keys...>* /*list*/) {
  return {KeySpec{&Keys::setting, Keys::setting.name, &parse_plain<Keys>, &print_plain<Keys>}...};
}

// The keys read in a way of their own.
const std::array<KeySpec, 3> own_keys{{
    key(setting::placement,
        [](Config& c, std::string_view t) {
          c.placement.mode = choice<PlacementMode>(setting::placement, t);
        },
        [](const Config& c) { return std::string(to_string(c.placement.mode)); }),
    // `auto` is stored as "": rank 0's address then comes from the environment.
    key(setting::rendezvous_address,
        [](Config& c, std::string_view t) {
          std::string v(trim(t));
          c.rendezvous_address = lowercase(v) == "auto" ? std::string() : v;
        },
        [](const Config& c) {
          return c.rendezvous_address.empty() ? std::string("auto") : c.rendezvous_address;
        }),
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

// Every scalar key in the registry's order (the effective config's, and the "known keys"
// list's).
const std::vector<KeySpec>& table() {
  static const std::vector<KeySpec> keys = [] {
    std::vector<KeySpec> all = plain_specs(static_cast<const PlainKeys*>(nullptr));
    all.insert(all.end(), own_keys.begin(), own_keys.end());
    const auto place = [](const KeySpec& k) {
      const auto registry = settings();
      return std::find_if(registry.begin(), registry.end(),
                          [&](const Setting& s) { return s.name == k.name; }) -
             registry.begin();
    };
    std::sort(all.begin(), all.end(),
              [&](const KeySpec& a, const KeySpec& b) { return place(a) < place(b); });
    return all;
  }();
  return keys;
}

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

std::span<const KeySpec> key_table() { return table(); }

const KeySpec* find_key(std::string_view name) {
  for (const auto& spec : table()) {
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
