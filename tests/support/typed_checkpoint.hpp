// A safetensors checkpoint of typed, multi-dimensional tensors with random bytes, and an
// independent slicer of its bytes, for the placement tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace weightcast::test {

/// One tensor to write: name, dtype name as in the header, shape.
struct TypedTensor {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
};

/// Writes @p path: the tensors in order, random bytes from @p seed, the data section starting
/// at an odd offset when @p odd_start (as many real files). FAILs the test if it cannot.
/// @return each tensor's bytes (as written), in order.
std::vector<std::string> write_typed_checkpoint(const std::filesystem::path& path,
                                                const std::vector<TypedTensor>& tensors,
                                                std::uint64_t seed, bool odd_start = true);

/// @return element bytes of a whole-byte dtype name ("BF16" -> 2).
std::uint64_t typed_element_bytes(const std::string& dtype);

/// @return the local shard [offset, offset + shape) of a row-major tensor of @p global shape
///         whose bytes are @p bytes, element by element (no shortcut shared with the library).
std::string slice_bytes(const std::string& bytes, const std::vector<std::uint64_t>& global,
                        std::uint64_t element_bytes, const std::vector<std::uint64_t>& offset,
                        const std::vector<std::uint64_t>& shape);

/// @return the index of the tensor named @p name in @p tensors; FAILs the test if none is.
std::size_t tensor_index(const std::vector<TypedTensor>& tensors, const std::string& name);

/// @return the bytes a rank holds for a want of tensor @p name (of @p tensors, whose bytes
///         are @p datas): the whole tensor when @p offset and @p shape are empty (a whole
///         want), else the slice `slice_bytes` cuts.
std::string expected_local(const std::vector<TypedTensor>& tensors,
                           const std::vector<std::string>& datas, const std::string& name,
                           const std::vector<std::uint64_t>& offset,
                           const std::vector<std::uint64_t>& shape);

}  // namespace weightcast::test
