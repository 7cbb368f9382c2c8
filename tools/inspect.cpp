// `weightcast inspect PATH`: validate a checkpoint and list its tensors.
#include "commands.hpp"

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/core/detail/plural.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/core/log.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <utf8proc.h>

#include <algorithm>
#include <string>
#include <vector>

namespace weightcast::cli {
namespace {

// The columns a terminal gives @p text: each code point's width from utf8proc (Unicode's
// East Asian Width and emoji presentation: 2 for CJK and 🚀, 0 for combining marks and
// zero-width characters), summed as wcwidth-style terminals do. fmt's own estimate, which
// its padding uses, knows only some wide ranges and counts a combining mark as a column.
std::size_t display_width(std::string_view text) {
  std::size_t columns = 0;
  const auto* bytes = reinterpret_cast<const utf8proc_uint8_t*>(text.data());
  auto left = static_cast<utf8proc_ssize_t>(text.size());
  while (left > 0) {
    utf8proc_int32_t code_point = 0;
    const utf8proc_ssize_t used = utf8proc_iterate(bytes, left, &code_point);
    if (used <= 0) {  // not UTF-8 (printable() has escaped such bytes): a column each
      ++columns;
      ++bytes;
      --left;
      continue;
    }
    columns += static_cast<std::size_t>(std::max(0, utf8proc_charwidth(code_point)));
    bytes += used;
    left -= used;
  }
  return columns;
}

// @p text and spaces after it to @p columns columns (by display_width, not fmt's padding).
std::string pad_right(std::string_view text, std::size_t columns) {
  std::string out(text);
  const std::size_t width = display_width(text);
  if (width < columns) out.append(columns - width, ' ');
  return out;
}

// Metadata values can be long (a whole config serialised into one string): one line each,
// cut at a UTF-8 boundary.
std::string brief_value(const std::string& value) {
  constexpr std::size_t max_bytes = 200;
  std::string text = printable(value);
  if (text.size() <= max_bytes) return text;
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  text.resize(cut);
  return fmt::format("{}… ({} bytes)", text, value.size());
}

}  // namespace

int inspect(const InspectArgs& args) {
  // open_checkpoint runs every validation rule; an Error propagates to main, which prints
  // it and exits with its sysexits status.
  const Catalogue catalogue = open_checkpoint(args.path);

  struct Row {
    std::string name;  // printable: header text is untrusted
    std::string_view dtype;
    std::string shape;
    std::string bytes;
    std::string shard;
  };
  std::vector<Row> rows;
  rows.reserve(catalogue.tensors.size());
  Row header{"NAME", "DTYPE", "SHAPE", "BYTES", "SHARD"};
  std::size_t name_width = display_width(header.name);
  std::size_t dtype_width = display_width(header.dtype);
  std::size_t shape_width = display_width(header.shape);
  std::size_t bytes_width = display_width(header.bytes);
  for (const auto& tensor : catalogue.tensors) {
    // Names come from the header: untrusted text (weightcast/core/log.hpp, printable).
    Row row{printable(tensor.name), dtype_name(tensor.dtype),
            fmt::format("[{}]", fmt::join(tensor.shape, ", ")), fmt::format("{}", tensor.bytes),
            printable(catalogue.shards[tensor.shard].name)};
    name_width = std::max(name_width, display_width(row.name));
    dtype_width = std::max(dtype_width, display_width(row.dtype));
    shape_width = std::max(shape_width, display_width(row.shape));
    bytes_width = std::max(bytes_width, display_width(row.bytes));
    rows.push_back(std::move(row));
  }
  auto print_row = [&](const Row& row) {
    fmt::print("{}  {}  {}  {:>{}}  {}\n", pad_right(row.name, name_width),
               pad_right(row.dtype, dtype_width), pad_right(row.shape, shape_width), row.bytes,
               bytes_width, row.shard);
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);

  // `__metadata__` (every shard's, merged: the first shard wins on a repeated key).
  if (!catalogue.metadata.empty()) {
    std::size_t key_width = 0;
    for (const auto& [key, value] : catalogue.metadata) {
      key_width = std::max(key_width, display_width(printable(key)));
    }
    fmt::print("__metadata__ ({}):\n", detail::counted(catalogue.metadata.size(), "key"));
    for (const auto& [key, value] : catalogue.metadata) {
      fmt::print("  {}  {}\n", pad_right(printable(key), key_width), brief_value(value));
    }
  }

  const auto tensors = catalogue.tensors.size();
  const auto shards = catalogue.shards.size();
  const auto total = catalogue.total_bytes();
  fmt::print("{}, {}, {} ({})\n", detail::counted(tensors, "tensor"),
             detail::counted(shards, "shard"), format_bytes(total), detail::counted(total, "byte"));
  fmt::print("valid\n");
  return 0;
}

}  // namespace weightcast::cli
