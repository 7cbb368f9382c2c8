// Builds safetensors bytes by hand (any header text, valid or not) for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

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

}  // namespace weightcast::test
