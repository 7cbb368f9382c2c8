/**
 * @file catalogue_builder.hpp
 * @brief Internal: the one place a `Catalogue` is built from shard files.
 *
 * A single file (here), an index's shards (index.cpp) and a directory of tensor pieces
 * (pieces.cpp) all add their shards here: each header read and validated once, then the shard,
 * its tensors and its `__metadata__` appended. The openers decide which files form the
 * checkpoint and check the rules between them; none calls another to build.
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/format/safetensors.hpp"

#include <filesystem>
#include <string>

namespace weightcast::detail {

/// A `Catalogue` under construction, one shard at a time, in the order the shards are added.
class CatalogueBuilder {
 public:
  /**
   * @brief Reads and validates the header of the shard at @p path, then appends the shard,
   *        its tensors (their `shard` set) and its `__metadata__` (the first shard wins on a
   *        repeated key).
   * @param path the file to read.
   * @param file the file's name in messages.
   * @param shard_name the shard's `ShardInfo::name`.
   * @param resolved the shard's absolute path, symlinks resolved; empty: @p path resolved here
   *        (canonical, else absolute).
   * @return the header read; valid until the next call.
   * @throws Error as read_safetensors_header(); nothing is appended then.
   */
  const SafetensorsHeader& add_shard(const std::filesystem::path& path, const std::string& file,
                                     std::string shard_name, std::filesystem::path resolved = {});

  /// @return the catalogue so far.
  [[nodiscard]] const Catalogue& catalogue() const noexcept { return _catalogue; }

  /// @return the catalogue built; the builder is left empty.
  [[nodiscard]] Catalogue take() noexcept { return std::move(_catalogue); }

 private:
  Catalogue _catalogue;
  SafetensorsHeader _header;
};

/// @return the catalogue of the one safetensors file at @p path (its shard named after it).
/// @throws Error as `CatalogueBuilder::add_shard`.
Catalogue open_single_file(const std::filesystem::path& path);

}  // namespace weightcast::detail
