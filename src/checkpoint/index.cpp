// A sharded checkpoint's index (`*.safetensors.index.json`): its bytes, its rules, and the
// catalogue of the shards it names.
#include "weightcast/checkpoint/detail/index.hpp"

#include "weightcast/checkpoint/detail/catalogue_builder.hpp"
#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/detail/regular_file.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/detail/header_json.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <sys/stat.h>
#include <unordered_map>

namespace weightcast {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using detail::index_suffix;
using detail::quote;

// Real indexes are a few MB (35,743 entries is 3.7 MB); anything near this is not an index.
constexpr std::uint64_t max_index_bytes = 1ull << 30;

[[noreturn]] void fail(std::string_view file, std::string_view what) {
  throw Error(Errc::invalid_checkpoint, fmt::format("{}: {}", file, what));
}

std::string read_whole_file(const fs::path& path, const std::string& name) {
  detail::expect_path_without_nul(path, "the index");
  const std::string expected = fmt::format("expected a {} index file", index_suffix);
  const detail::RegularFileNames names{name, "", expected, Errc::missing_input};
  const detail::OpenRegularFile file = detail::open_regular_file(path, names);
  // Refused by its size before a byte is read: a file this large is not an index.
  if (static_cast<std::uint64_t>(file.st.st_size) > max_index_bytes) {
    fail(name, fmt::format("index is {} bytes, too large to be a safetensors index",
                           file.st.st_size));
  }
  // A file that shrank since fstat(2) is parsed as it is: the JSON parse says if it was cut.
  std::string text = detail::read_to_end(file.fd, static_cast<std::uint64_t>(file.st.st_size),
                                         max_index_bytes, path, names);
  if (text.size() > max_index_bytes) {
    fail(name, fmt::format("index grew past {} bytes while read, too large to be a safetensors "
                           "index",
                           max_index_bytes));
  }
  return text;
}

/// True when @p path lies strictly below @p dir (both absolute and normalised).
bool is_inside(const fs::path& dir, const fs::path& path) {
  auto dir_it = dir.begin();
  auto path_it = path.begin();
  for (; dir_it != dir.end(); ++dir_it, ++path_it) {
    if (dir_it->empty()) continue;  // A trailing separator of the directory.
    if (path_it == path.end() || *dir_it != *path_it) return false;
  }
  for (; path_it != path.end(); ++path_it) {
    if (!path_it->empty()) return true;
  }
  return false;
}

/// True for the Hugging Face hub cache layout: the checkpoint directory is
/// `<repo>/snapshots/<revision>`, the shard entry is a plain file name, and its symlink
/// resolves into `<repo>/blobs`. The index cannot steer such a link (it names only the
/// entry); the hub client made it, and refusing it would refuse every cached model.
bool is_hub_blob(const fs::path& dir_canonical, const fs::path& relative,
                 const fs::path& resolved) {
  if (std::distance(relative.begin(), relative.end()) != 1) return false;
  const fs::path snapshots = dir_canonical.parent_path();
  if (snapshots.filename() != "snapshots") return false;
  return is_inside(snapshots.parent_path() / "blobs", resolved);
}

}  // namespace

