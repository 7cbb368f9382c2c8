/**
 * @file placed_delivery.hpp
 * @brief The delivery of a placed load (`LoadOptions::placement`): each rank receives exactly
 *        its wants — whole tensors by broadcast, slices point to point — cast where asked,
 *        and hashed for `verify: digest` (docs/DESIGN.md § Placement).
 *
 * Over `transport: shm` nothing is sent: every rank copies its boxes out of the node ring's
 * slot itself (node_ring_delivery.hpp), rank 0 holding the slot until all have.
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE (delivery.hpp), but for
 * the device read-backs of landed wants, which run on one thread of its own (`_hashing`).
 */
#pragma once

#include "weightcast/pipeline/detail/delivery.hpp"
#include "weightcast/pipeline/digest.hpp"

#include <boost/asio/thread_pool.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

namespace weightcast::detail {

struct RingCopy;  // node_ring_delivery.hpp

class PlacedDelivery final : public Delivery {
 public:
  /// @param want_data where this rank's wants land (`LoadResult::want_data`), one per want.
  PlacedDelivery(LoadContext& load, std::vector<std::byte*> want_data);

  void start() override;
  [[nodiscard]] ReadPolicy read_policy() const override;
  void staging_ready(const StagingRing& ring) override;
  boost::asio::awaitable<Uploading> upload(std::size_t c, SlotLease lease,
                                           const Slot& slot) override;
  InFlight post(std::size_t c, bool root) override;
  void landed(InFlight& landed) override;
  void report(LoadResult& result) const override;
  void finish_hashing() override;
  [[nodiscard]] std::shared_ptr<Arena> take_device_sends() noexcept override {
    return std::move(_device_sends);
  }

 private:
  struct CastState {
    std::uint64_t next = 0;     // the local byte expected next
    std::uint64_t carried = 0;  // bytes of a cut element in `carry`
    std::byte carry[8]{};
  };

  [[nodiscard]] std::vector<std::vector<std::uint64_t>> expected_digests() const;
  [[nodiscard]] std::vector<std::uint8_t> received_hashed() const;
  [[nodiscard]] std::vector<std::uint64_t> received_digests() const;

  [[nodiscard]] std::size_t expected_index(std::size_t rank, std::size_t want) const {
    return _whole[rank][want] ? _want_tensor[rank][want] : _expected_base[rank] + want;
  }
  void expect(std::size_t index, const std::byte* data, std::uint64_t bytes);
  // The chunk offset of tensor byte `tensor_byte` of piece `piece`.
  [[nodiscard]] static std::uint64_t chunk_offset(const Piece& piece,
                                                  std::uint64_t tensor_byte) {
    return piece.chunk_offset + (tensor_byte - piece.tensor_offset);
  }
  const std::byte* gather(const weightcast::Delivery& d, const std::byte* source,
                          std::vector<std::byte>& buffer) const;
  void cast_into(std::uint32_t w, const std::byte* data, std::uint64_t local_offset,
                 std::uint64_t bytes);
  std::unique_ptr<Pending> copy_to_mine(std::uint32_t w, const std::byte* data,
                                        std::uint64_t local_offset, std::uint64_t bytes);
  [[nodiscard]] std::uint64_t send_bytes(std::size_t c) const;
  // `upload` after the slot is published: rank 0's own copies and the expected digests; the
  // lease passes into `_held` at the end.
  boost::asio::awaitable<Uploading> upload_published(std::size_t c, SlotLease& lease,
                                                     const std::byte* source);
  boost::asio::awaitable<void> upload_sends(std::size_t c, HeldSlot& held,
                                           std::vector<std::unique_ptr<Pending>>& copies);
  [[nodiscard]] std::uint64_t cast_bytes(std::size_t c) const;
  // A rank other than 0 over the node ring: its boxes of chunk `c` as copies out of the slot,
  // landing where `destination(want, local_offset, bytes)` says (a want's memory or a window);
  // with @p wants, each copy's want too, in the same order.
  template <class Destination>
  std::vector<RingCopy> ring_copies(std::size_t c, Destination&& destination,
                                    std::vector<std::uint32_t>* wants = nullptr);
  // `_spread`: the file's bytes of my want @p w a local read just read, in local order.
  void expect_mine(std::uint32_t w, const std::byte* data, std::uint64_t bytes);
  // My want @p w's bytes land in device memory (not a cast window, which is host memory).
  [[nodiscard]] bool lands_on_device(std::uint32_t w) const;
  void hash_landed(std::uint32_t w, std::uint64_t local_offset, std::uint64_t bytes);
  void land(std::uint32_t w, std::uint64_t bytes);
  void want_ready(std::uint32_t w);

  LoadContext& _load;
  const LoadPlacement& _placement;
  const int _me;
  // `transport: shm`: the node ring every rank copies its own boxes out of (rank 0 publishes
  // each slot and holds it until every other rank has released it); null otherwise.
  NodeRing* _node_ring;
  std::optional<RingPin> _pin;  // the node ring page-locked in this process (cuda)
  // Rank 0 over nccl: per slot, its chunk's sends on the device. Held here, and so freed
  // after the stages' exchanges in flight (the pipeline's) have been aborted and drained.
  std::shared_ptr<Arena> _device_sends;
  std::uint64_t _device_send_slot_bytes = 0;
  std::vector<std::byte*> _want_data;                        // my wants' destinations
  std::vector<std::vector<std::uint32_t>> _want_tensor;      // [rank][want]: tensor
  std::vector<std::vector<std::uint8_t>> _whole;             // [rank][want]: wants it whole
  std::vector<std::vector<ShardRuns>> _runs;                 // [rank][want] (rank 0: all)
  std::vector<std::int32_t> _want_of_tensor;                 // my want per tensor, or -1
  std::vector<std::uint64_t> _want_left;                     // my wants' bytes to land
  std::vector<std::optional<Dtype>> _cast_to;                // my wants' casts
  std::vector<CastState> _cast;
  std::vector<std::uint8_t> _hash_received;                  // my wants hashed as they land
  std::vector<std::uint8_t> _hash_landed;                    // ...from their host memory
  std::optional<StreamingDigests> _received;
  // One thread for device read-backs of landed wants (hash_landed); declared after what its
  // tasks use, `_hashing_failure` included, so it is stopped and joined first.
  // `_hashing_failure` is written on that thread only and read once it is joined.
  std::exception_ptr _hashing_failure;
  std::optional<boost::asio::thread_pool> _hashing;
  std::optional<StreamingDigests> _expected;                 // rank 0, expect_digests
  // `verify: digest` over local reads: every rank hashes its own wants' expected bytes as it
  // reads them from the files (not rank 0 every rank's), so the hashing is spread over the
  // ranks; rank 0 hashes only its own. Rank 0 compares each rank's two digests.
  bool _spread = false;
  std::optional<StreamingDigests> _self_expected;            // a rank other than 0, _spread
  std::vector<std::uint64_t> _self_expected_left;
  std::vector<std::uint8_t> _tensor_whole_wanted;
  std::vector<std::size_t> _expected_base;
  std::vector<std::uint64_t> _expected_left;
  PlanOrder<HeldSlot> _held{"a placed chunk reached its post unread"};  // rank 0
  std::vector<std::byte> _scratch;                           // rank 0: its own gathers
  std::vector<std::vector<std::byte>> _spare_windows;        // landed chunks' window memory
  std::vector<Transport::Range> _ranges;
  std::vector<Transport::Message> _sends;
  std::vector<Transport::Message> _receives;
};

}  // namespace weightcast::detail
