/**
 * @file synth.hpp
 * @brief A synthetic, Llama-shaped safetensors checkpoint writer for demos and benchmarks.
 *
 * The tensor names and shapes are those of a Hugging Face `LlamaForCausalLM` state dict
 * (untied `lm_head`, grouped-query attention), so a synthetic checkpoint exercises the same
 * tensor count, size spread and sharding as a real one. The tensor bytes are deterministic
 * pseudo-random bit patterns (a counter-based splitmix64 stream keyed by seed and tensor
 * index); they are not meaningful numbers and may include NaN or Inf bit patterns. A `BOOL`
 * element is the stream byte's low bit (0 or 1), the only bytes numpy and torch hold as bool.
 *
 * Output follows transformers' conventions: a single `model.safetensors` when the checkpoint
 * fits in one shard, else `model-00001-of-0000N.safetensors` shards plus
 * `model.safetensors.index.json` (`metadata.total_size`, `weight_map`). Headers are padded
 * with spaces to a multiple of 8 bytes, as the Python safetensors writer does.
 */
#pragma once

#include "weightcast/format/dtype.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <stop_token>
#include <string_view>
#include <vector>

namespace weightcast {

/// The architecture a synthetic checkpoint imitates.
struct LlamaShape {
  std::uint64_t vocab = 0;         ///< Vocabulary size (rows of embed_tokens and lm_head).
  std::uint64_t hidden = 0;        ///< Model width.
  std::uint64_t intermediate = 0;  ///< MLP width.
  std::uint64_t heads = 0;         ///< Attention heads (q_proj rows = heads × head_dim).
  std::uint64_t kv_heads = 0;      ///< Key/value heads (grouped-query attention).
  std::uint64_t layers = 0;        ///< Decoder layers.

  /// @return hidden / heads.
  [[nodiscard]] std::uint64_t head_dim() const noexcept { return hidden / heads; }
  /// @return the number of parameters (elements over all tensors).
  [[nodiscard]] std::uint64_t params() const noexcept;
};

/**
 * @brief Chooses a real Llama-family width for @p target_params and the layer count that
 *        brings the total closest to it.
 *
 * Widths come from a small table (tiny test sizes, SmolLM-135M, TinyLlama-1.1B,
 * Llama-3.2-3B, Llama-3-8B, Llama-2-13B, Llama-3-70B); the table row is the largest whose
 * threshold @p target_params reaches; the layer count is then rounded to nearest (at
 * least 1). "1M" gives 15 layers of width 64, "125M" 19 layers of width 576, "1B" 20
 * layers of width 2048 (1.01e9 parameters), "8B" 32 layers of width 4096.
 *
 * @param target_params desired parameter count (> 0).
 */
LlamaShape choose_llama_shape(std::uint64_t target_params);

/**
 * @brief Parses a parameter count: "125M", "1B", "1.5B", "500K", "2T" or a plain number.
 *
 * Units are decimal (K = 1e3, M = 1e6, B or G = 1e9, T = 1e12), case-insensitive; spaces
 * and underscores are ignored ("1_000_000"); a fraction is rounded to the nearest count.
 * @throws Error `usage` (64) naming @p text when it is not a positive count up to 10T.
 */
std::uint64_t parse_param_count(std::string_view text);

/// What to write.
struct SynthOptions {
  std::uint64_t params = 1'000'000'000;  ///< Target parameter count (see choose_llama_shape).
  Dtype dtype = Dtype::BF16;             ///< Element type of every tensor.
  std::uint64_t shard_bytes = 2ull << 30;  ///< Largest shard's tensor bytes (> 0); a tensor
                                           ///< larger than this gets a shard of its own.
  std::uint64_t seed = 0;                ///< Seed of the tensor bytes.
  /// A stop requested here (SIGINT, SIGTERM) ends the write within one block (16 MiB) per
  /// writing thread: every temporary file is removed, nothing is renamed into place, and
  /// `Error` `interrupted` (130) is thrown. Once the files are being renamed into place the
  /// write completes.
  std::stop_token stop = {};
  /// Called after each block (at most 16 MiB) of a shard's tensor bytes is written, with
  /// its size in bytes; from the writing threads, several at once.
  std::function<void(std::uint64_t)> on_block = {};
};

/// What was written.
struct SynthSummary {
  LlamaShape shape;                          ///< The architecture chosen.
  std::uint64_t tensors = 0;                 ///< Number of tensors.
  std::uint64_t shards = 0;                  ///< Number of `.safetensors` files.
  std::uint64_t params = 0;                  ///< Parameters (elements) over all tensors.
  std::uint64_t tensor_bytes = 0;            ///< Sum of tensor sizes, bytes.
  std::uint64_t file_bytes = 0;              ///< Sum of file sizes incl. headers and index.
  std::vector<std::filesystem::path> paths;  ///< Shards in order, then the index if any.
  std::filesystem::path checkpoint;          ///< What to open: the file or the index.
};

/**
 * @brief Writes a synthetic Llama-shaped checkpoint into @p out_dir (created if missing).
 *
 * Each file is written under a temporary name and renamed into place only when every file is
 * complete (the index last), so an interrupted run never leaves something that looks like a
 * good checkpoint. Every file records `"generator": "weightcast synth"` in its metadata. Files
 * of an earlier synthetic checkpoint in @p out_dir (the same names: `model.safetensors`,
 * `model-*-of-*.safetensors`, the index; and that metadata) that the new one does not
 * overwrite are removed, so the directory holds exactly one checkpoint. Any other
 * `*.safetensors` or `*.safetensors.index.json` in @p out_dir (a real model uses the same
 * names) is refused before anything is written; other files are left alone.
 *
 * Temporary files are named `NAME.partial-PID`. Those of synth's own names left in @p out_dir
 * by a process that no longer runs (one killed, or a machine that went down) are removed
 * before the write; those of a process still running are left alone.
 *
 * The same seed and shape give the same tensor bytes whatever `shard_bytes` is. Data are
 * written with large positional writes from a few threads (≈ page-cache speed).
 *
 * @throws Error `usage` (64) for an empty @p out_dir or one holding a NUL byte, a dangling
 *         symbolic link as @p out_dir, a zero `params` or `shard_bytes`, a sub-byte dtype
 *         whose tensors would not be whole bytes, an @p out_dir holding a checkpoint file
 *         synth did not write, or one another synth is writing now (its flock(2)); `io` (74)
 *         when the checkpoint's bytes exceed the free space of @p out_dir's filesystem
 *         (statvfs f_bavail; checked before any file is created, naming both figures), and
 *         naming the file or directory when it cannot be created, opened, locked, written,
 *         closed or renamed; `interrupted` (130) when `options.stop` is requested before the
 *         commit.
 */
SynthSummary write_synthetic_checkpoint(const std::filesystem::path& out_dir,
                                        const SynthOptions& options);

}  // namespace weightcast
