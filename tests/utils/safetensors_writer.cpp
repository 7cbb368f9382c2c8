#include "utils/safetensors_writer.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>

namespace weightcast::test {

std::string le64(std::uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return bytes;
}

std::string make_safetensors(std::string_view header_json, std::string_view data,
                             std::size_t pad_to) {
  std::string header(header_json);
  if (pad_to > 1) {
    while ((8 + header.size()) % pad_to != 0) header += ' ';
  }
  std::string bytes = le64(header.size());
  bytes += header;
  bytes += data;
  return bytes;
}

std::string zeros(std::size_t bytes) { return std::string(bytes, '\0'); }

void write_file(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) FAIL("cannot create " << path.string());
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) FAIL("cannot write " << path.string());
}

}  // namespace weightcast::test
