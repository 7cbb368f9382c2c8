/**
 * @file read_side.hpp
 * @brief Rank 0's read side of a load: the shard files, the staging ring and its slots, the
 *        reader, the shards sent from the page cache, and the read and completion stages.
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE: it runs on the load's
 * executor, one handler at a time, beside the stages (docs/DESIGN.md § Reads, § Staging).
 * Only rank 0 has one; what it does with a slot once read is the delivery's.
 */
#pragma once

#include "weightcast/core/error.hpp"
#include "weightcast/io/detail/shard_files.hpp"
#include "weightcast/io/detail/mapped_shard.hpp"
#include "weightcast/io/detail/staging_ring.hpp"
#include "weightcast/io/reader.hpp"
#include "weightcast/pipeline/detail/load_context.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/channel.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace weightcast::detail {

/// How the delivery wants rank 0's chunks read.
struct ReadPolicy {
  /// A buffered chunk whose pieces tile one range of a host arena may be read into that
  /// range: no slot, no copy (O_DIRECT chunks are staged: their aligned superset spills).
  bool read_into_arena = false;
  /// A shard read buffered and resident in the page cache may be mapped and its chunks sent
  /// from the mapping (docs/DESIGN.md § Placement).
  bool send_from_page_cache = false;
  /// A read that completed inside its submit is handed on before the next slot is leased
  /// (the copy runs on this thread anyway; see ReadSide::read_stage).
  bool reuse_cached_slot = false;
};

/// One staging slot's chunk between its lease and its upload.
struct Slot {
  /// One-shot signal: the read into the slot has finished.
  using ReadyChannel = boost::asio::experimental::channel<void(boost::system::error_code)>;
  std::unique_ptr<ReadyChannel> ready;
  ReadRequest request;
  std::size_t chunk = 0;                  ///< The chunk it holds.
  const std::byte* source = nullptr;      ///< The chunk's first byte (in the slot, the arena or a mapping).
  bool in_arena = false;                  ///< The read put the chunk in its place in the arena.
  std::chrono::steady_clock::time_point read_begin;  ///< When its read was submitted.
};

class ReadSide {
 public:
  /// Of a shard's pages, the fraction resident for it to be sent from the page cache (and,
  /// over the node ring, for local reads): a few missing pages are read by the faults or
  /// reads that meet them.
  static constexpr double mapped_fraction = 0.95;
  using Clock = std::chrono::steady_clock;
  using IndexChannel =
      boost::asio::experimental::channel<void(boost::system::error_code, std::size_t)>;

  /// Opens the shards and maps the ring (`min(buffer_depth, chunks)` slots of the largest
  /// chunk, plus O_DIRECT's alignment). The plan must have chunks; @p load must outlive this.
  ReadSide(LoadContext& load, const ReadPolicy& policy);
  ReadSide(const ReadSide&) = delete;
  ReadSide& operator=(const ReadSide&) = delete;

  /// Maps the cached shards and creates the reader; call once the ring's memory is final.
  void open();

  /// Read stage: lease a slot, queue its read, hand it on in plan order.
  boost::asio::awaitable<void> read_stage();
  /// Completion stage: wake on the reader's eventfd, reap, signal each slot.
  boost::asio::awaitable<void> completion_stage();
  /// @return the next chunk's slot, in plan order, once its read has finished.
  boost::asio::awaitable<SlotLease> next_read();
  [[nodiscard]] const Slot& slot(std::size_t index) const { return _slots[index]; }

  /// Chunk @p c's sends have completed: a mapped chunk's pages leave rank 0's RSS, and a
  /// shard sent whole from its mapping is checked as a read one is.
  /// @throws Error `io` (74) when the shard shrank or a page of it could not be read.
  void sent(std::size_t c);

  [[nodiscard]] StagingRing& ring() noexcept { return _ring; }
  [[nodiscard]] std::uint64_t staging_bytes() const noexcept { return _ring.total_bytes(); }
  [[nodiscard]] std::string reader_name() const {
    return _reader ? std::string(_reader->name()) : std::string();
  }
  /// "buffered", "direct" or "direct+buffered" (ShardFiles::mode), "+mapped" where some
  /// shards were sent from the page cache, "mapped" where all were.
  [[nodiscard]] std::string io_mode() const;
  /// Frees the reader: in-flight reads must finish before slots go away.
  void shut_down() noexcept { _reader.reset(); }

 private:
  [[nodiscard]] bool mapped(const Chunk& chunk) const {
    return chunk.shard < _maps.size() && _maps[chunk.shard] != nullptr;
  }
  [[nodiscard]] bool reads_into_arena(const Chunk& chunk) const {
    return _policy.read_into_arena && chunk.arena_contiguous &&
           _files.alignment(chunk.shard) == 1;
  }
  void map_cached_shards();
  [[nodiscard]] Error shrank(std::uint32_t f, std::uint64_t end, std::string tensor) const;
  [[nodiscard]] Error read_error(const ReadRequest& request) const;


  LoadContext& _load;
  const ReadPolicy _policy;
  ShardFiles _files;
  StagingRing _ring;
  std::vector<Slot> _slots;  // per ring slot
  // Per shard, its mapping where it is sent from the page cache, else null; and its mapped
  // chunks not yet sent.
  std::vector<std::unique_ptr<MappedShard>> _maps;
  std::vector<std::size_t> _mapped_left;
  std::optional<IndexChannel> _to_upload;  // slot indices, plan order
  std::unique_ptr<Reader> _reader;         // declared last: destroyed first, before the ring
};

}  // namespace weightcast::detail
