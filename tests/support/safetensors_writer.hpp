// Builds safetensors bytes by hand (any header text, valid or not) for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::test {

/// @return 8-byte little-endian length + @p header_json padded with spaces to a multiple of
///         @p pad_to (1 for no padding) + @p data. The header text is used verbatim, so it
///         may be invalid JSON or invalid UTF-8.
std::string make_safetensors(std::string_view header_json, std::string_view data,
                             std::size_t pad_to = 8);

/// @return the 8-byte little-endian encoding of @p value (a header length field).
std::string le64(std::uint64_t value);

/// @return @p bytes zero-valued bytes (tensor data whose content does not matter).
std::string zeros(std::size_t bytes);

/// Writes @p bytes to @p path (created or truncated); FAILs the test if that fails.
void write_file(const std::filesystem::path& path, std::string_view bytes);

/// Where the data section of a checkpoint written by write_random_checkpoint starts.
enum class DataStart {
  aligned_8,  ///< The header is padded with spaces to a multiple of 8 bytes (as the
              ///< safetensors format recommends), so tensors start 8-byte aligned.
  odd,        ///< The header is padded with at most one space so the data section starts at
              ///< an odd file offset, as in many real files: nothing is aligned.
};

/// Gives the size in bytes of tensor @p index, drawing from @p rng if it likes. Called once
/// per tensor, in order, just before that tensor's bytes are drawn from the same @p rng.
using TensorBytesFn = std::function<std::uint64_t(std::mt19937_64& rng, int index)>;

/// Writes @p path (created or truncated): a safetensors file of @p count U8 tensors named
/// "t0", "t1", ..., each of shape [its bytes], laid out in order, whose sizes come from
/// @p tensor_bytes and whose bytes are random. One std::mt19937_64 seeded with @p seed serves
/// both, so the same arguments always write the same file. FAILs the test if that fails.
/// @return @p path.
std::filesystem::path write_random_checkpoint(const std::filesystem::path& path, int count,
                                              std::uint64_t seed,
                                              const TensorBytesFn& tensor_bytes,
                                              DataStart data_start = DataStart::aligned_8);

/// write_random_checkpoint with fixed sizes: tensor t has @p sizes[t] bytes (random bytes
/// from a std::mt19937_64 seeded with @p seed). @return @p path.
std::filesystem::path write_random_checkpoint(const std::filesystem::path& path,
                                              const std::vector<std::uint64_t>& sizes,
                                              std::uint64_t seed,
                                              DataStart data_start = DataStart::aligned_8);

}  // namespace weightcast::test
