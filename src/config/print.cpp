// Printing a Config as YAML (the effective config), which load_config reads back.
#include "weightcast/config/detail/config_parts.hpp"

#include <fmt/core.h>

namespace weightcast {

using detail::key_table;
using detail::lowercase;
using detail::print_placement_rules;
using detail::rules_key;

namespace {

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

}  // namespace weightcast
