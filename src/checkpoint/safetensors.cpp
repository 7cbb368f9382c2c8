#include "weightcast/checkpoint/safetensors.hpp"

#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/format/detail/header_json.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/unordered/unordered_flat_set.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <vector>

namespace weightcast {

using nlohmann::json;

namespace detail {

static std::string json_error_text(const std::exception& error) {
  std::string_view text = error.what();
  if (text.starts_with("[json.exception.")) {
    if (auto close = text.find("] "); close != std::string_view::npos) text.remove_prefix(close + 2);
  }
  std::string out(text);
  std::replace(out.begin(), out.end(), '\n', ' ');
  return out;
}

namespace {

/// The deepest nesting of arrays and objects accepted: serde_json's recursion limit, which
/// the reference implementation parses headers with (`serde_json::from_str`: 128 levels, the
/// 128th open container is refused). It also keeps every later walk of the DOM shallow.
constexpr std::size_t max_json_depth = 127;

/// One SAX pass over the whole text (nlohmann's `json_sax` interface) that builds the DOM
/// through nlohmann's own DOM builder and, on the way, records repeated keys and the document
/// order of one object's keys and refuses nesting deeper than `max_json_depth`. nlohmann's
/// callback parser would do the first two, but after every object it scans its parent for
/// discarded values, which made a header of N tensors cost O(N^2) (20,000 tensors: 2 minutes).
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

static void expect_json_text(std::string_view text) {
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

}  // namespace detail

namespace {

using detail::json_brief;
using detail::quote;

[[noreturn]] void fail(std::string_view file, std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: {}", file, what));
}

[[noreturn]] void fail_tensor(std::string_view file, std::string_view tensor,
                              std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: tensor {}: {}", file, quote(tensor), what));
}

std::string known_dtypes() {
  std::string names;
  for (std::size_t i = 0; i < dtype_count; ++i) {
    if (i != 0) names += ", ";
    names += dtype_name(static_cast<Dtype>(i));
  }
  return names;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

/// One header entry after check 9, before the offset rules.
struct Entry {
  std::string name;
  Dtype dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin;
  std::uint64_t end;
};

/// What parse_entry saw that the format does not define and the reference ignores.
struct EntryNotes {
  std::size_t entries_with_unknown_keys = 0;
  std::string first;  // "tensor 'w' key 'extra'"
};

/// Check 9 for one entry, as the reference deserialises its `TensorInfo` (a serde struct
/// without deny_unknown_fields): an object with dtype, shape and data_offsets, where keys
/// besides those are ignored, or, as serde also reads a struct, an array of those three
/// values in that order.
Entry parse_entry(std::string_view file, const std::string& name, const json& value,
                  EntryNotes& notes) {
  const json* dtype_value = nullptr;
  const json* shape_value = nullptr;
  const json* offsets_value = nullptr;
  if (value.is_array()) {
    if (value.size() != 3) {
      fail_tensor(file, name,
                  fmt::format("entry is an array of {} elements; an entry is an object with "
                              "dtype, shape, data_offsets (or an array of exactly those three)",
                              value.size()));
    }
    dtype_value = &value[0];
    shape_value = &value[1];
    offsets_value = &value[2];
  } else if (value.is_object()) {
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) {
        fail_tensor(file, name,
                    fmt::format("missing key '{}' (an entry has dtype, shape, data_offsets)",
                                key));
      }
    }
    if (value.size() > 3) {
      ++notes.entries_with_unknown_keys;
      if (notes.first.empty()) {
        for (const auto& [key, unused] : value.items()) {
          if (key != "dtype" && key != "shape" && key != "data_offsets") {
            notes.first = fmt::format("tensor {} key {}", quote(name), quote(key));
            break;
          }
        }
      }
    }
    dtype_value = &value["dtype"];
    shape_value = &value["shape"];
    offsets_value = &value["data_offsets"];
  } else {
    fail_tensor(file, name,
                fmt::format("entry is {}, must be an object with dtype, shape, data_offsets",
                            detail::json_kind(value)));
  }

  Entry entry{name, Dtype::U8, {}, 0, 0};
  const json& dtype = *dtype_value;
  // serde reads an enum's unit variant from its name or from {"NAME": null}.
  const bool unit_variant =
      dtype.is_object() && dtype.size() == 1 && dtype.begin().value().is_null();
  if (!dtype.is_string() && !unit_variant) {
    fail_tensor(file, name, fmt::format("dtype {} is {}, must be a string such as \"F32\"",
                                        json_brief(dtype), detail::json_kind(dtype)));
  }
  const std::string& dtype_text =
      unit_variant ? dtype.begin().key() : dtype.get_ref<const std::string&>();
  auto parsed_dtype = parse_dtype(dtype_text);
  if (!parsed_dtype) {
    fail_tensor(file, name,
                fmt::format("unknown dtype {} (the format's dtypes: {})", quote(dtype_text),
                            known_dtypes()));
  }
  entry.dtype = *parsed_dtype;

