// The shm transport: the node's ranks share rank 0's staging ring; the pipeline's node ring
// delivery moves the bytes (weightcast/transport/detail/node_ring.hpp).
#include "weightcast/transport/detail/node_ring.hpp"

#include "weightcast/core/error.hpp"

#include <utility>

namespace weightcast::detail {

namespace {

class ShmTransport final : public Transport {
 public:
  ShmTransport(int rank, int world_size, NodeRing ring)
      : _rank(rank), _world_size(world_size), _ring(std::move(ring)) {}

  [[nodiscard]] std::string_view name() const noexcept override { return "shm"; }
  [[nodiscard]] int rank() const noexcept override { return _rank; }
  [[nodiscard]] int world_size() const noexcept override { return _world_size; }
  [[nodiscard]] NodeRing* node_ring() noexcept override { return &_ring; }

  // Nothing travels through the transport: a broadcast asked of it is a pipeline bug (the
  // node ring delivery copies out of the ring instead).
  std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes, int root) override {
    static_cast<void>(data);
    static_cast<void>(bytes);
    static_cast<void>(root);
    throw Error(Errc::internal, "transport shm was asked to broadcast; the node ring delivery "
                                "copies chunks out of the shared ring instead");
  }

 private:
  int _rank;
  int _world_size;
  NodeRing _ring;
};

}  // namespace

std::unique_ptr<Transport> make_shm_transport(int rank, int world_size, NodeRing ring) {
  return std::make_unique<ShmTransport>(rank, world_size, std::move(ring));
}

}  // namespace weightcast::detail
