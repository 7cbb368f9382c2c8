/**
 * @file node_ring_delivery.hpp
 * @brief The delivery of `transport: shm`: every rank of the node copies each chunk out of the
 *        staging ring they share (transport/detail/node_ring.hpp), in parallel; no byte goes
 *        through a transport (docs/DESIGN.md § Pipeline).
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE (delivery.hpp). This class
 * is the replicated load: every rank gets every byte into its arena, as `BroadcastDelivery`,
 * whose landing (progress, hooks) it shares; a placed load's `PlacedDelivery` uses the two
 * pendings below over the same ring, each rank copying only its own boxes. Rank 0's `upload` publishes the slot to the other ranks, copies
 * its own arena's bytes and keeps the slot; its `post` returns the wait for every consumer's
 * release, so the slot goes back to the ring (and a new read) only once nobody reads it. On
 * another rank `post` is the wait for the slot holding the chunk, and its completion is the
 * copy into the arena and the release.
 *
 * Local reads (`LoadContext::local_reads`, rank 0's decision for the load, the same on every
 * rank: NodeRing::decide): where the checkpoint is in the page cache and every local rank can
 * open its files, nothing goes through the ring. Rank 0 copies its own boxes out of a mapping
 * of the page cache (ReadSide's mapped shards) and publishes nothing; every other rank
 * copies its own boxes out of its own read-only mappings of the files (`LocalShards`; `pread`
 * where a shard cannot be mapped) straight into their destinations, in parallel
 * (docs/DESIGN.md § Staging).
 */
#pragma once

#include "weightcast/pipeline/detail/broadcast_delivery.hpp"
#include "weightcast/transport/detail/node_ring.hpp"

#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/io/detail/mapped_shard.hpp"

#include <deque>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

namespace weightcast::detail {

/// One copy out of a node ring slot: @p bytes from @p chunk_offset into the chunk to @p to.
struct RingCopy {
  std::uint64_t chunk_offset = 0;
  std::byte* to = nullptr;
  std::uint64_t bytes = 0;
  /// @p to is device memory: the copy is the device's upload (a `cudaMemcpyAsync` on the
  /// rank's own copy stream, over its own PCIe link), not a `memcpy`.
  bool to_device = false;
};

/**
 * @brief Copies @p copies out of the chunk at @p source: host destinations with `memcpy`
 *        before returning, device ones queued as one `Device::upload_all`.
 * @return null when every copy is done, else the device copies in flight (@p source must
 *         stay valid until they complete).
 * @throws Error as `Device::upload_all`.
 */
std::unique_ptr<Pending> copy_out(Device& device, const std::vector<RingCopy>& copies,
                                  const std::byte* source);

/**
 * @brief This process's page-locking of the node ring's slots for a device that wants pinned
 *        staging (`cuda`: `cudaHostRegister`, CUDA Programming Guide, "Page-Locked Host
 *        Memory"), for one load; undone on destruction. Every process maps the ring at its own
 *        address, so every rank registers its own mapping. Where the driver refuses, the
 *        copies go from pageable memory (slower, still correct), and a warning says so.
 */
class RingPin {
 public:
  RingPin(Device& device, const NodeRing& ring);
  ~RingPin();
  RingPin(const RingPin&) = delete;
  RingPin& operator=(const RingPin&) = delete;

