#include "support/typed_checkpoint.hpp"

#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <random>

namespace weightcast::test {

std::uint64_t typed_element_bytes(const std::string& dtype) {
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL" || dtype.rfind("F8", 0) == 0) return 1;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  return 8;
}

std::vector<std::string> write_typed_checkpoint(const std::filesystem::path& path,
                                                const std::vector<TypedTensor>& tensors,
                                                std::uint64_t seed, bool odd_start) {
  std::mt19937_64 rng(seed);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<std::string> datas;
  std::string data;
  for (const TypedTensor& t : tensors) {
    std::uint64_t bytes = typed_element_bytes(t.dtype);
    for (auto d : t.shape) bytes *= d;
    std::string mine(bytes, '\0');
    for (auto& c : mine) c = static_cast<char>(rng());
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + bytes}}};
    data += mine;
    datas.push_back(std::move(mine));
  }
  std::string text = header.dump();
  // 8 bytes of length + header: pad with spaces to an odd total, or a multiple of 8.
  if (odd_start) {
    if ((8 + text.size()) % 2 == 0) text += ' ';
    write_file(path, make_safetensors(text, data, 1));
  } else {
    write_file(path, make_safetensors(text, data, 8));
  }
  return datas;
}

std::string slice_bytes(const std::string& bytes, const std::vector<std::uint64_t>& global,
                        std::uint64_t element_bytes, const std::vector<std::uint64_t>& offset,
                        const std::vector<std::uint64_t>& shape) {
  std::uint64_t elements = 1;
  for (auto d : shape) elements *= d;
  std::string out;
  out.reserve(elements * element_bytes);
  std::vector<std::uint64_t> index(shape.size(), 0);
  for (std::uint64_t e = 0; e < elements; ++e) {
    // index = the e-th local element, row-major; its global linear position:
    std::uint64_t linear = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) linear = linear * global[d] + offset[d] + index[d];
    out.append(bytes, linear * element_bytes, element_bytes);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

std::size_t tensor_index(const std::vector<TypedTensor>& tensors, const std::string& name) {
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name == name) return i;
  }
  FAIL("no tensor " << name);
  return 0;
}

std::string expected_local(const std::vector<TypedTensor>& tensors,
                           const std::vector<std::string>& datas, const std::string& name,
                           const std::vector<std::uint64_t>& offset,
                           const std::vector<std::uint64_t>& shape) {
  const std::size_t i = tensor_index(tensors, name);
  if (offset.empty() && shape.empty()) return datas[i];
  return slice_bytes(datas[i], tensors[i].shape, typed_element_bytes(tensors[i].dtype), offset,
                     shape);
}

}  // namespace weightcast::test
