/**
 * @file pieces.hpp
 * @brief Internal: reading a directory of tensor pieces (torch DCP's
 *        `HuggingFaceStorageWriter(save_distributed=True)`; see `PieceInfo`).
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::detail {

/// The `__metadata__` key under which torch DCP places each piece in its tensor
/// (torch/distributed/checkpoint/_hf_utils.py, `CUSTOM_METADATA_KEY`).
inline constexpr std::string_view sharding_info_key = "DCP_SHARDING_INFO";

/**
 * @brief The catalogue of every file of @p files in @p dir, each piece its own entry, placed
 *        by `Catalogue::pieces` (rules: `CheckpointPieces::separate`).
 * @param files the `.safetensors` file names, sorted.
 * @throws Error as read_safetensors_header(); `invalid_checkpoint` (65) naming the file and
 *         the tensor for a rule of `CheckpointPieces::separate` broken.
 */
Catalogue open_pieces(const std::filesystem::path& dir, const std::vector<std::string>& files);

}  // namespace weightcast::detail
