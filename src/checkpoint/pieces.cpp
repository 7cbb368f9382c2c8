#include "weightcast/checkpoint/detail/pieces.hpp"

#include "weightcast/checkpoint/detail/catalogue_builder.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/format/detail/header_json.hpp"
#include "weightcast/format/dtype.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace weightcast::detail {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void fail(std::string_view where, std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: {}", where, what));
}

/// Each tensor's offsets in its whole tensor, from the file's `DCP_SHARDING_INFO` (zeros
/// when the file has none), in the order of `header.tensors`.
std::vector<std::vector<std::uint64_t>> saved_offsets(const SafetensorsHeader& header,
                                                      const std::string& file) {
  std::vector<std::vector<std::uint64_t>> offsets;
  offsets.reserve(header.tensors.size());
  auto found = header.metadata.find(std::string(sharding_info_key));
  // An empty value places nothing, as torch's reader takes it (it tests the value's truth).
  if (found == header.metadata.end() || found->second.empty()) {
    for (const auto& tensor : header.tensors) offsets.emplace_back(tensor.shape.size(), 0);
    return offsets;
  }
  const json info = json::parse(found->second, nullptr, /*allow_exceptions=*/false);
  if (!info.is_object()) {
    fail(file, fmt::format("__metadata__ key '{}' is not a JSON object (torch DCP writes "
                           "{{\"NAME\": {{\"saved_offsets\": [...]}}}})",
                           sharding_info_key));
  }
  for (const auto& tensor : header.tensors) {
    const std::string where = fmt::format("{}: tensor {}: __metadata__ key '{}'", file,
                                          quote(tensor.name), sharding_info_key);
    auto entry = info.find(tensor.name);
    if (entry == info.end()) fail(where, "has no entry for this tensor");
    const json* saved = entry->is_object() && entry->contains("saved_offsets")
                            ? &(*entry)["saved_offsets"]
                            : nullptr;
    if (saved == nullptr || !saved->is_array()) {
      fail(where, "gives it no \"saved_offsets\" array");
    }
    if (saved->size() != tensor.shape.size()) {
      fail(where, fmt::format("gives it {} saved_offsets for {} dims", saved->size(),
                              tensor.shape.size()));
    }
    std::vector<std::uint64_t> offset;
    for (const json& value : *saved) {
      // JSON's -0 is an integer 0 to Python's json, as torch reads it.
      const bool minus_zero = value.is_number_integer() && !value.is_number_unsigned() &&
                              value.get<std::int64_t>() == 0;
      if (!value.is_number_unsigned() && !minus_zero) {
        fail(where, fmt::format("saved_offsets {} are not all non-negative integers "
                                "(no fraction, exponent or sign)",
                                saved->dump()));
      }
      offset.push_back(minus_zero ? 0 : value.get<std::uint64_t>());
    }
    offsets.push_back(std::move(offset));
  }
  return offsets;
}

std::string piece_text(const std::vector<std::uint64_t>& offset, std::string_view file) {
  return fmt::format("the piece at [{}] in {}", fmt::join(offset, ", "), quote(file));
}

}  // namespace

