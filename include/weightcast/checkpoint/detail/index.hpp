/**
 * @file index.hpp
 * @brief Internal: reading a sharded checkpoint's `*.safetensors.index.json`.
 *
 * Split from `open_checkpoint` so the index rules (JSON shape, shard path safety) can be
 * checked on an index alone, without its shards (the corpus holds large real indexes whose
 * shards are not included).
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::detail {

/// How an index file's name ends (transformers' convention).
inline constexpr std::string_view index_suffix = ".safetensors.index.json";

/// One `weight_map` entry of an index.
struct IndexEntry {
  std::string tensor;               ///< Tensor name (the key).
  std::string shard;                ///< Shard file name as the index spells it (the value).
  std::filesystem::path shard_path;  ///< The shard's path with symlinks resolved, inside
                                     ///< the checkpoint directory (the file may not exist).
};

/**
 * @brief Reads an index file's bytes, unparsed (read_index() reads it so).
 *
 * Opens without blocking and refuses what is not a regular file (a FIFO would block the
 * read forever) or is over 1 GiB (a real index is a few MB).
 * @param index_path the `.json` file.
 * @param name the index name used in messages (defaults to the path as given).
 * @throws Error `missing_input` (66) if the path leads to no file (throw_open_failure()) or
 *         to one that is not a regular file, `invalid_checkpoint` (65) if it is over 1 GiB,
 *         `io` (74) if it cannot be opened otherwise, fstat(2) or a read fails, `usage` (64)
 *         if @p index_path holds a NUL byte. A file that shrank while read gives what was
 *         read (the JSON parse then says it is cut).
 */
std::string read_index_text(const std::filesystem::path& index_path, const std::string& name = {});

/**
 * @brief Reads and checks an index: UTF-8, a JSON object, `weight_map` a non-empty object of
 *        strings, no repeated key, every shard name non-empty, without a NUL byte, a plain
 *        file name (no directory part) and inside the index's directory once symlinks are
 *        resolved (or, in the Hugging Face hub cache, `<repo>/snapshots/<rev>`, a link into
 *        `<repo>/blobs`).
 *
 * Does not check that the shards exist (`open_checkpoint` does).
 *
 * @param index_path the `.json` file.
 * @param name the index name used in messages (defaults to the path as given).
 * @return the entries in document order.
 * @throws Error as read_index_text() (`missing_input` (66), `io` (74), `usage` (64),
 *         `invalid_checkpoint` (65) over 1 GiB); `missing_input` (66) when the index's
 *         directory cannot be resolved; `invalid_checkpoint` (65) naming the index file and,
 *         for a shard name fault, the tensor entry.
 */
std::vector<IndexEntry> read_index(const std::filesystem::path& index_path,
                                   const std::string& name = {});

/**
 * @brief The catalogue of the sharded checkpoint @p index_path describes: read_index(), then
 *        every shard it names (in sorted name order, each file once) through the catalogue
 *        builder, then the rules between the index and its shards.
 * @throws Error as read_index(); `invalid_checkpoint` (65) naming the index when a shard is
 *         missing, is the index itself, lacks a tensor the index lists in it, or when a tensor
 *         is stored in two shards; as `CatalogueBuilder::add_shard` for a shard.
 */
Catalogue open_index(const std::filesystem::path& index_path);

}  // namespace weightcast::detail
