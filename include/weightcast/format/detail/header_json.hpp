/**
 * @file header_json.hpp
 * @brief Internal: strict JSON parsing shared by the safetensors header and index parsers.
 *
 * nlohmann::json keeps the last of two equal keys silently; the safetensors rules (and the
 * index rules) want a repeated name reported, so the parse records keys per object through
 * the parser callback. It also records the document order of one object's keys, so that
 * "the first faulty entry" means the first one a person reading the file would see.
 */
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::detail {

/// The deepest nesting of arrays and objects accepted: serde_json's recursion limit, which
/// the reference implementation parses headers with (`serde_json::from_str`: 128 levels, the
/// 128th open container is refused). It also keeps every later walk of the DOM shallow.
inline constexpr std::size_t max_json_depth = 127;

/// A key that appeared again in one JSON object.
struct DuplicateKey {
  std::string key;    ///< The repeated key.
  int depth = 0;      ///< 1 for a key of the top-level object, 2 for one level below…
  std::string owner;  ///< The top-level key whose value holds the object (empty at depth 1).
  /// At depth 3 and deeper: the depth-2 key whose value holds the object (`dtype` for
  /// `{"w":{"dtype":{"F32":null,"F32":null}}}`); empty above.
  std::string member;
  /// At depth 1 and 2: the value the repeated key had before this repetition, which the
  /// DOM replaced by the later one (nlohmann keeps the last of equal keys, as serde's maps
  /// do); null deeper. The safetensors reference deserialises every copy, so a caller can
  /// check the earlier ones too.
  nlohmann::json earlier;
};

/// A JSON syntax error; `what()` is one line without nlohmann's "[json.exception…]" prefix.
class JsonSyntaxError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// @return nlohmann's message for @p error as one line, without its "[json.exception…] "
///         prefix (the text a JsonSyntaxError carries).
std::string json_error_text(const std::exception& error);

/// Result of `parse_json_strict`.
struct JsonDocument {
  nlohmann::json value;                  ///< The parsed document.
  std::optional<DuplicateKey> duplicate;  ///< The first repeated key, in document order.
  std::vector<DuplicateKey> duplicates;   ///< Every repetition, document order (front: the same as duplicate).
  std::vector<std::string> ordered_keys;  ///< Keys of the recorded object, document order.
};

/**
 * @brief Parses @p text as JSON, recording duplicate keys instead of dropping them.
 *
 * @param text the JSON text (already checked to be UTF-8).
 * @param ordered_member empty to record the top-level object's keys in document order;
 *        otherwise the name of a top-level member whose object's keys are recorded.
 * @throws JsonSyntaxError on a syntax error, including a NUL byte anywhere (nlohmann's lexer
 *         takes NUL for the end of input and would accept `{}\0garbage`; serde_json, the
 *         reference, rejects it) and a leading UTF-8 byte-order mark (nlohmann skips it;
 *         serde_json and Python's json refuse it). A syntax error wins over a duplicate key,
 *         which is only reported by the caller after a successful parse.
 */
JsonDocument parse_json_strict(std::string_view text, std::string_view ordered_member = {});

/**
 * @brief Refuses what serde_json refuses and nlohmann's parser would accept at the level of
 *        raw bytes: a NUL byte anywhere, and a leading UTF-8 byte-order mark.
 *
 * parse_json_strict() runs it first; a caller that parses with its own SAX handler (the
 * safetensors header scan) runs it before that parse.
 * @throws JsonSyntaxError naming the offset of the NUL byte, or the byte-order mark.
 */
void expect_json_text(std::string_view text);

/// @return the offset of the first byte of @p text that is not part of valid UTF-8
///         (overlong forms, surrogates and code points past U+10FFFF are invalid, as in
///         Rust's `str::from_utf8`), or nullopt if @p text is valid.
std::optional<std::size_t> find_invalid_utf8(std::string_view text) noexcept;

/// @return @p text in single quotes for a one-line message, control characters escaped;
///         text over 256 bytes is cut there (at a UTF-8 boundary) and ends `…' (N bytes)`.
std::string quote(std::string_view text);

/// @return @p value as an unsigned integer if it is a non-negative JSON integer
///         (never a float, even 0.0, and never `-0`: serde_json, the reference's parser,
///         reads `-0` as a float and refuses it for a shape or an offset).
std::optional<std::uint64_t> json_unsigned(const nlohmann::json& value) noexcept;

/// @return the JSON type of @p value with its article, for messages: "an array", "an
///         integer", "a floating-point number"; "null" for null.
std::string_view json_kind(const nlohmann::json& value) noexcept;

/// @return a short one-line rendering of @p value for messages ("[4, 3]", "\"F7\""), cut to
///         160 bytes (backing off to a UTF-8 character boundary) and "…" (an array stops at
///         the element that passes 160).
std::string json_brief(const nlohmann::json& value);

}  // namespace weightcast::detail
