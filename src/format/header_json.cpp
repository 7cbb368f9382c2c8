// The strict JSON parse and the message helpers declared in format/detail/header_json.hpp:
// duplicate keys recorded, serde_json's limits (depth, NUL, byte-order mark), UTF-8
// validation, and the one-line renderings of names and values that messages quote.
#include "weightcast/format/detail/header_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

namespace weightcast::detail {

using nlohmann::json;

std::string json_error_text(const std::exception& error) {
  std::string_view text = error.what();
  if (text.starts_with("[json.exception.")) {
    if (auto close = text.find("] "); close != std::string_view::npos) text.remove_prefix(close + 2);
  }
  std::string out(text);
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

namespace {

/// One SAX pass over the whole text (nlohmann's `json_sax` interface) that builds the DOM
/// through nlohmann's own DOM builder and, on the way, records repeated keys and the document
/// order of one object's keys and refuses nesting deeper than `max_json_depth`. nlohmann's
/// callback parser would do the first two, but after every object it scans its parent for
/// discarded values, which makes a header of N tensors cost O(N^2).
class StrictScan {
 public:
  StrictScan(JsonDocument& doc, std::string_view ordered_member)
      : _doc(doc), _ordered_member(ordered_member), _dom(doc.value, /*allow_exceptions=*/false) {}

  bool null() { return _dom.null(); }
  bool boolean(bool value) { return _dom.boolean(value); }
  bool number_integer(json::number_integer_t value) { return _dom.number_integer(value); }
  bool number_unsigned(json::number_unsigned_t value) { return _dom.number_unsigned(value); }
  bool number_float(json::number_float_t value, const json::string_t& text) {
    return _dom.number_float(value, text);
  }
  bool string(json::string_t& value) { return _dom.string(value); }
  bool binary(json::binary_t& value) { return _dom.binary(value); }
  bool start_object(std::size_t elements) { return open() && _dom.start_object(elements); }
  bool start_array(std::size_t elements) { return open() && _dom.start_array(elements); }
  bool end_object() { return close() && _dom.end_object(); }
  bool end_array() { return close() && _dom.end_array(); }
  bool key(json::string_t& key) {
    // The depth of a key is the number of containers open around it (1: the top level).
    const std::size_t depth = _open.size();
    if (depth == 1) _top_key = key;
    const bool recorded = _ordered_member.empty()
                              ? depth == 1
                              : depth == 2 && _top_key == _ordered_member;
    if (depth == 2) _member_key = key;
    if (recorded) _doc.ordered_keys.push_back(key);
    if (!_open.back().insert(key).second) {
      DuplicateKey dup{key, static_cast<int>(depth), depth == 1 ? std::string() : _top_key,
                       depth >= 3 ? _member_key : std::string(), nullptr};
      // The DOM builder is about to overwrite the earlier value in place; keep it. At depth
      // 1 the open object is the root, at depth 2 (under an object root, not an array) it is
      // the root's member _top_key.
      if (depth == 1) dup.earlier = std::move(_doc.value[key]);
      if (depth == 2 && _doc.value.is_object()) {
        dup.earlier = std::move(_doc.value[_top_key][key]);
      }
      if (!_doc.duplicate) _doc.duplicate = dup;
      _doc.duplicates.push_back(std::move(dup));
    }
    return _dom.key(key);
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) {
    _error = json_error_text(error);
    return false;
  }

  /// @return the syntax error that stopped the scan, if any.
  [[nodiscard]] const std::optional<std::string>& error() const noexcept { return _error; }

 private:
  bool open() {
    if (_open.size() == max_json_depth) {
      _error = fmt::format("more than {} nested arrays and objects (serde_json's recursion "
                           "limit, which the reference parser uses)",
                           max_json_depth);
      return false;
    }
    _open.emplace_back();  // an array's set stays empty: it only counts the depth
    if (_open.size() == 2) _member_key.clear();  // a new member of the root
    return true;
  }
  bool close() {
    _open.pop_back();
    return true;
  }

  JsonDocument& _doc;
  std::string_view _ordered_member;
  std::vector<std::unordered_set<std::string>> _open;  // keys seen, per open container
  std::string _top_key;
  std::string _member_key;  // the last key at depth 2
  std::optional<std::string> _error;
  nlohmann::detail::json_sax_dom_parser<json> _dom;  // builds doc.value (nlohmann 3.11)
};

}  // namespace

void expect_json_text(std::string_view text) {
  if (auto nul = text.find('\0'); nul != std::string_view::npos) {
    throw JsonSyntaxError(fmt::format("NUL byte at offset {}", nul));
  }
  // nlohmann's lexer skips a leading UTF-8 byte-order mark; serde_json (the safetensors
  // reference) and Python's json module (which reads an index for transformers) refuse it.
  if (text.starts_with("\xef\xbb\xbf")) {
    throw JsonSyntaxError(
        "the text starts with a UTF-8 byte-order mark (bytes EF BB BF), which the reference "
        "parsers (serde_json, Python's json) refuse; write it without the mark");
  }
}

JsonDocument parse_json_strict(std::string_view text, std::string_view ordered_member) {
  expect_json_text(text);
  JsonDocument doc;
  StrictScan scan(doc, ordered_member);
  if (!json::sax_parse(text.begin(), text.end(), &scan)) {
    throw JsonSyntaxError(scan.error().value_or("the JSON parser stopped"));
  }
  return doc;
}

std::optional<std::size_t> find_invalid_utf8(std::string_view text) noexcept {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  std::size_t size = text.size();
  std::size_t i = 0;
  while (i < size) {
    // Headers are nearly all ASCII: skip eight such bytes at a time.
    while (i + 8 <= size) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes + i, sizeof word);
      if ((word & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i >= size) break;
    unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    std::size_t length = 0;
    unsigned char low = 0x80;  // Allowed range of the second byte (rules out overlong forms,
    unsigned char high = 0xBF;  // surrogates and code points past U+10FFFF; RFC 3629 table).
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (i + length > size) return i;
    if (bytes[i + 1] < low || bytes[i + 1] > high) return i;
    for (std::size_t k = 2; k < length; ++k) {
      if (bytes[i + k] < 0x80 || bytes[i + k] > 0xBF) return i;
    }
    i += length;
  }
  return std::nullopt;
}

namespace {

// @return the longest prefix of @p text of at most @p max_bytes that ends on a UTF-8
// character boundary (a cut never leaves half a character behind).
std::string_view utf8_prefix(std::string_view text, std::size_t max_bytes) noexcept {
  if (text.size() <= max_bytes) return text;
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut);
}

}  // namespace

std::string quote(std::string_view text) {
  // A hostile header can hold a name or dtype of megabytes; a message stays one readable
  // line. The cut backs off to a UTF-8 character boundary.
  constexpr std::size_t max_bytes = 256;
  const std::size_t whole = text.size();
  text = utf8_prefix(text, max_bytes);
  std::string out;
  out.reserve(text.size() + 2);
  out += '\'';
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  if (whole > text.size()) out += fmt::format("…' ({} bytes)", whole);
  else out += '\'';
  return out;
}

std::optional<std::uint64_t> json_unsigned(const json& value) noexcept {
  // nlohmann parses a literal without '-' as unsigned; a signed integer is negative or `-0`.
  if (value.is_number_unsigned()) return value.get<std::uint64_t>();
  return std::nullopt;
}

std::string_view json_kind(const json& value) noexcept {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a floating-point number";
    default: return "not a JSON value";
  }
}

