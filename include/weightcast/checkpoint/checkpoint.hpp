/**
 * @file checkpoint.hpp
 * @brief Opening a checkpoint (one shard, a directory, or an index) into a `Catalogue`.
 *
 * A checkpoint is one `.safetensors` file, a directory holding a `*.safetensors.index.json`
 * or a single `.safetensors` file, or the path of an index itself. Only rank 0 calls
 * `open_checkpoint`; the other ranks receive the catalogue over the control plane.
 *
 * Index rules (docs/DESIGN.md § Checkpoints; transformers' sharded checkpoint convention):
 * `weight_map` maps tensor name to shard file name; every shard path stays inside the
 * checkpoint directory after symlinks are resolved (no absolute path, no `..` escape); every
 * indexed tensor exists in the shard the index names; no tensor is stored in two shards.
 */
#pragma once

#include "weightcast/format/dtype.hpp"
#include "weightcast/format/tensor_info.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace weightcast {

/// One shard (`.safetensors` file) of a checkpoint.
struct ShardInfo {
  /// Resolved absolute path. Rank 0 opens it; over `transport: shm` the node's other ranks
  /// may too (local reads), checking `device` and `inode`.
  std::filesystem::path path;
  std::string name;            ///< Name for messages: the file name as the index spells it.
  std::uint64_t file_bytes = 0;   ///< Size of the file when the catalogue was read, bytes.
  std::uint64_t data_offset = 0;  ///< File offset of the data section: 8 + header length.
  /// The file whose header was read (`st_dev`, `st_ino`), so that rank 0 reads that file
  /// and no other one put in its place (a rename, a symlink relinked elsewhere) before it
  /// opens the shard for the load; 0, 0: unknown, not checked.
  std::uint64_t device = 0;
  std::uint64_t inode = 0;  ///< See `device`.
  /// Modification and status-change times of that file when its header was read (`st_mtim`,
  /// `st_ctim`), ns since the epoch: a rewrite in place (same inode, same size) changes
  /// them. Checked with `device` and `inode`, and only when `inode` is not 0.
  std::int64_t modified_ns = 0;
  std::int64_t changed_ns = 0;  ///< See `modified_ns`.
};

/**
 * @brief Where a catalogue entry lies in its tensor, for a checkpoint that stores a tensor in
 *        pieces (`open_checkpoint` with `CheckpointPieces::separate`).
 *
 * torch DCP's `HuggingFaceStorageWriter(save_distributed=True)` has each rank write its local
 * shards to a file of its own (`shard-0000R-model-…-of-….safetensors`, no index): a tensor
 * split over ranks is stored as several pieces, one per file, each under the tensor's name,
 * and the file's `__metadata__` key `DCP_SHARDING_INFO` holds JSON
 * `{name: {"saved_offsets": [o0, o1, …]}}` placing each piece in the global tensor.
 */
struct PieceInfo {
  std::string tensor;                  ///< The tensor's name as the files spell it.
  std::vector<std::uint64_t> offset;   ///< The piece's first element in the tensor, per dim.
  std::vector<std::uint64_t> global;   ///< The whole tensor's shape (the pieces' union).
};

/**
 * @brief Every tensor of a checkpoint, parsed once on rank 0.
 *
 * `tensors` are ordered by shard, then by file offset, which is the order the plan reads
 * them. Each shard's tensors tile its data section exactly (the safetensors validation rules
 * guarantee no hole and no overlap).
 */
struct Catalogue {
  std::vector<ShardInfo> shards;
  std::vector<TensorInfo> tensors;
  /// `__metadata__` of every shard merged (first shard wins on a repeated key).
  std::map<std::string, std::string> metadata;
  /// Per entry of `tensors` (same index) when the checkpoint was opened with
  /// `CheckpointPieces::separate` from a directory of pieces; empty otherwise. Rank 0's
  /// alone: the catalogue sent to the other ranks leaves it out.
  std::vector<PieceInfo> pieces;

  /// @return the sum of all tensor sizes, bytes.
  [[nodiscard]] std::uint64_t total_bytes() const noexcept;
};

/// How `open_checkpoint` treats a directory of several `.safetensors` files and no index.
enum class CheckpointPieces {
  /// Refused (66): nothing says how the files form one checkpoint. A directory of pieces
  /// (see `PieceInfo`) is named as such, with the reader that loads it.
  refuse,
  /// Read as torch DCP's `HuggingFaceStorageReader` reads it: every `.safetensors` file of
  /// the directory, each piece of a tensor its own catalogue entry (its shape the piece's,
  /// its name the tensor's when one piece holds the whole tensor, else
  /// "NAME [piece at O0, O1, …]"), placed by `Catalogue::pieces`. A file without
  /// `DCP_SHARDING_INFO` (or with it empty) holds whole tensors (offsets 0); a single file, or
  /// a directory of one, is read the same way, so that one rank's file alone is refused as
  /// the hole it leaves rather than loaded as a whole tensor. An empty piece is dropped
  /// (torch.chunk leaves trailing ranks none), unless every piece of its tensor is empty.
  /// Refused (65, naming the files and the tensor): a `DCP_SHARDING_INFO` that is not JSON,
  /// lacks a tensor of its file or gives it offsets of the wrong rank or not non-negative
  /// integers; pieces of one tensor that differ in dtype or rank, overlap, or leave a hole in
  /// the tensor they span, or span an extent over 2^63 - 1 (torch's sizes are int64); a
  /// sub-byte dtype in pieces; a tensor stored whole under a piece's name. An index is read as
  /// an index (its tensors whole), in either mode.
  separate,
};

/**
 * @brief Opens @p path as a checkpoint and validates every shard header.
 *
 * @param path a `.safetensors` file, an index `.json`, or a directory holding one index
 *        (`*.safetensors.index.json`) or exactly one `.safetensors` file (or, with
 *        @p pieces `separate`, several).
 * @param pieces what a directory of several `.safetensors` files and no index is.
 * @return the catalogue; tensor file offsets are absolute.
 * @throws Error `missing_input` (66) when @p path is empty or leads to no file (it does not
 *         exist, "a/b" where a is a file, a symlink loop), is no file to read (a FIFO, a
 *         socket) or a directory holds no usable checkpoint; `invalid_checkpoint` (65) when a
 *         shard or the index breaks a rule, naming the file and, where there is one, the
 *         tensor and the numbers involved (a Git LFS pointer file gets its own message); `io`
 *         (74) when @p path cannot be opened otherwise ("Permission denied") or a read fails;
 *         `usage` (64) when @p path holds a NUL byte (the kernel would open the path up to it).
 */
Catalogue open_checkpoint(const std::filesystem::path& path,
                          CheckpointPieces pieces = CheckpointPieces::refuse);

}  // namespace weightcast
