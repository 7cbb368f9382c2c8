#include "weightcast/device/device.hpp"

#include "weightcast/device/detail/host_mapping.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/gpu_info.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <vector>

namespace weightcast {

namespace {

class HostArena final : public Arena {
 public:
  explicit HostArena(std::uint64_t bytes)
      : _memory(bytes, fmt::format("a host arena of {} bytes", bytes)) {}

  [[nodiscard]] std::byte* data() const noexcept override { return _memory.data(); }
  [[nodiscard]] std::uint64_t bytes() const noexcept override { return _memory.bytes(); }
  [[nodiscard]] MemoryKind kind() const noexcept override { return MemoryKind::host; }

 private:
  detail::HostMapping _memory;
};

/// Several uploads in flight as one: complete once each is.
class AllPending final : public Pending {
 public:
  explicit AllPending(std::vector<std::unique_ptr<Pending>> parts) : _parts(std::move(parts)) {}
  bool test() override {
    while (_done < _parts.size()) {
      if (!_parts[_done]->test()) return false;
      _parts[_done++].reset();
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<Pending>> _parts;
  std::size_t _done = 0;
};

}  // namespace

std::unique_ptr<Pending> Device::upload_all(std::span<const Copy> copies) {
  std::vector<std::unique_ptr<Pending>> parts;
  for (const Copy& copy : copies) {
    if (auto part = upload(copy.source, copy.destination, copy.bytes)) {
      parts.push_back(std::move(part));
    }
  }
  if (parts.empty()) return nullptr;
  if (parts.size() == 1) return std::move(parts.front());
  return std::make_unique<AllPending>(std::move(parts));
}

namespace {

class HostDevice final : public Device {
 public:
  [[nodiscard]] std::string_view name() const noexcept override { return "host"; }
  std::shared_ptr<Arena> allocate_arena(std::uint64_t bytes) override {
    return make_host_arena(bytes);
  }
  std::unique_ptr<Pending> upload(const std::byte* source, std::byte* destination,
                                  std::uint64_t bytes) override {
    std::memcpy(destination, source, bytes);
    return nullptr;
  }
  [[nodiscard]] bool reads_into_arena() const noexcept override { return true; }
};

}  // namespace

void Arena::read_back(std::uint64_t offset, std::uint64_t bytes,
                      const std::function<void(const std::byte*, std::size_t)>& consume) const {
  WEIGHTCAST_EXPECT(kind() == MemoryKind::host, Errc::internal,
                    "read_back: this device arena does not implement it");
  WEIGHTCAST_EXPECT(offset <= this->bytes() && bytes <= this->bytes() - offset, Errc::internal,
                    fmt::format("read_back: [{}, +{}) leaves the arena of {} bytes", offset, bytes,
                                this->bytes()));
  if (bytes > 0) consume(data() + offset, bytes);
}

std::shared_ptr<Arena> make_host_arena(std::uint64_t bytes) {
  return std::make_shared<HostArena>(bytes);
}

std::unique_ptr<Device> make_host_device() { return std::make_unique<HostDevice>(); }

int cuda_device_count() noexcept { return probe_cuda().device_count; }

#ifndef WEIGHTCAST_HAVE_CUDA
std::unique_ptr<Device> make_cuda_device(int ordinal) {
  throw Error(Errc::unavailable,
              fmt::format("cuda:{}: this build has no CUDA (rebuild with -DWEIGHTCAST_CUDA=ON, or "
                          "use device: host or auto)",
                          ordinal));
}
#endif

std::unique_ptr<Device> make_device(DeviceKind kind, int local_rank) {
  switch (kind) {
    case DeviceKind::host:
      return make_host_device();
    case DeviceKind::cuda:
      break;
    case DeviceKind::automatic: {
      const CudaProbe probe = probe_cuda();
      if (probe.device_count > 0) break;
      spdlog::info("device: auto: using host memory: {}",
                   probe.error.empty() ? std::string("no CUDA device") : probe.error);
      return make_host_device();
    }
  }
  const CudaProbe probe = probe_cuda();
  // No usable device: make_cuda_device says why (the CUDA error, or a build without CUDA).
  if (!built_with_cuda() || probe.device_count == 0) return make_cuda_device(local_rank);
  return make_cuda_device(cuda_ordinal_for_local_rank(local_rank, probe.device_count));
}

}  // namespace weightcast
