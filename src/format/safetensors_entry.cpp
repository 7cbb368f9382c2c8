// The rules for one safetensors header entry and for `__metadata__` (checks 8 and 9 of
// safetensors.hpp), with their messages: every path that accepts or refuses an entry, fast or
// not, ends in these functions.
#include "weightcast/format/detail/safetensors_rules.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/format/detail/header_json.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

namespace weightcast::detail::safetensors {

using nlohmann::json;

namespace {

std::string known_dtypes() {
  std::string names;
  for (std::size_t i = 0; i < dtype_count; ++i) {
    if (i != 0) names += ", ";
    names += dtype_name(static_cast<Dtype>(i));
  }
  return names;
}

}  // namespace

[[noreturn]] void fail(std::string_view file, std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: {}", file, what));
}

[[noreturn]] void fail_tensor(std::string_view file, std::string_view tensor,
                              std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: tensor {}: {}", file, quote(tensor), what));
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

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

}  // namespace weightcast::detail::safetensors
