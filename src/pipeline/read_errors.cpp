// The errors of rank 0's reads: a read that failed, and a shard that shrank after its header
// was read (found by a read or by a send from the page cache).
#include "weightcast/pipeline/detail/pipeline.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <sys/stat.h>

namespace weightcast::detail {

// Shard @p f now ends at @p end, found while reading @p tensor (or sending it from the
// page cache): where the file ends, in its header (a shard cut to 0 bytes) or inside a
// tensor, which may be an earlier one than the one being read.
Error Pipeline::shrank(std::uint32_t f, std::uint64_t end, std::string tensor) const {
  const ShardInfo& shard = _catalogue.shards[f];
  if (end < shard.data_offset) {
    return Error(Errc::io,
                 fmt::format("{}: file ended at offset {}, inside its header, while reading "
                             "tensor '{}' (expected {} bytes): the shard shrank after its "
                             "header was read",
                             shard.name, end, tensor, shard.file_bytes));
  }
  std::string reading;
  for (const TensorInfo& info : _catalogue.tensors) {
    if (info.shard == f && info.file_offset <= end && end < info.file_offset + info.bytes &&
        info.name != tensor) {
      reading = fmt::format(", while reading tensor '{}'", tensor);
      tensor = info.name;
      break;
    }
  }
  return Error(Errc::io,
               fmt::format("{}: file ended at offset {} inside tensor '{}'{} (expected {} "
                           "bytes): the shard shrank after its header was read",
                           shard.name, end, tensor, reading, shard.file_bytes));
}

Error Pipeline::read_error(const ReadRequest& request) const {
  const Chunk& chunk = _plan.chunks[_slot_chunk[request.user]];
  const ShardInfo& shard = _catalogue.shards[chunk.shard];
  // The first byte that did not arrive; an O_DIRECT request may begin before the chunk.
  const std::uint64_t offset =
      std::max(request.file_offset + request.bytes_done, chunk.file_offset);
  std::string tensor = "?";
  for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
    const Piece& piece = _plan.pieces[chunk.first_piece + p];
    if (offset < chunk.file_offset + piece.chunk_offset + piece.bytes) {
      tensor = _catalogue.tensors[piece.tensor].name;
      break;
    }
  }
  if (request.end_of_file) {
    // A read that starts past the new end returns nothing at its own offset (for O_DIRECT
    // an aligned one): the file's size says where it really ends.
    std::uint64_t end = offset;
    struct stat st {};
    if (::fstat(request.fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) < end) {
      end = static_cast<std::uint64_t>(st.st_size);
    }
    return shrank(chunk.shard, end, tensor);
  }
  return system_error(Errc::io, request.error,
                      fmt::format("{}: read failed at offset {} (tensor '{}')", shard.name,
                                  offset, tensor));
}

}  // namespace weightcast::detail
