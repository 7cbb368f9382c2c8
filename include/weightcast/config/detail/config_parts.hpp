/**
 * @file config_parts.hpp
 * @brief What the config loader's files share: reading a value's text, quoting it in a
 *        message, the key table, placement rules and reading the config file.
 *
 * Internal to src/config/: values.cpp (sizes, durations, whole numbers, quoting), keys.cpp
 * (the key table, from the settings registry), placement_rules.cpp, config_file.cpp (the
 * file's bytes), load.cpp (the YAML rules and `--set`), print.cpp (`Config::to_yaml`).
 */
#pragma once

#include "weightcast/config/config.hpp"

#include <yaml-cpp/yaml.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::detail {

// ---- values.cpp: a value's text ------------------------------------------------------------

/// Throws a bad value: `Error` `config` with @p reason, without the location (the loader
/// prefixes it: "x.yaml:7: chunk_size: ", "--set chunk_size=0: ").
[[noreturn]] void bad_value(std::string reason);

/// @return @p text without leading and trailing white space.
std::string_view trim(std::string_view text);

/// @return @p text in ASCII lowercase.
std::string lowercase(std::string_view text);

/// @return @p text as a message shows it, unquoted: control bytes as `\xHH`, and past 64
///         bytes cut with "…" and the length ("1234… (5000 bytes)").
std::string shown(std::string_view text);

/// @return @p text as a message quotes it: `'16 parsecs'`, `'1234…' (5000 bytes)`.
std::string quote_value(std::string_view text);

/// @return a size's bytes, or nullopt when it is negative or past 2^64 - 1 bytes (out of
///         range for every key, which says its own range).
/// @throws Error `config` (`bad_value`) for what is not a size: no number, an unknown unit
///         (one in another case, or a bare K/M/G/T, says the right spelling), an exponent,
///         a fraction of a byte.
std::optional<std::uint64_t> size_bytes(std::string_view text);

/// @return a duration, or nullopt when it is negative or past 2^63 - 1 ms.
/// @throws Error `config` for what is not a duration, or not a whole number of ms.
std::optional<std::chrono::milliseconds> duration_ms(std::string_view text);

/// @return the whole number @p text ("4", "1_000"); @p what names what it counts.
/// @throws Error `config` for what is not a whole number (an exponent says the plain spelling).
std::uint64_t parse_integer_value(std::string_view text, std::string_view what);

// ---- keys.cpp: the key table ---------------------------------------------------------------

/// One scalar key: its setting (core/settings.hpp: default, bounds, spellings) and how it is
/// stored in and printed from a `Config`.
struct KeySpec {
  const Setting* setting;
  std::string_view name;                                  ///< `setting->name`.
  void (*parse)(Config& config, std::string_view text);   ///< throws `bad_value(reason)`
  std::string (*print)(const Config& config);             ///< exact, re-readable spelling
};

/// @return every scalar key, in the order the effective config prints them
///         (`placement_rules`, a list, is read by `parse_placement_rules`).
std::span<const KeySpec> key_table();

/// @return the key named @p name, or nullptr.
const KeySpec* find_key(std::string_view name);

/// @return "unknown key 'chunk_sise' (did you mean 'chunk_size'?)", or the known keys.
std::string unknown_key_reason(std::string_view key);

/**
 * @brief Reads @p text as a value of @p setting (a size, count, auto_count, duration or
 *        choice) and checks it against the setting's bounds.
 * @return bytes, the number (auto: `default_value`), ms, or the enum's value.
 * @throws Error `config` (`bad_value`): the reason, in the words every surface uses
 *         (`out_of_range`, `not_a_choice`).
 */
std::int64_t parse_setting(const Setting& setting, std::string_view text);

// ---- placement_rules.cpp -------------------------------------------------------------------

/// The key of the placement rules: a list, so not in the table of scalar keys.
inline constexpr std::string_view rules_key = "placement_rules";

/// @return "a list", "a mapping", "nothing" or "a scalar": what @p node is, for messages.
const char* node_kind(const YAML::Node& node);

/**
 * @brief Reads `placement_rules`: a list of mappings, each `match: GLOB` and exactly one
 *        action (`shard: {dim: D[, ranks: [...]][, group: G]}`, `replicate: true`,
 *        `skip: true`, `ranks: [...]`).
 * @param file the config file, or "" for `--set` (then @p set_where names the place).
 * @throws Error `config` naming the place ("x.yaml:12: placement_rules: rule 2: ...").
 */
std::vector<PlacementRule> parse_placement_rules(const YAML::Node& node, const std::string& file,
                                                 const std::string& set_where = {});

/// @return @p rules as one line of YAML flow style, which `parse_placement_rules` reads back.
std::string print_placement_rules(const std::vector<PlacementRule>& rules);

// ---- config_file.cpp -----------------------------------------------------------------------

/// @return the text of the config file @p path: a regular file of at most 1 MiB, UTF-8,
///         without NUL bytes, and not a checkpoint.
/// @throws Error as `load_config` documents for @p yaml_path.
std::string read_config_file(const std::string& path);

}  // namespace weightcast::detail
