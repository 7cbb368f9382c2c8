// The safetensors header parser's entry points: checks 4–15 of safetensors.hpp over a
// header's text (UTF-8, then the JSON scan of safetensors_scan.cpp, then the layout of the
// data section tensor by tensor), and the read of a file's header followed by that parse.
#include "weightcast/format/safetensors.hpp"

#include "weightcast/format/detail/safetensors_rules.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/detail/header_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <vector>

namespace weightcast {

using detail::quote;
using detail::safetensors::Entry;
using detail::safetensors::fail;
using detail::safetensors::fail_tensor;
using detail::safetensors::scan_header;
using detail::safetensors::ScannedHeader;
using detail::safetensors::shape_text;

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
  SafetensorsHeader header;
  header.header_bytes = json_text.size();
  header.data_bytes = data_bytes;
  ScannedHeader scanned = scan_header(json_text, file);
  header.metadata = std::move(scanned.metadata);
  std::vector<Entry>& entries = scanned.entries;
  const std::string& repeated = scanned.repeated_note;  // why a hole may be there

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
