#include "weightcast/device/detail/host_mapping.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <cerrno>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>

namespace weightcast::detail {

HostMapping::HostMapping(std::uint64_t bytes, std::string_view what) : _bytes(bytes) {
  if (bytes == 0) return;
  // One huge page more than asked, so that the memory can start on a huge-page boundary. Near
  // 2^64 that sum wraps: no address space holds such a mapping, so say so as mmap(2) would.
  if (bytes > ~std::uint64_t{0} - huge_page_bytes) {
    _bytes = 0;
    throw system_error(Errc::unavailable, ENOMEM, fmt::format("cannot allocate {}", what));
  }
  _mapped = bytes + huge_page_bytes;
  void* p = mmap(nullptr, _mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw system_error(Errc::unavailable, errno, fmt::format("cannot allocate {}", what));
  }
  _mapping = static_cast<std::byte*>(p);
  const auto address = reinterpret_cast<std::uintptr_t>(_mapping);
  _data = _mapping + (huge_page_bytes - address % huge_page_bytes) % huge_page_bytes;
  // No MADV_HUGEPAGE: the system's THP policy decides. Where it is `madvise`, advised memory
  // faulted in faster when the kernel had free huge pages and several times slower when it
  // had to zero fresh ones, so each load (a fresh arena) swung by seconds (bench/RESULTS.md).
  // Where the policy is `always`, the 2 MiB alignment lets the kernel use huge pages all the
  // same.
}

HostMapping::~HostMapping() { release(); }

HostMapping::HostMapping(HostMapping&& other) noexcept
    : _mapping(std::exchange(other._mapping, nullptr)),
      _mapped(std::exchange(other._mapped, 0)),
      _data(std::exchange(other._data, nullptr)),
      _bytes(std::exchange(other._bytes, 0)) {}

HostMapping& HostMapping::operator=(HostMapping&& other) noexcept {
  if (this != &other) {
    release();
    _mapping = std::exchange(other._mapping, nullptr);
    _mapped = std::exchange(other._mapped, 0);
    _data = std::exchange(other._data, nullptr);
    _bytes = std::exchange(other._bytes, 0);
  }
  return *this;
}

void HostMapping::shrink(std::uint64_t bytes) noexcept {
  if (_mapping == nullptr || bytes >= _bytes) return;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t keep = (_data - _mapping) + (bytes + page - 1) / page * page;
  if (keep < _mapped) munmap(_mapping + keep, _mapped - keep);
  _mapped = keep;
  _bytes = bytes;
}

void HostMapping::release() noexcept {
  if (_mapping != nullptr) munmap(_mapping, _mapped);
  _mapping = nullptr;
  _data = nullptr;
  _mapped = _bytes = 0;
}

}  // namespace weightcast::detail