  const json& shape = *shape_value;
  if (!shape.is_array()) {
    fail_tensor(file, name, fmt::format("shape {} is {}, must be an array of non-negative integers",
                                        json_brief(shape), detail::json_kind(shape)));
  }
  entry.shape.reserve(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    auto dim = detail::json_unsigned(shape[i]);
    if (!dim) {
      fail_tensor(file, name,
                  fmt::format("shape {}: dimension {} is {}, must be a non-negative integer "
                              "below 2^64",
                              json_brief(shape), i, json_brief(shape[i])));
    }
    entry.shape.push_back(*dim);
  }

  const json& offsets = *offsets_value;
  std::optional<std::uint64_t> begin;
  std::optional<std::uint64_t> end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = detail::json_unsigned(offsets[0]);
    end = detail::json_unsigned(offsets[1]);
  }
  if (!begin || !end) {
    fail_tensor(file, name,
                fmt::format("data_offsets {} must be two non-negative integers [begin, end]",
                            json_brief(offsets)));
  }
  entry.begin = *begin;
  entry.end = *end;
  return entry;
}

/// Check 8: `__metadata__` is null (the MLX writer emits null) or an object of strings.
std::map<std::string, std::string> parse_metadata(std::string_view file, const json& value) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;
  if (!value.is_object()) {
    fail(file, fmt::format("__metadata__ is {}, must be an object of string values",
                           detail::json_kind(value)));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      fail(file, fmt::format("__metadata__ value of key {} is {} ({}), must be a string",
                             quote(key), detail::json_kind(item), json_brief(item)));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}


/// Checks 5–9 in one SAX pass over the header text (nlohmann's `json_sax` interface), with no
/// DOM of the whole header: a header of the format's largest size (100,000,000 bytes, about
/// a million tensors) as a DOM took 13 s and 1 GB here. A top-level member's value is built
/// as a small DOM and checked by parse_metadata() or parse_entry() when it ends, so the rules
/// and their messages live in those two functions only (an entry key they do not ask for is
/// ignored or refused there, and nowhere else). The one exception is speed, not rules: an
/// entry in the canonical form parse_entry() accepts (exactly dtype, shape, data_offsets,
/// each once, a known dtype string, arrays of unsigned integers, two offsets) is taken
/// straight from the events; at the first event outside that form, what was seen is replayed
/// into the DOM and parse_entry() decides. A fault is remembered, not thrown, until the whole
/// text is known to be JSON (a syntax error anywhere wins), then reported in the rules'
/// order: 6, 7, 8, then the first faulty entry in document order.
class HeaderScan {
 public:
  explicit HeaderScan(std::string_view file, std::size_t text_bytes)
      : _file(file), _names(0, NameHash{&_entries}, NameEqual{&_entries}) {
    // About 100 header bytes per tensor in real files; a guess only saves regrowing.
    _entries.reserve(text_bytes / 96);
    _names.reserve(text_bytes / 96);
  }

  bool null() { return scalar("null", [&] { return _dom->null(); }); }
  bool boolean(bool value) { return scalar("a boolean", [&] { return _dom->boolean(value); }); }
  bool number_integer(json::number_integer_t value) {
    return scalar("an integer", [&] { return _dom->number_integer(value); });
  }
  bool number_unsigned(json::number_unsigned_t value) {
    if (_fast && _depth == 3 && _fast_open >= 0) {
      _fast_arrays[_fast_open].push_back(value);
      return true;
    }
    return scalar("an integer", [&] { return _dom->number_unsigned(value); });
  }
  bool number_float(json::number_float_t value, const json::string_t& text) {
    return scalar("a floating-point number", [&] { return _dom->number_float(value, text); });
  }
  bool string(json::string_t& value) {
    if (_fast && _depth == 2 && _fast_pending == dtype_slot) {
      _fast_dtype = value;
      _fast_pending = -1;
      return true;
    }
    return scalar("a string", [&] { return _dom->string(value); });
  }
  bool binary(json::binary_t& value) {
    return scalar("binary", [&] { return _dom->binary(value); });
  }

