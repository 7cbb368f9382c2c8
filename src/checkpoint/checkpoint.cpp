// Opening a checkpoint: what a path holds (a file, an index, a directory of shards or of
// tensor pieces), then the opener that builds its catalogue.
#include "weightcast/checkpoint/checkpoint.hpp"

#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/format/detail/header_json.hpp"
#include "weightcast/checkpoint/detail/catalogue_builder.hpp"
#include "weightcast/checkpoint/detail/index.hpp"
#include "weightcast/checkpoint/detail/pieces.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/safetensors.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <sys/stat.h>

namespace weightcast {

namespace fs = std::filesystem;

std::uint64_t Catalogue::total_bytes() const noexcept {
  std::uint64_t total = 0;
  for (const auto& tensor : tensors) total += tensor.bytes;
  return total;
}

namespace {

using detail::quote;

constexpr std::string_view shard_suffix = ".safetensors";
using detail::index_suffix;

[[noreturn]] void fail(std::string_view file, std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: {}", file, what));
}

bool ends_with(std::string_view text, std::string_view suffix) { return text.ends_with(suffix); }

std::string list_names(const std::vector<std::string>& names) {
  constexpr std::size_t shown = 5;
  std::string text = fmt::format("{}", fmt::join(names.begin(),
                                                 names.begin() + std::min(names.size(), shown),
                                                 ", "));
  if (names.size() > shown) text += fmt::format(", … ({} in all)", names.size());
  return text;
}

/// What a checkpoint path holds, found before any shard is read: an index, one file, or
/// files of pieces, all in `dir`.
struct Located {
  enum class Kind { index, single_file, pieces } kind = Kind::single_file;
  fs::path dir;                     ///< The directory of `files` ("" for a path given alone).
  std::vector<std::string> files;   ///< The index or shard file names, sorted.
};

/// The file to open of a directory: its one index, its one shard, or (with
/// `CheckpointPieces::separate`) its shards as pieces; refuses what is none of them.
Located locate_in_directory(const fs::path& dir, CheckpointPieces pieces) {
  std::vector<std::string> indexes;
  std::vector<std::string> shards;
  // Entries named like a shard or index that are no file: named when nothing else is
  // found, since `ls` shows them and "holds no file" would then read as a mistake.
  std::vector<std::string> not_files;
  // Other formats' weights (a Hugging Face repository downloaded without its safetensors,
  // or one that never had them): named when nothing else is found.
  std::vector<std::string> foreign;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string file = it->path().filename().string();
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) {  // Follows symlinks, as opening will.
      if (ends_with(file, index_suffix) || ends_with(file, shard_suffix)) {
        std::error_code kind_ec;
        const char* kind = it->is_directory(kind_ec) ? "a directory"
                           : it->is_symlink(kind_ec) && !it->exists(kind_ec)
                               ? "a symlink to a missing file"
                               : "not a regular file";
        not_files.push_back(fmt::format("{} is {}", quote(file), kind));
      }
      continue;
    }
    if (ends_with(file, index_suffix)) {
      indexes.push_back(file);
    } else if (ends_with(file, shard_suffix)) {
      shards.push_back(file);
    } else if (ends_with(file, ".bin") || ends_with(file, ".pt") || ends_with(file, ".pth") ||
               ends_with(file, ".bin.index.json")) {
      foreign.push_back(file);
    }
  }
  if (ec) throw system_error(Errc::io, ec.value(), fmt::format("{}: cannot list", dir.string()));
  std::sort(indexes.begin(), indexes.end());
  std::sort(shards.begin(), shards.end());
  if (indexes.size() == 1) return {Located::Kind::index, dir, {indexes.front()}};
  if (indexes.size() > 1) {
    throw Error(Errc::missing_input,
                fmt::format("{}: holds {} index files ({}); pass the path of the one to load",
                            dir.string(), indexes.size(), list_names(indexes)));
  }
  if (shards.size() == 1) {
    // A lone file of a distributed save is one rank's pieces: the DCP reader checks them.
    return {pieces == CheckpointPieces::separate ? Located::Kind::pieces
                                                 : Located::Kind::single_file,
            dir, shards};
  }
  if (shards.empty() && !foreign.empty()) {
    std::sort(foreign.begin(), foreign.end());
    throw Error(Errc::missing_input,
                fmt::format("{}: holds no *{} index and no *{} file, only PyTorch weights ({}), "
                            "which weightcast does not read: convert the checkpoint to "
                            "safetensors (transformers: from_pretrained, then "
                            "save_pretrained(OUT, safe_serialization=True); or "
                            "safetensors.torch.save_file(torch.load(FILE)) per file)",
                            dir.string(), index_suffix, shard_suffix, list_names(foreign)));
  }
  if (shards.empty()) {
    std::sort(not_files.begin(), not_files.end());
    throw Error(Errc::missing_input,
                fmt::format("{}: holds no *{} index and no *{} file{}{}", dir.string(),
                            index_suffix, shard_suffix, not_files.empty() ? "" : " (",
                            not_files.empty() ? "" : list_names(not_files) + ")"));
  }
  if (pieces == CheckpointPieces::separate) return {Located::Kind::pieces, dir, shards};
  // torch DCP's sharded save: each file places its pieces in __metadata__, and no index.
  bool dcp_pieces = false;
  for (const auto& shard : shards) {
    try {
      const auto header = read_safetensors_header(dir / shard);
      auto found = header.metadata.find(std::string(detail::sharding_info_key));
      dcp_pieces = found != header.metadata.end() && !found->second.empty();
    } catch (const Error&) {
      // Named by the message below either way; a load of that file would report the fault.
    }
    if (dcp_pieces) break;
  }
  if (dcp_pieces) {
    throw Error(Errc::missing_input,
                fmt::format("{}: holds {} .safetensors files ({}) of tensors in pieces, as torch "
                            "DCP's HuggingFaceStorageWriter(save_distributed=True) writes them "
                            "(__metadata__ '{}'), and no index: load it with dcp.load and "
                            "weightcast.dcp.HuggingFaceStorageReader, or consolidate it first "
                            "(torch.distributed.checkpoint's consolidate_safetensors_files)",
                            dir.string(), shards.size(), list_names(shards),
                            detail::sharding_info_key));
  }
  throw Error(Errc::missing_input,
              fmt::format("{}: holds {} .safetensors files ({}) but no *{} to say how they form "
                          "one checkpoint; pass one file, or add an index",
                          dir.string(), shards.size(), list_names(shards), index_suffix));
}

}  // namespace