 private:
  Device& _device;
  std::byte* _pinned = nullptr;
};

/**
 * @brief A rank other than 0: completes once the slot holding chunk @p c is published and
 *        @p copies are done out of it (`copy_out`: device copies polled until they have
 *        completed), then releases the slot. Each `test()` sleeps at most
 *        100 ms on the ring's futex (none once `load.options.stop` is requested), so the
 *        landing stage's loop, the watchdog and a stop run at least that often.
 * @throws Error `internal` from `test()` when the slot's chunk is not the plan's size.
 */
std::unique_ptr<Pending> node_ring_receive(const LoadContext& load, NodeRing& ring,
                                           std::size_t c, std::vector<RingCopy> copies);
/**
 * @brief A rank's own descriptors of every shard, for local reads: opened by path, checked to
 *        be the files rank 0 described (regular, the catalogue's size; device and inode where
 *        the catalogue knows them), and `fstat`ed again after every chunk.
 */
class LocalShards {
 public:
  /**
   * @brief Opens every shard of @p catalogue read-only (@p catalogue must outlive this).
   * @throws Error `missing_input` (66) or `io` (74) naming the file, as ShardFiles.
   */
  explicit LocalShards(const Catalogue& catalogue);
  /**
   * @brief Reads @p bytes at @p offset of shard @p shard into @p to, all of them.
   * @param bounce where the shard is read with `pread` (it could not be mapped): null to read
   *        into @p to, else a buffer the bytes are read into first and copied from, so that
   *        what is returned is not @p to (a digest of it is then independent of @p to's).
   * @return the file's bytes as read: the page cache's, through this rank's mapping, or
   *         @p to or @p bounce's data where the shard is read with `pread` (valid until
   *         `release`, and the next read into @p bounce).
   * @throws Error `io` (74) naming the shard, offset and the tensor @p tensor names (called
   *         only then: finding it costs a scan of the chunk's pieces): a failed read, or the
   *         end of the file before the bytes (the shard shrank after its header was read).
   */
  const std::byte* read(std::uint32_t shard, std::uint64_t offset, std::byte* to,
                        std::uint64_t bytes,
                        const std::function<std::string_view()>& tensor,
                        std::vector<std::byte>* bounce = nullptr) const;
  /// Drops this process's mapping of [@p offset, + @p bytes) of shard @p shard once a chunk
  /// is read (its RSS falls back; the page cache keeps the pages).
  void release(std::uint32_t shard, std::uint64_t offset, std::uint64_t bytes) const;
  /// @throws Error `io` (74) naming the shard when its size or modification time moved since
  ///         it was opened (a write while it was read), or when a page of its mapping could
  ///         not be read (the file shrank under it: MappedShard's SIGBUS handling).
  void check_unchanged(std::uint32_t shard) const;

 private:
  struct Opened {
    UniqueFd fd;
    // The shard's page-cache pages, read with memcpy: a strided box is many short runs, one
    // syscall each with pread. Null where it cannot be mapped (then pread).
    std::unique_ptr<MappedShard> map;
    std::uint64_t bytes = 0;
    std::int64_t modified_ns = 0;
    std::int64_t changed_ns = 0;  // st_ctim: moves even where a rewrite restores st_mtim
  };
  const Catalogue& _catalogue;
  std::vector<Opened> _files;
};

/// Called with each copy's index in a local read's copies and the file's bytes it read
/// (`LocalShards::read`'s return), in order, before the chunk's mapping is released.
using ReadBytesHook = std::function<void(std::size_t copy, const std::byte* bytes)>;

/**
 * @brief A rank's local read of chunk @p c: its @p copies `pread` from @p files (whose
 *        chunk offsets are the chunk's, as out of a slot) when tested, each shown to @p seen
 *        (when set); then the shard is `fstat`ed again.
 * @throws what LocalShards throws, and what @p seen throws, from `test()`.
 */
std::unique_ptr<Pending> local_read(const LoadContext& load, const LocalShards& files,
                                    std::size_t c, std::vector<RingCopy> copies,
                                    ReadBytesHook seen = {});
/// Rank 0: completes once every consumer has released slot @p slot (polled, never waits).
std::unique_ptr<Pending> node_ring_released(const NodeRing& ring, std::size_t slot);

class NodeRingDelivery final : public BroadcastDelivery {
 public:
  /// @p load's transport must have a node ring (`Transport::node_ring`).
  explicit NodeRingDelivery(LoadContext& load);
  /// Through the ring, every chunk is staged in a shared slot: never read into rank 0's arena
  /// or sent from a mapping, since the other ranks copy out of the slot. With local reads,
  /// rank 0 copies its own bytes out of the page cache's mapping.
  [[nodiscard]] ReadPolicy read_policy() const override;
  /// Pins the ring for a cuda device (`RingPin`), then as `BroadcastDelivery::start`.
  void start() override;
  /// Rank 0: publishes @p slot (chunk @p c) to the other ranks, copies the chunk into its own
  /// arena and keeps @p lease for `post`. @return the device copies still in flight (none
  /// on the host: the copy is done).
  boost::asio::awaitable<Uploading> upload(std::size_t c, SlotLease lease,
                                           const Slot& slot) override;
  /// Rank 0 (@p root): the wait for every consumer's release of chunk @p c's slot, holding its
  /// lease. Another rank: the wait for the slot holding chunk @p c, whose completion copies
  /// the chunk into the arena and releases the slot (`node_ring_receive`).
  InFlight post(std::size_t c, bool root) override;

 private:
  NodeRing& _ring;
  std::optional<RingPin> _pin;
  std::deque<SlotLease> _held;  // rank 0: published slots not yet posted, plan order
};

}  // namespace weightcast::detail