  bool start_object(std::size_t elements) {
    if (!open()) return false;
    if (_depth == 1) return true;  // the header object itself
    if (!_capturing) return true;
    if (_fast) {
      leave_fast();
    } else if (_depth == 2 && !_member_is_metadata) {
      enter_fast();
      return true;
    }
    _keys.emplace_back();
    return _dom->start_object(elements);
  }
  bool start_array(std::size_t elements) {
    if (!open()) return false;
    if (_depth == 1) {
      _top_kind = "an array";
      return true;
    }
    if (!_capturing) return true;
    if (_fast) {
      if (_depth == 3 && (_fast_pending == shape_slot || _fast_pending == offsets_slot)) {
        _fast_open = _fast_pending - shape_slot;
        _fast_pending = -1;
        return true;
      }
      leave_fast();
    }
    _keys.emplace_back();  // an array's keys stay empty: it only keeps the stack in step
    return _dom->start_array(elements);
  }
  bool end_object() {
    if (_fast && _depth == 2) {  // the entry's object: nothing else is open in the fast form
      --_depth;
      finish_fast();
      return true;
    }
    return close([&] { return _dom->end_object(); });
  }
  bool end_array() {
    if (_fast && _depth == 3) {
      --_depth;
      _fast_open = -1;
      return true;
    }
    return close([&] { return _dom->end_array(); });
  }

  bool key(json::string_t& key) {
    if (_depth == 1) return top_key(key);
    if (!_capturing) return true;
    if (_depth == 2) _member_key = key;
    if (_fast) {
      const int slot = slot_of(key);
      if (slot >= 0 && !_fast_has[slot]) {
        _fast_has[slot] = true;
        _fast_order[_fast_keys++] = slot;
        _fast_pending = slot;
        return true;
      }
      leave_fast();  // a key parse_entry() has to judge, or a repeated one (check 7)
    }
    if (!_keys.back().insert(key)) repeated_key(key);
    return _dom->key(key);
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& error) {
    _syntax_error = detail::json_error_text(error);
    return false;
  }

  /// Throws the first fault by the rules' order (checks 5–9); after it returns, entries()
  /// holds every tensor entry in document order.
  void report_faults() {
    if (_syntax_error) fail(_file, fmt::format("header is not valid JSON: {}", *_syntax_error));
    // 6.
    if (_top_kind) {
      fail(_file, fmt::format("header JSON is {}, must be an object of tensors", *_top_kind));
    }
    // 7.
    if (_duplicate) {
      const auto& dup = *_duplicate;
      if (dup.depth == 1) fail(_file, "__metadata__ appears twice");
      if (dup.depth == 2) {
        fail_tensor(_file, dup.owner, fmt::format("key {} appears twice", quote(dup.key)));
      }
      fail_tensor(_file, dup.owner,
                  fmt::format("dtype has key {} twice; a dtype written as an object has "
                              "exactly one key, {{\"F32\": null}}",
                              quote(dup.key)));
    }
    // 8.
    if (_metadata_fault) std::rethrow_exception(_metadata_fault);
    // 9.
    if (_entry_fault) std::rethrow_exception(_entry_fault);
  }

  /// For a hole's message: "" without repeated tensor names, else why the hole is likely
  /// there (the earlier entry of a repeated name is dropped, its bytes unclaimed).
  [[nodiscard]] std::string repeated_note() const {
    if (_repeated_names == 0) return {};
    return fmt::format(" (tensor name {} appears more than once in the header; the last entry "
                       "is used, as the safetensors reference does, so an earlier one's bytes "
                       "belong to no tensor)",
                       quote(_first_repeated));
  }

  /// What the reference ignores and a reader may want to know: entry keys besides dtype,
  /// shape and data_offsets (debug), repeated tensor names (warning). After report_faults().
  void log_notes() const {
    if (_notes.entries_with_unknown_keys != 0) {
      spdlog::debug("{}: {} tensor entr{} keys besides dtype, shape, data_offsets (first: {}); "
                    "ignored, as the safetensors reference ignores them",
                    _file, _notes.entries_with_unknown_keys,
                    _notes.entries_with_unknown_keys == 1 ? "y has" : "ies have", _notes.first);
    }
    if (_repeated_names != 0) {
      spdlog::warn("{}: {} tensor name{} repeated in the header (first: {}); the last entry of "
                   "each is used, as the safetensors reference does",
                   _file, _repeated_names, _repeated_names == 1 ? " is" : "s are",
                   quote(_first_repeated));
    }
  }

  std::vector<Entry>& entries() noexcept { return _entries; }
  std::map<std::string, std::string>& metadata() noexcept { return _metadata; }