Catalogue open_checkpoint(const fs::path& path, CheckpointPieces pieces) {
  // Else the message would read ": no such file".
  if (path.empty()) throw Error(Errc::missing_input, "checkpoint path is empty");
  detail::expect_path_without_nul(path, "the checkpoint");
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (!fs::exists(status)) {
    // The real reason where there is one other than absence: "Not a directory" for a/b where
    // a is a file, a symlink loop, "Permission denied" for a directory that cannot be searched.
    detail::throw_open_failure(ec ? ec.value() : ENOENT, path.string(), "the checkpoint");
  }
  Located located;
  if (fs::is_directory(status)) {
    located = locate_in_directory(path, pieces);
  } else {
    located.kind = path.extension() == ".json"            ? Located::Kind::index
                   : pieces == CheckpointPieces::separate ? Located::Kind::pieces
                                                          : Located::Kind::single_file;
    located.dir = path.parent_path();
    located.files = {path.filename().string()};
  }
  // One place opens what was found: the index, the file or the pieces.
  switch (located.kind) {
    case Located::Kind::index:
      return detail::open_index(fs::is_directory(status) ? located.dir / located.files.front()
                                                         : path);
    case Located::Kind::pieces:
      return detail::open_pieces(located.dir, located.files);
    case Located::Kind::single_file:
      break;
  }
  return detail::open_single_file(fs::is_directory(status) ? located.dir / located.files.front()
                                                          : path);
}

}  // namespace weightcast
