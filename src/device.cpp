#include "weightcast/device.hpp"

#include "weightcast/error.hpp"
#include "weightcast/gpu_info.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>
#include <sys/mman.h>

namespace weightcast {
namespace {

class HostArena final : public Arena {
 public:
  explicit HostArena(std::uint64_t bytes) : _bytes(bytes) {
    if (bytes == 0) return;
    // Map a huge page more than asked, so that the arena can start on a huge-page boundary.
    _mapped = bytes + huge_page;
    void* p = mmap(nullptr, _mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw system_error(Errc::unavailable, errno,
                         fmt::format("cannot allocate a host arena of {} bytes", bytes));
    }
    _mapping = static_cast<std::byte*>(p);
    const auto address = reinterpret_cast<std::uintptr_t>(_mapping);
    _data = _mapping + ((huge_page - address % huge_page) % huge_page);
    // Transparent huge pages: a fresh arena is written once, end to end, and 4 KiB pages
    // cost a fault each (about 1 s/GiB on a VM; 0.25 s/GiB with 2 MiB pages). Advice only:
    // where THP is off (`never`) or unsupported the arena keeps small pages.
    if (bytes >= huge_page) madvise(_data, bytes, MADV_HUGEPAGE);
  }
  ~HostArena() override {
    if (_mapping != nullptr) munmap(_mapping, _mapped);
  }
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  [[nodiscard]] std::byte* data() const noexcept override { return _data; }
  [[nodiscard]] std::uint64_t bytes() const noexcept override { return _bytes; }
  [[nodiscard]] MemoryKind kind() const noexcept override { return MemoryKind::host; }

 private:
  static constexpr std::uint64_t huge_page = 2ull << 20;
  std::byte* _mapping = nullptr;
  std::uint64_t _mapped = 0;
  std::byte* _data = nullptr;
  std::uint64_t _bytes;
};

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
      return make_cuda_device(local_rank);
    case DeviceKind::automatic:
      break;
  }
  const CudaProbe probe = probe_cuda();
  if (probe.device_count > 0) return make_cuda_device(local_rank);
  spdlog::info("device: auto: using host memory: {}",
               probe.error.empty() ? std::string("no CUDA device") : probe.error);
  return make_host_device();
}

}  // namespace weightcast