Catalogue open_pieces(const fs::path& dir, const std::vector<std::string>& files) {
  // Messages name the directory, or the one file read.
  const std::string place = files.size() == 1 ? (dir / files.front()).string() : dir.string();
  CatalogueBuilder builder;
  std::vector<std::vector<std::uint64_t>> offsets;
  for (const auto& file : files) {
    const fs::path path = dir / file;
    const std::string name = path.string();
    const SafetensorsHeader& header = builder.add_shard(path, name, file);
    for (auto& offset : saved_offsets(header, name)) offsets.push_back(std::move(offset));
  }
  Catalogue catalogue = builder.take();

  // The pieces of each tensor, in catalogue order (so the first fault reported is stable).
  std::unordered_map<std::string_view, std::vector<std::size_t>> pieces_of;
  std::vector<std::string_view> names;
  for (std::size_t i = 0; i < catalogue.tensors.size(); ++i) {
    auto [it, fresh] = pieces_of.try_emplace(catalogue.tensors[i].name);
    if (fresh) names.push_back(it->first);
    it->second.push_back(i);
  }

  catalogue.pieces.resize(catalogue.tensors.size());
  std::vector<std::string> entry_names(catalogue.tensors.size());
  std::vector<char> keep(catalogue.tensors.size(), 0);
  for (std::string_view name : names) {
    const auto& pieces = pieces_of.at(name);
    const TensorInfo& first = catalogue.tensors[pieces.front()];
    const std::string where = fmt::format("{}: tensor {}", place, quote(name));
    auto file_of = [&](std::size_t i) -> const std::string& {
      return catalogue.shards[catalogue.tensors[i].shard].name;
    };
    std::vector<std::uint64_t> global(first.shape.size(), 0);
    unsigned __int128 stored = 0;
    for (std::size_t i : pieces) {
      const TensorInfo& piece = catalogue.tensors[i];
      if (piece.dtype != first.dtype) {
        fail(where, fmt::format("{} is {}, {} {}", piece_text(offsets[pieces.front()],
                                                              file_of(pieces.front())),
                                dtype_name(first.dtype),
                                piece_text(offsets[i], file_of(i)), dtype_name(piece.dtype)));
      }
      if (piece.shape.size() != first.shape.size()) {
        fail(where, fmt::format("{} has {} dims, {} {}",
                                piece_text(offsets[pieces.front()], file_of(pieces.front())),
                                first.shape.size(), piece_text(offsets[i], file_of(i)),
                                piece.shape.size()));
      }
      if (pieces.size() > 1 && dtype_bits(piece.dtype) < 8) {
        fail(where, fmt::format("is stored in {} pieces of {}, a sub-byte dtype whose pieces "
                                "cannot be placed element by element",
                                pieces.size(), dtype_name(piece.dtype)));
      }
      unsigned __int128 elements = 1;
      for (std::size_t d = 0; d < piece.shape.size(); ++d) {
        if (offsets[i][d] > std::numeric_limits<std::uint64_t>::max() - piece.shape[d]) {
          fail(where, fmt::format("{} ends past 2^64 in dim {}", piece_text(offsets[i], file_of(i)),
                                  d));
        }
        global[d] = std::max(global[d], offsets[i][d] + piece.shape[d]);
        elements *= piece.shape[d];
      }
      stored += elements;
    }
    // Pieces may not overlap: a loader reading by position would get two values.
    auto empty = [&](std::size_t i) {
      const auto& shape = catalogue.tensors[i].shape;
      return std::find(shape.begin(), shape.end(), 0) != shape.end();
    };
    for (std::size_t a = 0; a < pieces.size(); ++a) {
      for (std::size_t b = a + 1; b < pieces.size(); ++b) {
        const std::size_t i = pieces[a];
        const std::size_t j = pieces[b];
        if (empty(i) || empty(j)) continue;
        bool overlap = true;
        for (std::size_t d = 0; d < global.size() && overlap; ++d) {
          overlap = std::max(offsets[i][d], offsets[j][d]) <
                    std::min(offsets[i][d] + catalogue.tensors[i].shape[d],
                             offsets[j][d] + catalogue.tensors[j].shape[d]);
        }
        if (overlap) {
          fail(where, fmt::format("{} (shape [{}]) and {} (shape [{}]) overlap",
                                  piece_text(offsets[i], file_of(i)),
                                  fmt::join(catalogue.tensors[i].shape, ", "),
                                  piece_text(offsets[j], file_of(j)),
                                  fmt::join(catalogue.tensors[j].shape, ", ")));
        }
      }
    }
    // Disjoint pieces inside the box they span fill it exactly when their elements add up.
    unsigned __int128 spanned = 1;
    for (auto extent : global) {
      // torch holds sizes as int64: DCP's metadata could not carry a larger extent.
      if (extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        fail(where, fmt::format("its pieces span shape [{}], an extent over 2^63 - 1 (torch's "
                                "int64 sizes)",
                                fmt::join(global, ", ")));
      }
      spanned *= extent;
      if (spanned > std::numeric_limits<std::uint64_t>::max()) {
        fail(where, fmt::format("its pieces span shape [{}], over 2^64 elements",
                                fmt::join(global, ", ")));
      }
    }
    if (stored != spanned) {
      fail(where, fmt::format("its {} piece(s) hold {} of the {} elements of the shape [{}] "
                              "they span: the rest is in no file",
                              pieces.size(), static_cast<std::uint64_t>(stored),
                              static_cast<std::uint64_t>(spanned), fmt::join(global, ", ")));
    }
    // Empty pieces hold no byte (torch.chunk leaves trailing ranks none): dropped, unless the
    // whole tensor is empty, when its first piece stands for it.
    std::vector<std::size_t> kept;
    for (std::size_t i : pieces) {
      if (!empty(i)) kept.push_back(i);
    }
    if (kept.empty()) kept.push_back(pieces.front());
    const bool whole = kept.size() == 1;  // One piece filling its span starts at zero.
    for (std::size_t i : kept) {
      keep[i] = 1;
      entry_names[i] = whole ? std::string(name)
                             : fmt::format("{} [piece at {}]", name, fmt::join(offsets[i], ", "));
      catalogue.pieces[i] = PieceInfo{std::string(name), whole ? std::vector<std::uint64_t>(
                                                                     global.size(), 0)
                                                               : offsets[i],
                                      global};
    }
  }

  std::unordered_map<std::string_view, std::size_t> taken;
  for (std::size_t i = 0; i < entry_names.size(); ++i) {
    if (!keep[i]) continue;
    auto [it, fresh] = taken.try_emplace(entry_names[i], i);
    if (!fresh) {
      const std::size_t piece = catalogue.pieces[i].tensor != entry_names[i] ? i : it->second;
      fail(place, fmt::format("{} names both a tensor stored whole and a piece of tensor {}; "
                              "the two cannot be told apart (rename the tensor)",
                              quote(entry_names[i]), quote(catalogue.pieces[piece].tensor)));
    }
  }
  Catalogue kept;
  kept.shards = std::move(catalogue.shards);
  kept.metadata = std::move(catalogue.metadata);
  for (std::size_t i = 0; i < entry_names.size(); ++i) {
    if (!keep[i]) continue;
    catalogue.tensors[i].name = std::move(entry_names[i]);
    kept.tensors.push_back(std::move(catalogue.tensors[i]));
    kept.pieces.push_back(std::move(catalogue.pieces[i]));
  }
  return kept;
}

}  // namespace weightcast::detail
