// The YAML rules: a config file's mapping and each `--set key=value`, read into a Config
// through the key table (tags, nulls, keys given twice, nested keys, quoting).
#include "weightcast/config/detail/config_parts.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <map>

namespace weightcast {

namespace detail {

const char* node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Null: return "nothing";
    default: return "a scalar";
  }
}

namespace {

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
  if (spec.setting->type != SettingType::text) {
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
  if (spec.setting->type != SettingType::text && trim(text).empty()) {
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
  std::string text = line_endings_to_lf(read_config_file(path), path);
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

void apply_override(Config& config, const std::string& item, std::string_view origin) {
  auto eq = item.find('=');
  if (eq == std::string::npos) {
    throw Error(Errc::usage,
                fmt::format("{} {}: expected key=value, e.g. {} chunk_size=16MiB", origin,
                            shown(item), origin));
  }
  std::string key(trim(std::string_view(item).substr(0, eq)));
  std::string raw = item.substr(eq + 1);
  std::string where = fmt::format("{} {}: ", origin, shown(item));
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
    config.set_at.insert_or_assign(key, std::string(origin));
    return;
  }
  const KeySpec* spec = find_key(key);
  if (spec == nullptr) throw Error(Errc::config, where + unknown_key_reason(key));
  // The job token is a secret: its messages name the key alone.
  if (spec->name == "rendezvous.token") where = fmt::format("{} {}: ", origin, spec->name);
  // The value is taken as written: read as YAML, `model #v2.safetensors` would be `model` (a
  // comment), and `~`, `null`, `!x`, `&x` would be no value or a tag. Only a value that starts
  // with a quote is YAML's quoted scalar (`'/x/y: z'`, `"a b"`, `''` for an empty string).
  const std::string_view text = trim(raw);
  if (text.empty()) throw Error(Errc::config, where + "has no value");
  if (text.front() != '\'' && text.front() != '"') {
    apply(config, YAML::Node(std::string(text)), *spec, where, std::string(origin));
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
  apply(config, value, *spec, where, std::string(origin));
}

}  // namespace

}  // namespace detail

Config load_config(const std::string& yaml_path, const std::vector<std::string>& overrides,
                   std::string_view origin) {
  Config config;
  if (!yaml_path.empty()) detail::apply_file(config, yaml_path);
  apply_overrides(config, overrides, origin);
  return config;
}

void apply_overrides(Config& config, const std::vector<std::string>& overrides,
                     std::string_view origin) {
  for (const auto& item : overrides) detail::apply_override(config, item, origin);
}

}  // namespace weightcast
