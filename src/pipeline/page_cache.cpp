// Rank 0's shards sent from the page cache: a placed load over MPI on one node maps a shard whose
// pages are resident and sends from the mapping instead of reading the shard into a slot.
#include "weightcast/pipeline/detail/pipeline.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sys/stat.h>

namespace weightcast::detail {

std::string Pipeline::io_mode() const {
  if (!_files) return std::string();
  std::vector<std::uint8_t> read(_catalogue.shards.size(), 0);
  bool any_mapped = false;
  for (const Chunk& chunk : _plan.chunks) {
    any_mapped = any_mapped || mapped(chunk);
    if (!mapped(chunk)) read[chunk.shard] = 1;
  }
  if (!any_mapped) return _files->mode();
  const bool any_read = std::find(read.begin(), read.end(), 1) != read.end();
  return any_read ? _files->mode() + "+mapped" : "mapped";
}

// Rank 0 of a placed load over MPI within one node, with a host device, sends each chunk
// from the memory it is in, and the receivers copy their slices out of it themselves (Open
// MPI's single-copy CMA path). A shard already in the page cache (read buffered, and at
// least `mapped_fraction` resident) is then sent from a mapping of the cache's own pages
// instead of being copied into a slot first: rank 0 copies only its own local shards, and
// the receivers copy theirs in parallel (io/detail/mapped_shard.hpp and
// docs/DESIGN.md § Placement). Across nodes a network transport may need to register the
// memory it sends for writing, which a read-only mapping refuses: there, and under
// `direct_io: on` (bypass the page cache), nothing is mapped. A shard that cannot be
// mapped is read.
void Pipeline::map_cached_shards() {
  _maps.resize(_catalogue.shards.size());
  _mapped_left.assign(_catalogue.shards.size(), 0);
  if (!_placement || _transport.world_size() == 1 ||
      !_transport.receivers_read_sender_memory() || _device.name() != "host" ||
      _options.direct_io == DirectIo::on) {
    return;
  }
  std::vector<std::uint8_t> has_chunks(_catalogue.shards.size(), 0);
  for (const Chunk& chunk : _plan.chunks) has_chunks[chunk.shard] = 1;
  for (std::uint32_t f = 0; f < _catalogue.shards.size(); ++f) {
    const ShardInfo& shard = _catalogue.shards[f];
    if (has_chunks[f] == 0 || _files->direct(f) || shard.file_bytes == 0 ||
        _files->resident_fraction(f) < mapped_fraction) {
      continue;
    }
    try {
      _maps[f] = std::make_unique<detail::MappedShard>(_files->fd(f), shard.file_bytes,
                                                       shard.name);
    } catch (const Error& e) {
      spdlog::debug("{}; reading it instead", e.what());
    }
  }
  for (const Chunk& chunk : _plan.chunks) {
    if (mapped(chunk)) ++_mapped_left[chunk.shard];
  }
}

// A mapped chunk's sends have completed: its pages leave rank 0's RSS (the window stays
// the ring's), and after a shard's last chunk, the shard is checked as a read one is.
void Pipeline::mapped_chunk_sent(const Chunk& chunk) {
  detail::MappedShard& map = *_maps[chunk.shard];
  map.release(chunk.file_offset, chunk.bytes);
  // Pages past a new end read as zeros (mapped_shard.hpp), and a receiver's single-copy read
  // of one fails: fail at the first chunk that may have met one, with the message of a read
  // that found the file ended; a zeroed page of a file as long as ever was an I/O error.
  struct stat st {};
  const ShardInfo& shard = _catalogue.shards[chunk.shard];
  const bool stat_ok = ::fstat(_files->fd(chunk.shard), &st) == 0;
  const auto size = stat_ok ? static_cast<std::uint64_t>(st.st_size) : shard.file_bytes;
  const std::string& tensor = _catalogue.tensors[_plan.pieces[chunk.first_piece].tensor].name;
  if (size < shard.file_bytes) throw shrank(chunk.shard, size, tensor);
  if (map.truncated() != 0) {
    throw Error(Errc::io, fmt::format("{}: a page of the shard could not be read (an I/O "
                                      "error under its mapping) while sending tensor '{}'",
                                      shard.name, tensor));
  }
  if (--_mapped_left[chunk.shard] == 0) _files->check_unchanged(chunk.shard);
}

}  // namespace weightcast::detail
