#include "weightcast/device.hpp"

#include "weightcast/error.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <cstring>
#include <sys/mman.h>

namespace weightcast {
namespace {

class HostArena final : public Arena {
 public:
  explicit HostArena(std::uint64_t bytes) : _bytes(bytes) {
    if (bytes == 0) return;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      throw system_error(Errc::unavailable, errno,
                         fmt::format("cannot allocate a host arena of {} bytes", bytes));
    }
    _data = static_cast<std::byte*>(p);
  }
  ~HostArena() override {
    if (_data != nullptr) munmap(_data, _bytes);
  }
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  [[nodiscard]] std::byte* data() const noexcept override { return _data; }
  [[nodiscard]] std::uint64_t bytes() const noexcept override { return _bytes; }
  [[nodiscard]] MemoryKind kind() const noexcept override { return MemoryKind::host; }

 private:
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
};

}  // namespace

std::shared_ptr<Arena> make_host_arena(std::uint64_t bytes) {
  return std::make_shared<HostArena>(bytes);
}

std::unique_ptr<Device> make_host_device() { return std::make_unique<HostDevice>(); }

}  // namespace weightcast
