#include "weightcast/transport/transport.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <vector>

namespace weightcast {
namespace {

class LocalTransport final : public Transport {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "local"; }
  [[nodiscard]] int rank() const noexcept override { return 0; }
  [[nodiscard]] int world_size() const noexcept override { return 1; }
  std::unique_ptr<Pending> broadcast(std::byte*, std::uint64_t, int) override { return nullptr; }
};

/// Several operations in flight, complete when all are.
class AllOf final : public Pending {
 public:
  explicit AllOf(std::vector<std::unique_ptr<Pending>> parts) : _parts(std::move(parts)) {}
  bool test() override {
    while (!_parts.empty()) {
      if (!_parts.back()->test()) return false;
      _parts.pop_back();
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<Pending>> _parts;
};

}  // namespace

std::unique_ptr<Pending> Transport::exchange(std::span<const Message> sends,
                                             std::span<const Message> receives, int) {
  if (sends.empty() && receives.empty()) return nullptr;
  throw Error(Errc::config, fmt::format("transport {}: cannot deliver slices point to point "
                                        "(transports mpi and nccl can)",
                                        name()));
}

std::unique_ptr<Pending> Transport::broadcast_group(std::span<const Range> ranges, int root,
                                                    void* /*ready_event*/) {
  std::vector<std::unique_ptr<Pending>> in_flight;
  for (const Range& range : ranges) {
    if (auto pending = broadcast(range.data, range.bytes, root)) {
      in_flight.push_back(std::move(pending));
    }
  }
  if (in_flight.empty()) return nullptr;
  if (in_flight.size() == 1) return std::move(in_flight.front());
  return std::make_unique<AllOf>(std::move(in_flight));
}

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

#ifndef WEIGHTCAST_HAVE_CUDA
NcclUniqueId nccl_unique_id() {
  throw Error(Errc::unavailable,
              "transport: nccl: this build has no CUDA (rebuild with -DWEIGHTCAST_CUDA=ON)");
}

std::unique_ptr<Transport> make_nccl_transport(int, int, int, const NcclUniqueId&,
                                               std::chrono::milliseconds) {
  throw Error(Errc::unavailable,
              "transport: nccl: this build has no CUDA (rebuild with -DWEIGHTCAST_CUDA=ON)");
}

std::pair<int, int> nccl_rank_and_size(const NcclCommunicator&) {
  throw Error(Errc::unavailable,
              "transport: nccl: this build has no CUDA (rebuild with -DWEIGHTCAST_CUDA=ON)");
}

std::unique_ptr<Transport> make_nccl_transport(const NcclCommunicator&,
                                               std::chrono::milliseconds) {
  throw Error(Errc::unavailable,
              "transport: nccl: this build has no CUDA (rebuild with -DWEIGHTCAST_CUDA=ON)");
}
#endif

}  // namespace weightcast