 private:
  // Hashes top-level names by their index in `_entries`, which keeps one copy of each name
  // however the vector moves.
  struct NameHash {
    const std::vector<Entry>* entries;
    std::size_t operator()(std::uint32_t i) const noexcept {
      return std::hash<std::string_view>{}((*entries)[i].name);
    }
  };
  struct NameEqual {
    const std::vector<Entry>* entries;
    bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
      return (*entries)[a].name == (*entries)[b].name;
    }
  };

  // The keys of one open object below the top level. Entries have three keys, where a scan
  // of a vector beats a hash set; `__metadata__` may have thousands, where it does not.
  class KeySet {
   public:
    bool insert(const std::string& key) {
      if (!_set.empty()) return _set.insert(key).second;
      if (std::find(_keys.begin(), _keys.end(), key) != _keys.end()) return false;
      _keys.push_back(key);
      if (_keys.size() == 16) {
        _set.insert(std::make_move_iterator(_keys.begin()), std::make_move_iterator(_keys.end()));
        _keys.clear();
      }
      return true;
    }

   private:
    std::vector<std::string> _keys;
    std::unordered_set<std::string> _set;
  };

  bool open() {
    if (_depth == detail::max_json_depth) {
      _syntax_error = fmt::format("more than {} nested arrays and objects (serde_json's "
                                  "recursion limit, which the reference parser uses)",
                                  detail::max_json_depth);
      return false;
    }
    ++_depth;
    return true;
  }

  template <typename EndFn>
  bool close(EndFn end) {
    --_depth;
    if (_depth == 0 || !_capturing) return true;
    _keys.pop_back();
    if (!end()) return false;
    if (_depth == 1) finish_member();
    return true;
  }

  // A scalar: the top-level value itself (check 6), or part of a member's value, or the
  // whole of it.
  template <typename ValueFn>
  bool scalar(std::string_view kind, ValueFn value) {
    if (_depth == 0) {
      _top_kind = kind;
      return true;
    }
    if (!_capturing) return true;
    if (_fast) leave_fast();  // the fast form's own scalars never reach here
    if (!value()) return false;
    if (_depth == 1) finish_member();
    return true;
  }

  bool top_key(const std::string& key) {
    if (_top_kind) return true;  // not an object of tensors: check 6 reports it
    _value = nullptr;
    _dom.emplace(_value, /*allow_exceptions=*/false);
    _capturing = true;
    _keys.clear();
    if (key == "__metadata__") {
      _member_is_metadata = true;
      if (_metadata_seen && !_duplicate) _duplicate = detail::DuplicateKey{key, 1, {}, {}, nullptr};
      _metadata_seen = true;
      return true;
    }
    _member_is_metadata = false;
    _member_key.clear();
    _entries.push_back(Entry{key, Dtype::U8, {}, 0, 0});
    // A repeated name: the reference's map keeps the last entry, yet deserialises each copy.
    // This copy is read into the back of _entries (not in _names) and checked where it
    // stands, then settle_member() moves it over the first copy's slot, so the tensor keeps
    // the place of its first appearance with the last value.
    if (auto [it, inserted] = _names.insert(static_cast<std::uint32_t>(_entries.size() - 1));
        !inserted) {
      _repeat_of = *it;
      if (_repeated_names++ == 0) _first_repeated = key;
    } else {
      _repeat_of = no_repeat;
    }
    return true;
  }

  // The fast form's keys, in parse_entry()'s order.
  static constexpr int dtype_slot = 0;
  static constexpr int shape_slot = 1;
  static constexpr int offsets_slot = 2;
  static constexpr std::array<std::string_view, 3> slot_keys{"dtype", "shape", "data_offsets"};

  static int slot_of(std::string_view key) noexcept {
    for (int slot = 0; slot < 3; ++slot) {
      if (key == slot_keys[slot]) return slot;
    }
    return -1;
  }

  void enter_fast() {
    _fast = true;
    _fast_has = {};
    _fast_keys = 0;
    _fast_pending = -1;
    _fast_open = -1;
    _fast_arrays[0].clear();
    _fast_arrays[1].clear();
  }

  // Replays what the fast form saw into the DOM, as if it had been built all along: the
  // entry's object, its keys so far with their values, an array left open with its elements.
  void leave_fast() {
    _fast = false;
    _keys.emplace_back();
    _dom->start_object(static_cast<std::size_t>(-1));
    for (int i = 0; i < _fast_keys; ++i) {
      const int slot = _fast_order[i];
      std::string key(slot_keys[slot]);
      _keys.back().insert(key);
      _dom->key(key);
      if (slot == _fast_pending) break;  // its value has not begun
      if (slot == dtype_slot) {
        _dom->string(_fast_dtype);
        continue;
      }
      const int array = slot - shape_slot;
      _dom->start_array(static_cast<std::size_t>(-1));
      for (std::uint64_t value : _fast_arrays[array]) _dom->number_unsigned(value);
      if (array == _fast_open) {
        _keys.emplace_back();
        break;  // still open: the events to come fill it
      }
      _dom->end_array();
    }
  }

