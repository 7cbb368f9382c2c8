#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

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

std::filesystem::path write_random_checkpoint(const std::filesystem::path& path, int count,
                                              std::uint64_t seed,
                                              const TensorBytesFn& tensor_bytes,
                                              DataStart data_start) {
  std::mt19937_64 rng(seed);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (int t = 0; t < count; ++t) {
    const std::uint64_t bytes = tensor_bytes(rng, t);
    const auto begin = data.size();
    for (std::uint64_t b = 0; b < bytes; ++b) data.push_back(static_cast<char>(rng()));
    header["t" + std::to_string(t)] = {{"dtype", "U8"},
                                       {"shape", {bytes}},
                                       {"data_offsets", {begin, data.size()}}};
  }
  std::string json = header.dump();
  if (data_start == DataStart::odd) {
    if ((8 + json.size()) % 2 == 0) json.push_back(' ');
    write_file(path, make_safetensors(json, data, 1));
  } else {
    write_file(path, make_safetensors(json, data, 8));
  }
  return path;
}

std::filesystem::path write_random_checkpoint(const std::filesystem::path& path,
                                              const std::vector<std::uint64_t>& sizes,
                                              std::uint64_t seed, DataStart data_start) {
  return write_random_checkpoint(
      path, static_cast<int>(sizes.size()), seed,
      [&sizes](std::mt19937_64&, int index) { return sizes[static_cast<std::size_t>(index)]; },
      data_start);
}

}  // namespace weightcast::test
