/**
 * @file tensor_info.hpp
 * @brief One tensor of a safetensors file or a checkpoint: its name, dtype, shape and where
 *        its bytes are.
 *
 * The format's parser (safetensors.hpp) yields these, and a checkpoint's `Catalogue`
 * (checkpoint/checkpoint.hpp) lists them, each with the shard that holds it.
 */
#pragma once

#include "weightcast/format/dtype.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace weightcast {

/// One tensor of a checkpoint: where its bytes are and what they mean.
struct TensorInfo {
  std::string name;                 ///< Name as in the header (UTF-8, any characters).
  Dtype dtype = Dtype::U8;          ///< Element type.
  std::vector<std::uint64_t> shape; ///< Dimensions; empty for a scalar.
  std::uint32_t shard = 0;          ///< Index into `Catalogue::shards`; 0 in a parsed header.
  std::uint64_t file_offset = 0;    ///< Absolute offset of the first byte in the shard file.
  std::uint64_t bytes = 0;          ///< Size in bytes (0 for a zero-size tensor).
};

}  // namespace weightcast
