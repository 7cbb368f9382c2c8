// `weightcast inspect PATH`: validate a checkpoint and list its tensors.
#include "commands.hpp"

#include "weightcast/checkpoint.hpp"
#include "weightcast/config.hpp"
#include "weightcast/dtype.hpp"
#include "weightcast/log.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

namespace weightcast::cli {
namespace {

// The columns a terminal gives @p text, as fmt counts them when it pads: fmt 9 counts code
// points, and two for the East Asian wide ones (CJK, Hangul, fullwidth forms, emoji). Measured
// through fmt's public API, so the column widths agree with fmt's padding in any version.
std::size_t display_width(std::string_view text) {
  // Padding to a width W at least the text's adds W - width one-byte fill characters; no
  // UTF-8 text is wider than two columns per byte.
  const std::size_t wide = 2 * text.size() + 1;
  return wide + text.size() - fmt::formatted_size("{:<{}}", text, wide);
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
    // Names come from the header: untrusted text (weightcast/log.hpp, printable).
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
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:>{}}  {}\n", row.name, name_width, row.dtype,
               dtype_width, row.shape, shape_width, row.bytes, bytes_width, row.shard);
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);

  const auto tensors = catalogue.tensors.size();
  const auto shards = catalogue.shards.size();
  const auto total = catalogue.total_bytes();
  fmt::print("{} tensor{}, {} shard{}, {} ({} bytes)\n", tensors, tensors == 1 ? "" : "s", shards,
             shards == 1 ? "" : "s", format_bytes(total), total);
  fmt::print("valid\n");
  return 0;
}

}  // namespace weightcast::cli