// One JSON value as its text; a signed zero is `-0` as written (nlohmann reads `-0` as the
// signed integer 0 and would print `0`, which is not what the header says).
std::string value_text(const json& value) {
  if (value.is_number_integer() && !value.is_number_unsigned() && value.get<std::int64_t>() == 0) {
    return "-0";
  }
  // An integer past 2^64 - 1 is a double to nlohmann, printed 1.8446744073709552e+19 for the
  // header's 18446744073709551616: print the double's exact integer value instead, which is
  // the header's text wherever a double holds it exactly.
  if (value.is_number_float()) {
    const double x = value.get<double>();
    if (std::isfinite(x) && std::fabs(x) >= 0x1p64 && x == std::trunc(x)) {
      return fmt::format("{:.0f}", x);
    }
  }
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string json_brief(const json& value) {
  // A hostile header can hold a million-element shape; a message stays one readable line.
  constexpr std::size_t max_chars = 160;
  std::string out;
  if (value.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& element : value) {
      if (!first) out += ", ";
      first = false;
      out += value_text(element);
      if (out.size() > max_chars) break;
    }
    out += ']';
  } else {
    out = value_text(value);
  }
  if (out.size() > max_chars) {
    out.resize(utf8_prefix(out, max_chars).size());  // at a UTF-8 boundary, as quote() cuts
    out += "…";
  }
  return out;
}

}  // namespace weightcast::detail