  // The entry's object ended in the fast form: take it if parse_entry() would, word for word;
  // anything else (a missing key, an unknown dtype, offsets not two) goes to parse_entry().
  void finish_fast() {
    const bool whole = _fast_has[0] && _fast_has[1] && _fast_has[2];
    const auto dtype = whole ? parse_dtype(_fast_dtype) : std::nullopt;
    if (_entry_fault || (dtype && _fast_arrays[1].size() == 2)) {
      _fast = false;
      _capturing = false;
      if (!_entry_fault) {
        Entry& entry = _entries.back();
        entry.dtype = *dtype;
        entry.shape.assign(_fast_arrays[0].begin(), _fast_arrays[0].end());
        entry.begin = _fast_arrays[1][0];
        entry.end = _fast_arrays[1][1];
      }
      settle_member();
      return;
    }
    leave_fast();
    _keys.pop_back();
    _dom->end_object();
    finish_member();
  }

  // A key again in one open object below the top level, classified as the reference's serde
  // types take it (check 7): a struct's field twice (dtype, shape or data_offsets in an
  // entry) or an enum's key twice (a dtype written {"F32":null,"F32":null}; an array entry's
  // first element) is refused; a map keeps the last value (__metadata__'s keys, but an
  // earlier value must still be a string, check 8); what serde ignores (an unknown entry
  // key, anything in its value) may repeat.
  void repeated_key(const std::string& key) {
    if (_member_is_metadata) {
      // At depth 2 the open object is __metadata__ itself, the root of _value, and still
      // holds the earlier value that the DOM builder is about to replace.
      if (_depth != 2 || _metadata_fault || !_value.is_object()) return;
      const auto it = _value.find(key);
      if (it == _value.end() || it->is_string()) return;
      try {
        fail(_file, fmt::format("__metadata__ value of key {} is {} ({}), must be a string",
                                quote(key), detail::json_kind(*it), json_brief(*it)));
      } catch (const Error&) {
        _metadata_fault = std::current_exception();
      }
      return;
    }
    if (_duplicate) return;
    const std::string& owner = _entries.back().name;
    if (_depth == 2 && slot_of(key) >= 0) {
      _duplicate = detail::DuplicateKey{key, 2, owner, {}, nullptr};
    } else if (_depth == 3 && (_member_key == "dtype" || _member_key.empty())) {
      // _member_key empty: the entry is an array, the object one of its elements.
      _duplicate = detail::DuplicateKey{key, 3, owner, _member_key, nullptr};
    }
  }

  // A tensor entry's value is done (taken or judged): a repeated name's copy replaces the
  // first copy's entry and leaves the back of _entries.
  void settle_member() {
    if (_repeat_of == no_repeat) return;
    if (!_entry_fault) _entries[_repeat_of] = std::move(_entries.back());
    _entries.pop_back();
    _repeat_of = no_repeat;
  }

  // The value of a top-level member is complete: check it by its rules.
  void finish_member() {
    _capturing = false;
    if (_member_is_metadata) {
      if (!_metadata_fault) {
        try {
          _metadata = parse_metadata(_file, _value);
        } catch (const Error&) {
          _metadata_fault = std::current_exception();
        }
      }
    } else {
      // After a fault the entries keep only their names: the fault is thrown.
      if (!_entry_fault) {
        try {
          Entry& entry = _entries.back();
          entry = parse_entry(_file, entry.name, _value, _notes);
        } catch (const Error&) {
          _entry_fault = std::current_exception();
        }
      }
      settle_member();
    }
    _value = nullptr;
  }

