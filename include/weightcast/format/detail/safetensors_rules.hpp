/**
 * @file safetensors_rules.hpp
 * @brief Internal: the pieces parse_safetensors_header() is built from, one source each —
 *        the rules for one header entry and for `__metadata__` (checks 8 and 9,
 *        safetensors_entry.cpp) and the one pass over the header's JSON that applies them
 *        (checks 5–9, safetensors_scan.cpp). The check numbers are safetensors.hpp's.
 */
#pragma once

#include "weightcast/format/dtype.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::detail::safetensors {

/// @throws Error `invalid_checkpoint` (65): "<file>: <what>".
[[noreturn]] void fail(std::string_view file, std::string_view what);

/// @throws Error `invalid_checkpoint` (65): "<file>: tensor '<tensor>': <what>" (the name
///         quoted by detail::quote()).
[[noreturn]] void fail_tensor(std::string_view file, std::string_view tensor,
                              std::string_view what);

/// @return @p shape as messages show it: "[4, 3]".
std::string shape_text(const std::vector<std::uint64_t>& shape);

/// One header entry after check 9, before the offset rules (10–15).
struct Entry {
  std::string name;                  ///< The tensor's name (the entry's key).
  Dtype dtype;                       ///< Its dtype.
  std::vector<std::uint64_t> shape;  ///< Its shape, elements per dimension.
  std::uint64_t begin;               ///< data_offsets[0], bytes into the data section.
  std::uint64_t end;                 ///< data_offsets[1], bytes into the data section.
};

/// What parse_entry() saw that the format does not define and the reference ignores.
struct EntryNotes {
  std::size_t entries_with_unknown_keys = 0;  ///< Entries with keys besides the three.
  std::string first;                          ///< The first such key: "tensor 'w' key 'extra'".
};

/**
 * @brief Check 9 for one entry, as the reference deserialises its `TensorInfo` (a serde
 *        struct without deny_unknown_fields): an object with dtype, shape and data_offsets,
 *        where keys besides those are ignored (counted in @p notes), or, as serde also reads
 *        a struct, an array of those three values in that order.
 * @throws Error `invalid_checkpoint` (65) naming @p file, the tensor and the faulty value.
 */
Entry parse_entry(std::string_view file, const std::string& name, const nlohmann::json& value,
                  EntryNotes& notes);

/**
 * @brief Check 8: `__metadata__` is null (the MLX writer emits null) or an object of strings.
 * @return its keys and values; empty for null.
 * @throws Error `invalid_checkpoint` (65) naming @p file and the faulty key.
 */
std::map<std::string, std::string> parse_metadata(std::string_view file,
                                                  const nlohmann::json& value);

/// What scan_header() found: the header's entries and metadata, checks 5–9 passed.
struct ScannedHeader {
  std::vector<Entry> entries;                   ///< Every tensor entry, document order.
  std::map<std::string, std::string> metadata;  ///< `__metadata__`, empty when absent/null.
  /// For a hole's message: "" without repeated tensor names, else why the hole is likely
  /// there (the earlier entry of a repeated name is dropped, its bytes unclaimed).
  std::string repeated_note;
};

/**
 * @brief Checks 5–9 over the header's JSON text in one pass, without a DOM of the whole
 *        header; logs what the reference ignores (keys besides the three, at debug) and
 *        repeated tensor names (a warning).
 * @param json_text the header, already checked to be UTF-8 (check 4) and to pass
 *        detail::expect_json_text().
 * @param file the file name used in messages.
 * @throws Error `invalid_checkpoint` (65) for the first fault by the rules' order: a syntax
 *         error, then 6, 7, 8, then the first faulty entry in document order.
 */
ScannedHeader scan_header(std::string_view json_text, std::string_view file);

}  // namespace weightcast::detail::safetensors
