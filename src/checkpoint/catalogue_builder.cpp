#include "weightcast/checkpoint/detail/catalogue_builder.hpp"

#include <system_error>
#include <utility>

namespace weightcast::detail {

namespace fs = std::filesystem;

const SafetensorsHeader& CatalogueBuilder::add_shard(const fs::path& path, const std::string& file,
                                                     std::string shard_name, fs::path resolved) {
  _header = read_safetensors_header(path, file);
  if (resolved.empty()) {
    std::error_code ec;
    resolved = fs::canonical(path, ec);
    if (ec) resolved = fs::absolute(path);
  }
  const auto shard_index = static_cast<std::uint32_t>(_catalogue.shards.size());
  _catalogue.shards.push_back(ShardInfo{std::move(resolved), std::move(shard_name),
                                        8 + _header.header_bytes + _header.data_bytes,
                                        8 + _header.header_bytes, _header.device, _header.inode,
                                        _header.modified_ns, _header.changed_ns});
  for (auto tensor : _header.tensors) {
    tensor.shard = shard_index;
    _catalogue.tensors.push_back(std::move(tensor));
  }
  // map::insert keeps an existing key: the first shard wins, as documented.
  _catalogue.metadata.insert(_header.metadata.begin(), _header.metadata.end());
  return _header;
}

Catalogue open_single_file(const fs::path& path) {
  CatalogueBuilder builder;
  builder.add_shard(path, path.string(), path.filename().string());
  return builder.take();
}

}  // namespace weightcast::detail