 private:
  std::string_view _file;
  std::size_t _depth = 0;  // containers open
  std::optional<std::string_view> _top_kind;  // set when the header is not a JSON object
  bool _capturing = false;  // inside a top-level member's value
  bool _member_is_metadata = false;
  static constexpr std::uint32_t no_repeat = static_cast<std::uint32_t>(-1);
  std::uint32_t _repeat_of = no_repeat;  // the first copy's index when the name repeats
  std::size_t _repeated_names = 0;
  std::string _first_repeated;
  std::string _member_key;  // the last key at depth 2 of the current member
  EntryNotes _notes;
  bool _metadata_seen = false;
  // The fast form of the current entry (see the class comment).
  bool _fast = false;
  std::array<bool, 3> _fast_has{};    // by slot
  std::array<int, 3> _fast_order{};   // slots in document order
  int _fast_keys = 0;                 // entries of `_fast_order`
  int _fast_pending = -1;             // the slot whose value comes next, or -1
  int _fast_open = -1;                // 0: inside shape's array, 1: data_offsets', or -1
  std::string _fast_dtype;
  std::array<std::vector<std::uint64_t>, 2> _fast_arrays;  // shape, data_offsets
  json _value;  // the current member's value
  std::optional<nlohmann::detail::json_sax_dom_parser<json>> _dom;  // builds `_value`
  std::vector<KeySet> _keys;  // per open container inside the member's value
  std::vector<Entry> _entries;
  boost::unordered_flat_set<std::uint32_t, NameHash, NameEqual> _names;
  std::map<std::string, std::string> _metadata;
  std::optional<detail::DuplicateKey> _duplicate;  // the first refused repeat (check 7)
  std::optional<std::string> _syntax_error;
  std::exception_ptr _metadata_fault;
  std::exception_ptr _entry_fault;  // the first faulty entry, in document order
};

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view json_text, std::uint64_t data_bytes,
                                           std::string_view file) {
  // 4. The reference runs from_utf8 before JSON parsing, so invalid UTF-8 is its own error
  //    even where the JSON parser would also stop.
  if (auto bad = detail::find_invalid_utf8(json_text)) {
    fail(file, fmt::format("header is not valid UTF-8 (byte 0x{:02x} at header offset {})",
                           static_cast<unsigned char>(json_text[*bad]), *bad));
  }
  // 5–9. A syntax error wins over every later rule; a duplicate key is only reported once the
  //    syntax is known good.
  try {
    detail::expect_json_text(json_text);
  } catch (const detail::JsonSyntaxError& e) {
    fail(file, fmt::format("header is not valid JSON: {}", e.what()));
  }
  std::vector<Entry> entries;
  std::string repeated;  // why a hole may be there (repeated_note)
  SafetensorsHeader header;
  header.header_bytes = json_text.size();
  header.data_bytes = data_bytes;
  {
    HeaderScan scan(file, json_text.size());
    json::sax_parse(json_text.data(), json_text.data() + json_text.size(), &scan);
    scan.report_faults();
    scan.log_notes();
    repeated = scan.repeated_note();
    header.metadata = std::move(scan.metadata());
    entries = std::move(scan.entries());
  }

  // 10–14, tensor by tensor in offset order, as Metadata::validate does. Ties (zero-size
  // tensors at one offset) keep document order, so the result is deterministic.
  const auto by_offsets = [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  };
  // Most writers lay tensors out in header order: then there is nothing to move.
  if (!std::is_sorted(entries.begin(), entries.end(), by_offsets)) {
    std::stable_sort(entries.begin(), entries.end(), by_offsets);
  }
  std::uint64_t expected_begin = 0;
  const Entry* previous = nullptr;
  header.tensors.reserve(entries.size());
  for (auto& entry : entries) {
    // Built only for a message: a million tensors pass here.
    auto offsets = [&] { return fmt::format("data_offsets [{}, {}]", entry.begin, entry.end); };
    // The reference reports both faults as InvalidOffset; "end before begin" is the more
    // precise diagnosis when both hold.
    if (entry.end < entry.begin) fail_tensor(file, entry.name, offsets() + " end before begin");
    if (entry.begin != expected_begin) {
      if (previous == nullptr) {
        fail_tensor(file, entry.name,
                    fmt::format("{} leave a hole: the first tensor must begin at 0{}", offsets(),
                                repeated));
      }
      if (entry.begin < expected_begin) {
        fail_tensor(file, entry.name,
                    fmt::format("{} overlap tensor {}, which ends at {}", offsets(),
                                quote(header.tensors.back().name), expected_begin));
      }
      fail_tensor(file, entry.name,
                  fmt::format("{} leave a hole of {} bytes after tensor {}, which ends at {}{}",
                              offsets(), entry.begin - expected_begin,
                              quote(header.tensors.back().name), expected_begin, repeated));
    }
    std::uint64_t elements = 1;
    for (auto dim : entry.shape) {
      if (__builtin_mul_overflow(elements, dim, &elements)) {
        fail_tensor(file, entry.name,
                    fmt::format("shape {} has more elements than fit in 64 bits",
                                shape_text(entry.shape)));
      }
    }
    std::uint64_t bits = 0;
    if (__builtin_mul_overflow(elements, std::uint64_t{dtype_bits(entry.dtype)}, &bits)) {
      fail_tensor(file, entry.name,
                  fmt::format("shape {} of {} has more bits than fit in 64 bits",
                              shape_text(entry.shape), dtype_name(entry.dtype)));
    }
    if (bits % 8 != 0) {
      fail_tensor(file, entry.name,
                  fmt::format("shape {} of {} is {} elements of {} bits = {} bits, not a whole "
                              "number of bytes",
                              shape_text(entry.shape), dtype_name(entry.dtype), elements,
                              dtype_bits(entry.dtype), bits));
    }
    std::uint64_t bytes = bits / 8;
    if (bytes != entry.end - entry.begin) {
      fail_tensor(file, entry.name,
                  fmt::format("shape {} of {} is {} bytes but {} span {} bytes",
                              shape_text(entry.shape), dtype_name(entry.dtype), bytes, offsets(),
                              entry.end - entry.begin));
    }
    // The name and shape move: the messages above name the previous tensor by its TensorInfo.
    header.tensors.push_back(TensorInfo{std::move(entry.name), entry.dtype,
                                        std::move(entry.shape), 0,
                                        8 + header.header_bytes + entry.begin, bytes});
    expected_begin = entry.end;
    previous = &entry;
  }
  // 15.
  if (expected_begin > data_bytes) {
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Entry& entry = entries[i];
      if (entry.end > data_bytes) {
        fail_tensor(file, header.tensors[i].name,
                    fmt::format("data_offsets [{}, {}] end past the end of the file: the data "
                                "section holds only {} bytes (truncated file?)",
                                entry.begin, entry.end, data_bytes));
      }
    }
  }
  if (expected_begin != data_bytes) {
    fail(file, fmt::format("{} trailing bytes after the last tensor: the tensors end at data "
                           "offset {} but the data section holds {} bytes",
                           data_bytes - expected_begin, expected_begin, data_bytes));
  }
  return header;
}

