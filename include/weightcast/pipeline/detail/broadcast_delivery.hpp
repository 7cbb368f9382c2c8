/**
 * @file broadcast_delivery.hpp
 * @brief The delivery of a load without placement: every rank receives every byte into its
 *        arena, one grouped broadcast per chunk; `destination: discard` hashes the chunks on
 *        rank 0 instead (`DiscardDelivery`).
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE (delivery.hpp).
 */
#pragma once

#include "weightcast/pipeline/detail/delivery.hpp"
#include "weightcast/pipeline/digest.hpp"

#include <optional>

namespace weightcast::detail {

class BroadcastDelivery : public Delivery {
 public:
  explicit BroadcastDelivery(LoadContext& load);

  void start() override;
  [[nodiscard]] ReadPolicy read_policy() const override;
  boost::asio::awaitable<Uploading> upload(std::size_t c, SlotLease lease,
                                           const Slot& slot) override;
  InFlight post(std::size_t c, bool root) override;
  void landed(InFlight& landed) override;
  void report(LoadResult& result) const override { static_cast<void>(result); }

 protected:
  // Where tensor `t` is, for its hook.
  [[nodiscard]] virtual std::byte* tensor_data(std::uint32_t t) const;
  void tensor_ready(std::uint32_t t);

  LoadContext& _load;

 private:
  std::vector<std::uint32_t> _landed;          // pieces landed per tensor
  std::vector<Device::Copy> _piece_copies;     // the chunk being uploaded, by piece
  std::vector<Transport::Range> _ranges;       // the chunk being broadcast
};

/// `destination: discard` (one rank): each chunk is hashed as it passes, then dropped.
class DiscardDelivery final : public BroadcastDelivery {
 public:
  explicit DiscardDelivery(LoadContext& load);

  void start() override;
  [[nodiscard]] ReadPolicy read_policy() const override;
  boost::asio::awaitable<Uploading> upload(std::size_t c, SlotLease lease,
                                           const Slot& slot) override;
  InFlight post(std::size_t c, bool root) override;
  void report(LoadResult& result) const override;

 private:
  [[nodiscard]] std::byte* tensor_data(std::uint32_t t) const override;

  std::optional<StreamingDigests> _digests;  // unless verify: none
};

}  // namespace weightcast::detail
