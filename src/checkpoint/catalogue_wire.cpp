#include "weightcast/checkpoint/catalogue_wire.hpp"

#include "weightcast/core/detail/wire.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <limits>

namespace weightcast {

namespace {
constexpr std::uint32_t magic = 0x54414357;  // "WCAT" little-endian

// A count as its u32 field; the format's bounds keep every real one far below 2^32.
std::uint32_t count_field(std::size_t count, std::string_view what) {
  if (count > std::numeric_limits<std::uint32_t>::max()) {
    throw Error(Errc::internal,
                fmt::format("the catalogue has {} {}, more than its u32 field holds", count, what));
  }
  return static_cast<std::uint32_t>(count);
}
}  // namespace

std::string encode_catalogue(const Catalogue& catalogue) {
  detail::WireWriter out;
  out.put(magic);
  out.put(catalogue_wire_version);
  out.put(count_field(catalogue.shards.size(), "shards"));
  for (const ShardInfo& shard : catalogue.shards) {
    out.put_string(shard.name);
    out.put(shard.file_bytes);
    out.put(shard.data_offset);
    // Where the file is and which one it is: a rank on rank 0's node may read it itself
    // (transport shm's local reads), and must find the very file rank 0 described.
    out.put_string(shard.path.string());
    out.put(shard.device);
    out.put(shard.inode);
    out.put(shard.modified_ns);
    out.put(shard.changed_ns);
  }
  out.put(count_field(catalogue.tensors.size(), "tensors"));
  for (const TensorInfo& tensor : catalogue.tensors) {
    out.put_string(tensor.name);
    out.put(static_cast<std::uint8_t>(tensor.dtype));
    out.put(count_field(tensor.shape.size(), "dimensions in one shape"));
    for (std::uint64_t dim : tensor.shape) out.put(dim);
    out.put(tensor.shard);
    out.put(tensor.file_offset);
    out.put(tensor.bytes);
  }
  out.put(count_field(catalogue.metadata.size(), "metadata keys"));
  for (const auto& [key, value] : catalogue.metadata) {
    out.put_string(key);
    out.put_string(value);
  }
  return std::move(out.bytes());
}

Catalogue decode_catalogue(std::string_view bytes, std::string_view what) {
  detail::WireReader in(bytes, what);
  if (in.get<std::uint32_t>("magic") != magic) in.fail("magic", "not a weightcast catalogue");
  if (const auto version = in.get<std::uint32_t>("version"); version != catalogue_wire_version) {
    in.fail("version", fmt::format("version {}, this build speaks {} (mixed weightcast builds?)",
                                   version, catalogue_wire_version));
  }
  Catalogue catalogue;
  const auto shard_count = in.get<std::uint32_t>("shard count");
  in.need_items(shard_count, 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8, "shards");
  catalogue.shards.resize(shard_count);
  for (ShardInfo& shard : catalogue.shards) {
    shard.name = in.get_string("shard name");
    shard.file_bytes = in.get<std::uint64_t>("shard file size");
    shard.data_offset = in.get<std::uint64_t>("shard data offset");
    shard.path = in.get_string("shard path");
    shard.device = in.get<std::uint64_t>("shard device");
    shard.inode = in.get<std::uint64_t>("shard inode");
    shard.modified_ns = in.get<std::int64_t>("shard modification time");
    shard.changed_ns = in.get<std::int64_t>("shard status-change time");
    if (shard.data_offset < 8 || shard.data_offset > shard.file_bytes) {
      in.fail("shard " + shard.name, fmt::format("data offset {} outside the file of {} bytes",
                                                 shard.data_offset, shard.file_bytes));
    }
  }
  const auto tensor_count = in.get<std::uint32_t>("tensor count");
  in.need_items(tensor_count, 4 + 1 + 4 + 4 + 8 + 8, "tensors");
  catalogue.tensors.resize(tensor_count);
  // Each shard's tensors must tile its data section in order (what the plan assumes).
  std::uint32_t current_shard = 0;
  std::uint64_t next_offset = shard_count > 0 ? catalogue.shards[0].data_offset : 0;
  auto close_shards_before = [&](std::uint32_t shard) {
    while (current_shard < shard) {
      if (next_offset != catalogue.shards[current_shard].file_bytes) {
        in.fail("shard " + catalogue.shards[current_shard].name,
                "tensors do not cover the data section exactly");
      }
      ++current_shard;
      next_offset = catalogue.shards[current_shard].data_offset;
    }
  };
  for (TensorInfo& tensor : catalogue.tensors) {
    tensor.name = in.get_string("tensor name");
    const std::string field = "tensor '" + tensor.name + "'";
    const auto dtype = in.get<std::uint8_t>("dtype");
    if (dtype >= dtype_count) in.fail(field, fmt::format("unknown dtype {}", dtype));
    tensor.dtype = static_cast<Dtype>(dtype);
    // Any number of dimensions, as the format allows: the bytes left bound it.
    const auto rank = in.get<std::uint32_t>("shape rank");
    in.need_items(rank, 8, field);
    tensor.shape.resize(rank);
    unsigned __int128 elements = 1;
    for (std::uint64_t& dim : tensor.shape) {
      dim = in.get<std::uint64_t>("dimension");
      elements *= dim;
      if (elements > (static_cast<unsigned __int128>(1) << 70)) in.fail(field, "shape overflows");
    }
    tensor.shard = in.get<std::uint32_t>("shard");
    tensor.file_offset = in.get<std::uint64_t>("file offset");
    tensor.bytes = in.get<std::uint64_t>("bytes");
    const unsigned __int128 bits = elements * dtype_bits(tensor.dtype);
    if (bits % 8 != 0 || bits / 8 != tensor.bytes) {
      in.fail(field, fmt::format("{} bytes do not match its dtype and shape", tensor.bytes));
    }
    if (tensor.shard >= shard_count || tensor.shard < current_shard) {
      in.fail(field, fmt::format("shard {} out of order or range", tensor.shard));
    }
    close_shards_before(tensor.shard);
    if (tensor.file_offset != next_offset ||
        tensor.bytes > catalogue.shards[tensor.shard].file_bytes - tensor.file_offset) {
      in.fail(field, fmt::format("byte range [{}, +{}) leaves a hole, overlaps or leaves shard "
                                 "'{}'",
                                 tensor.file_offset, tensor.bytes,
                                 catalogue.shards[tensor.shard].name));
    }
    next_offset += tensor.bytes;
  }
  if (shard_count > 0) close_shards_before(shard_count - 1);
  if (shard_count > 0 && next_offset != catalogue.shards[shard_count - 1].file_bytes) {
    in.fail("shard " + catalogue.shards[shard_count - 1].name,
            "tensors do not cover the data section exactly");
  }
  const auto metadata_count = in.get<std::uint32_t>("metadata count");
  in.need_items(metadata_count, 8, "metadata");
  for (std::uint32_t i = 0; i < metadata_count; ++i) {
    std::string key = in.get_string("metadata key");
    catalogue.metadata[key] = in.get_string("metadata value");
  }
  if (in.left() != 0) in.fail("end", fmt::format("{} trailing bytes", in.left()));
  return catalogue;
}

}  // namespace weightcast