namespace {

/// Owns a file descriptor for the duration of one header read.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) noexcept : _fd(fd) {}
  ~FileDescriptor() {
    if (_fd >= 0) ::close(_fd);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  [[nodiscard]] int get() const noexcept { return _fd; }

 private:
  int _fd;
};

/// Reads exactly @p size bytes at @p offset, or throws: a short file here means the file
/// changed after fstat, which is an I/O condition, not a format fault.
void read_exact(int fd, char* out, std::size_t size, std::uint64_t offset, std::string_view file) {
  std::size_t done = 0;
  while (done < size) {
    ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw system_error(Errc::io, errno,
                         fmt::format("{}: read of {} bytes at offset {} failed", file,
                                     size - done, offset + done));
    }
    if (got == 0) {
      throw Error(Errc::io, fmt::format("{}: file ended at offset {} while reading {} bytes at "
                                        "offset {} (did it change while being read?)",
                                        file, offset + done, size, offset));
    }
    done += static_cast<std::size_t>(got);
  }
}

std::int64_t nanoseconds(const timespec& time) noexcept {
  return static_cast<std::int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

bool looks_like_text(std::string_view bytes) {
  return !bytes.empty() && std::all_of(bytes.begin(), bytes.end(), [](char c) {
    auto byte = static_cast<unsigned char>(c);
    return (byte >= 0x20 && byte < 0x7F) || c == '\n' || c == '\r' || c == '\t';
  });
}

std::string text_hint(std::string_view first_bytes) {
  if (!looks_like_text(first_bytes)) return {};
  return fmt::format("; the file starts with text ({}), it does not look like a safetensors file",
                     quote(first_bytes));
}

constexpr std::string_view lfs_prefix = "version https://git-lfs";

[[noreturn]] void fail_lfs_pointer(std::string_view file, std::string_view pointer) {
  // The pointer's "size N" line says how big the missing file is; worth showing, since a
  // user may not know the shard was never fetched.
  std::string size_note;
  if (auto at = pointer.find("\nsize "); at != std::string_view::npos) {
    auto digits = pointer.substr(at + 6);
    digits = digits.substr(0, digits.find_first_not_of("0123456789"));
    if (!digits.empty()) size_note = fmt::format(" of {} bytes", digits);
  }
  fail(file, fmt::format("is a Git LFS pointer file, not safetensors data: the real file{} was "
                         "never fetched (run `git lfs pull` in its repository)",
                         size_note));
}

// What a file given as safetensors looks like when its first bytes are another format's
// magic: the message for a header length that fails rule 2 or 3 (a safetensors file whose
// length happens to start "PK\3\4" is still read as one). Empty: none recognised.
std::string foreign_format(std::string_view file, std::string_view first_bytes) {
  const auto convert = fmt::format(
      "convert it with `python -c \"import torch, safetensors.torch as st; "
      "st.save_file(torch.load('{}', map_location='cpu', weights_only=True), "
      "'model.safetensors')\"`",
      file);
  if (first_bytes.starts_with("PK\x03\x04") || first_bytes.starts_with("PK\x05\x06")) {
    return fmt::format("is a zip archive, as torch.save writes a PyTorch .bin/.pt (or numpy "
                       "an .npz), not safetensors; {}",
                       convert);
  }
  if (first_bytes.size() >= 2 && first_bytes[0] == '\x80' && first_bytes[1] >= 2 &&
      first_bytes[1] <= 5) {
    return fmt::format("is a Python pickle (protocol {}), as an older torch.save writes a "
                       "PyTorch .bin/.pt, not safetensors; {}",
                       static_cast<int>(first_bytes[1]), convert);
  }
  if (first_bytes.starts_with("GGUF")) {
    return "is a GGUF file (llama.cpp), not safetensors; weightcast reads safetensors only";
  }
  if (first_bytes.starts_with("\x89HDF\r\n\x1a\n")) {
    return "is an HDF5 file (a Keras/TensorFlow .h5), not safetensors; weightcast reads "
           "safetensors only";
  }
  return {};
}

}  // namespace