namespace detail {

std::string read_index_text(const fs::path& index_path, const std::string& name) {
  return read_whole_file(index_path, name.empty() ? index_path.string() : name);
}

std::vector<IndexEntry> read_index(const fs::path& index_path, const std::string& name_arg) {
  const std::string name = name_arg.empty() ? index_path.string() : name_arg;
  const std::string text = read_whole_file(index_path, name);
  if (auto bad = find_invalid_utf8(text)) {
    fail(name, fmt::format("index is not valid UTF-8 (byte 0x{:02x} at offset {})",
                           static_cast<unsigned char>(text[*bad]), *bad));
  }
  JsonDocument doc;
  try {
    doc = parse_json_strict(text, "weight_map");
  } catch (const JsonSyntaxError& e) {
    fail(name, fmt::format("index is not valid JSON: {}", e.what()));
  }
  if (!doc.value.is_object()) {
    fail(name, fmt::format("index JSON is {}, must be an object with a 'weight_map'",
                           detail::json_kind(doc.value)));
  }
  auto map_it = doc.value.find("weight_map");
  if (map_it == doc.value.end()) fail(name, "index has no 'weight_map' key");
  if (!map_it->is_object()) {
    fail(name, fmt::format("index key 'weight_map' is {}, must be an object mapping tensor "
                           "name to shard file",
                           detail::json_kind(*map_it)));
  }
  if (map_it->empty()) {
    // Nothing to load, though the shards may sit beside it: a load of zero tensors would
    // report success. transformers' loader finds no shard to open either.
    fail(name, "index key 'weight_map' is empty: it names no tensor and no shard");
  }
  if (doc.duplicate) {
    const auto& dup = *doc.duplicate;
    if (dup.depth == 2 && dup.owner == "weight_map") {
      fail(name, fmt::format("weight_map entry {} appears twice", quote(dup.key)));
    }
    fail(name, fmt::format("key {} appears twice{}", quote(dup.key),
                           dup.owner.empty() ? std::string() : " in " + quote(dup.owner)));
  }

  std::error_code ec;
  fs::path dir = index_path.parent_path();
  if (dir.empty()) dir = ".";
  const fs::path dir_canonical = fs::canonical(dir, ec);
  if (ec) {
    throw Error(Errc::missing_input,
                fmt::format("{}: cannot resolve the checkpoint directory: {}", name, ec.message()));
  }

  // Shards repeat across thousands of entries; resolve each spelling once.
  std::unordered_map<std::string, fs::path> resolved_shards;
  std::vector<IndexEntry> entries;
  entries.reserve(doc.ordered_keys.size());
  const json& weight_map = *map_it;
  for (const auto& tensor : doc.ordered_keys) {
    const json& value = weight_map[tensor];
    auto where = fmt::format("{}: weight_map entry {}", name, quote(tensor));
    if (!value.is_string()) {
      throw Error(Errc::invalid_checkpoint,
                  fmt::format("{}: shard is {} ({}), must be a file name string", where,
                              detail::json_kind(value), json_brief(value)));
    }
    const auto& shard = value.get_ref<const std::string&>();
    auto cached = resolved_shards.find(shard);
    if (cached == resolved_shards.end()) {
      fs::path relative(shard);
      if (shard.empty()) {
        throw Error(Errc::invalid_checkpoint, where + ": shard file name is empty");
      }
      // JSON allows "\u0000"; the C file API stops at the first NUL, so "a\u0000.safetensors"
      // would open the file "a".
      if (shard.find('\0') != std::string::npos) {
        throw Error(Errc::invalid_checkpoint,
                    fmt::format("{}: shard file name {} holds a NUL byte", where, quote(shard)));
      }
      if (relative.is_absolute()) {
        throw Error(Errc::invalid_checkpoint,
                    fmt::format("{}: shard path {} is absolute; shards must be named relative "
                                "to the checkpoint directory",
                                where, quote(shard)));
      }
      // weakly_canonical resolves every symlink of the part that exists, so a link inside
      // the directory that points elsewhere is caught as well as a literal "..".
      fs::path resolved = fs::weakly_canonical(dir_canonical / relative, ec);
      if (ec) {
        throw Error(Errc::invalid_checkpoint,
                    fmt::format("{}: cannot resolve shard path {}: {}", where, quote(shard),
                                ec.message()));
      }
      if (!is_inside(dir_canonical, resolved) && !is_hub_blob(dir_canonical, relative, resolved)) {
        throw Error(Errc::invalid_checkpoint,
                    fmt::format("{}: shard path {} leaves the checkpoint directory {} (it "
                                "resolves to {})",
                                where, quote(shard), dir_canonical.string(), resolved.string()));
      }
      // Shards sit directly in the checkpoint directory (transformers writes plain names);
      // a name with directories is refused even when it stays inside.
      if (std::distance(relative.begin(), relative.end()) != 1) {
        throw Error(Errc::invalid_checkpoint,
                    fmt::format("{}: shard path {} is not a plain file name; shards must sit "
                                "directly in the checkpoint directory {}",
                                where, quote(shard), dir_canonical.string()));
      }
      cached = resolved_shards.emplace(shard, std::move(resolved)).first;
    }
    entries.push_back(IndexEntry{tensor, shard, cached->second});
  }
  return entries;
}


Catalogue open_index(const fs::path& index_path) {
  const std::string index_name = index_path.string();
  const auto entries = detail::read_index(index_path, index_name);
  const fs::path dir_as_given = index_path.parent_path();

  // A missing shard is reported for the first entry (document order) that names it.
  {
    std::unordered_map<std::string, bool> shard_exists;
    for (const auto& entry : entries) {
      auto [it, fresh] = shard_exists.try_emplace(entry.shard, false);
      if (fresh) {
        std::error_code ec;
        it->second = fs::is_regular_file(entry.shard_path, ec);
      }
      // The index naming itself would be read as a shard, and fail as "not safetensors".
      if (std::error_code ec; fresh && it->second && fs::equivalent(entry.shard_path, index_path, ec)) {
        fail(index_name, fmt::format("weight_map entry {}: shard {} is this index file, not a "
                                     ".safetensors shard",
                                     quote(entry.tensor), quote(entry.shard)));
      }
      if (!it->second) {
        std::error_code ec;
        const bool exists = fs::exists(entry.shard_path, ec);
        fail(index_name, fmt::format("weight_map entry {}: shard {} {} (looked for {})",
                                     quote(entry.tensor), quote(entry.shard),
                                     exists ? "is not a regular file" : "does not exist",
                                     entry.shard_path.string()));
      }
    }
  }

  // Distinct shards in sorted name order (a deterministic plan needs a deterministic
  // catalogue); two spellings of one file ("a" and "./a") are one shard.
  std::map<std::string, fs::path> shards_by_name;
  for (const auto& entry : entries) shards_by_name.emplace(entry.shard, entry.shard_path);
  detail::CatalogueBuilder builder;
  std::map<fs::path, std::uint32_t> shard_of_path;
  for (const auto& [shard_name, resolved] : shards_by_name) {
    if (shard_of_path.contains(resolved)) continue;
    const auto shard = static_cast<std::uint32_t>(builder.catalogue().shards.size());
    builder.add_shard(resolved, (dir_as_given / shard_name).string(), shard_name, resolved);
    shard_of_path.emplace(resolved, shard);
  }
  Catalogue catalogue = builder.take();

  // Tensors a shard holds but the index does not list stay in the catalogue: they are in
  // the bytes we stream, and every byte of a shard belongs to exactly one tensor. They
  // still count for the two-shards rule, since a loader keyed by name would get two values.
  std::unordered_map<std::string_view, std::uint32_t> shard_of_tensor;
  shard_of_tensor.reserve(catalogue.tensors.size());
  for (const auto& tensor : catalogue.tensors) {
    auto [it, fresh] = shard_of_tensor.emplace(tensor.name, tensor.shard);
    if (!fresh) {
      fail(index_name, fmt::format("tensor {} is stored in two shards: {} and {}",
                                   quote(tensor.name), quote(catalogue.shards[it->second].name),
                                   quote(catalogue.shards[tensor.shard].name)));
    }
  }
  for (const auto& entry : entries) {
    auto listed = shard_of_path.at(entry.shard_path);
    auto it = shard_of_tensor.find(entry.tensor);
    if (it == shard_of_tensor.end()) {
      fail(index_name, fmt::format("weight_map lists tensor {} in shard {}, but that shard has "
                                   "no such tensor",
                                   quote(entry.tensor), quote(entry.shard)));
    }
    if (it->second != listed) {
      fail(index_name, fmt::format("weight_map lists tensor {} in shard {}, but it is stored in "
                                   "shard {}",
                                   quote(entry.tensor), quote(entry.shard),
                                   quote(catalogue.shards[it->second].name)));
    }
  }
  return catalogue;
}

}  // namespace detail

}  // namespace weightcast
