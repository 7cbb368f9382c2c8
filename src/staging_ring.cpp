#include "weightcast/detail/staging_ring.hpp"

#include "weightcast/error.hpp"

#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>

#include <cerrno>
#include <cstdio>
#include <sys/mman.h>
#include <unistd.h>

namespace weightcast::detail {

SlotLease& SlotLease::operator=(SlotLease&& other) noexcept {
  if (this != &other) {
    if (_ring != nullptr) _ring->give_back(_index);
    _ring = other._ring;
    _index = other._index;
    other._ring = nullptr;
  }
  return *this;
}

SlotLease::~SlotLease() {
  if (_ring != nullptr) _ring->give_back(_index);
}

std::byte* SlotLease::data() const noexcept { return _ring->slot_data(_index); }

StagingRing::StagingRing(const boost::asio::any_io_executor& executor, std::size_t slots,
                         std::uint64_t slot_bytes)
    : _slots(slots == 0 ? 1 : slots), _free(executor, _slots) {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  _slot_bytes = (std::max<std::uint64_t>(slot_bytes, 1) + page - 1) / page * page;
  void* p = mmap(nullptr, _slots * _slot_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw system_error(Errc::unavailable, errno,
                       fmt::format("cannot allocate the staging ring ({} slots of {} bytes)",
                                   _slots, _slot_bytes));
  }
  _memory = static_cast<std::byte*>(p);
  for (std::size_t i = 0; i < _slots; ++i) _free.try_send(boost::system::error_code{}, i);
}

StagingRing::~StagingRing() {
  if (_memory != nullptr) munmap(_memory, _slots * _slot_bytes);
}

boost::asio::awaitable<SlotLease> StagingRing::acquire() {
  std::size_t index = co_await _free.async_receive(boost::asio::use_awaitable);
  co_return SlotLease(this, index);
}

void StagingRing::give_back(std::size_t index) noexcept {
  // Never fails: at most `_slots` leases exist and the channel holds `_slots` entries.
  if (!_free.try_send(boost::system::error_code{}, index)) {
    std::fprintf(stderr, "weightcast: internal error: staging slot %zu returned twice\n", index);
  }
}

}  // namespace weightcast::detail