SafetensorsHeaderText read_safetensors_header_text(const std::filesystem::path& path,
                                                   std::string_view name) {
  detail::expect_path_without_nul(path, "the safetensors file");
  std::string file = name.empty() ? path.string() : std::string(name);
  FileDescriptor fd(detail::open_input_nonblocking(path));
  if (fd.get() < 0) detail::throw_open_failure(errno, file, "");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw system_error(Errc::io, errno, fmt::format("{}: cannot stat", file));
  }
  if (!S_ISREG(st.st_mode)) {  // A FIFO or a device: reading it could block or never end.
    throw Error(Errc::missing_input, fmt::format("{}: is {}, expected a .safetensors file", file,
                                                 detail::file_type_name(st.st_mode)));
  }
  auto file_bytes = static_cast<std::uint64_t>(st.st_size);

  std::array<char, 8> prefix{};
  std::size_t prefix_bytes = std::min<std::uint64_t>(file_bytes, prefix.size());
  read_exact(fd.get(), prefix.data(), prefix_bytes, 0, file);
  std::string_view first_bytes(prefix.data(), prefix_bytes);
  // A pointer file is ~130 bytes of text; only read further when the first bytes say so.
  if (first_bytes == lfs_prefix.substr(0, 8)) {
    std::string pointer(std::min<std::uint64_t>(file_bytes, 1024), '\0');
    read_exact(fd.get(), pointer.data(), pointer.size(), 0, file);
    if (pointer.starts_with(lfs_prefix)) fail_lfs_pointer(file, pointer);
  }
  // 1.
  if (file_bytes < 8) {
    fail(file, fmt::format("file is {} bytes, shorter than the 8-byte header length{}",
                           file_bytes, text_hint(first_bytes)));
  }
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(prefix[i]);
  }
  if (header_bytes > max_header_bytes || 8 + header_bytes > file_bytes) {
    if (auto what = foreign_format(file, first_bytes); !what.empty()) fail(file, what);
  }
  // 2.
  if (header_bytes > max_header_bytes) {
    fail(file, fmt::format("header length {} is larger than the format's limit of {} bytes{}",
                           header_bytes, max_header_bytes, text_hint(first_bytes)));
  }
  // 3.
  if (8 + header_bytes > file_bytes) {
    fail(file, fmt::format("header length {} runs past the end of the file: 8 + {} > {} bytes "
                           "(truncated file?){}",
                           header_bytes, header_bytes, file_bytes, text_hint(first_bytes)));
  }
  SafetensorsHeaderText text{std::string(header_bytes, '\0'), file_bytes,
                             static_cast<std::uint64_t>(st.st_dev),
                             static_cast<std::uint64_t>(st.st_ino), nanoseconds(st.st_mtim),
                             nanoseconds(st.st_ctim)};
  read_exact(fd.get(), text.json.data(), text.json.size(), 8, file);
  return text;
}

SafetensorsHeader read_safetensors_header(const std::filesystem::path& path, std::string_view name) {
  const SafetensorsHeaderText text = read_safetensors_header_text(path, name);
  SafetensorsHeader header = parse_safetensors_header(
      text.json, text.data_bytes(), name.empty() ? path.string() : std::string(name));
  header.device = text.device;
  header.inode = text.inode;
  header.modified_ns = text.modified_ns;
  header.changed_ns = text.changed_ns;
  return header;
}

}  // namespace weightcast
