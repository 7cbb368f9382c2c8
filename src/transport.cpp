#include "weightcast/transport.hpp"

namespace weightcast {
namespace {

class LocalTransport final : public Transport {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "local"; }
  [[nodiscard]] int rank() const noexcept override { return 0; }
  [[nodiscard]] int world_size() const noexcept override { return 1; }
  std::unique_ptr<Pending> broadcast(std::byte*, std::uint64_t, int) override { return nullptr; }
};

}  // namespace

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

}  // namespace weightcast
