#include "weightcast/io/detail/staging_ring.hpp"

#include "weightcast/device/device.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
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
                         std::uint64_t slot_bytes, weightcast::Device* device)
    : _slots(std::max<std::size_t>(slots, static_cast<std::size_t>(setting::buffer_depth.min))),
      _slot_freed(executor) {
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  // Near 2^64 the page rounding and the product wrap (to a ring mapping nothing, or less than
  // its slots): no address space holds such a ring, so say so as mmap(2) would.
  std::uint64_t rounded = 0;
  std::uint64_t total = 0;
  if (__builtin_add_overflow(std::max<std::uint64_t>(slot_bytes, 1), page - 1, &rounded) ||
      __builtin_mul_overflow(static_cast<std::uint64_t>(_slots), rounded / page * page,
                             &total)) {
    throw system_error(Errc::unavailable, ENOMEM,
                       fmt::format("cannot allocate the staging ring ({} slots of {} bytes): "
                                   "more than 2^64 bytes",
                                   _slots, slot_bytes));
  }
  _slot_bytes = rounded / page * page;
  _memory = HostMapping(total, fmt::format("the staging ring ({} slots of {} bytes)", _slots,
                                           _slot_bytes));
  _base = _memory.data();
  if (device != nullptr && device->wants_pinned_staging()) pin_slots(*device);
  _leased.assign(_slots, false);
  // Slot 0 first: the first reads fill the ring in address order.
  for (std::size_t i = _slots; i > 0; --i) _free.push_back(i - 1);
}

StagingRing::StagingRing(const boost::asio::any_io_executor& executor, std::size_t slots,
                         std::uint64_t slot_bytes, std::byte* memory)
    : _slots(std::max<std::size_t>(slots, 1)), _slot_bytes(slot_bytes), _base(memory),
      _slot_freed(executor) {
  _leased.assign(_slots, false);
  for (std::size_t i = _slots; i > 0; --i) _free.push_back(i - 1);
}

// Fewer pinned slots beat pageable ones: an async H2D copy from pageable memory goes through
// a driver bounce buffer and does not overlap with the read stage.
void StagingRing::pin_slots(weightcast::Device& device) {
  std::string first_refusal;
  for (std::size_t slots = _slots; slots >= 1; slots /= 2) {
    try {
      device.pin(_memory.data(), slots * _slot_bytes);
    } catch (const Error& e) {
      if (first_refusal.empty()) first_refusal = e.what();
      continue;
    }
    _pinned_by = &device;
    if (slots < _slots) {
      spdlog::warn("pinned host memory: could not pin {} staging slots of {} bytes ({}); "
                   "staging with {} pinned slot{} instead (raise `ulimit -l` or lower "
                   "buffer_depth / chunk_size)",
                   _slots, _slot_bytes, first_refusal, slots, slots == 1 ? "" : "s");
      _memory.shrink(slots * _slot_bytes);
      _base = _memory.data();
      _slots = slots;
    }
    return;
  }
  spdlog::warn("pinned host memory: could not pin even one staging slot of {} bytes ({}); "
               "staging from pageable host memory: H2D copies will be slower (raise `ulimit "
               "-l` or lower chunk_size)",
               _slot_bytes, first_refusal);
}

StagingRing::~StagingRing() {
  // Every lease is back, so no copy reads a slot any more: safe to unpin.
  if (_pinned_by != nullptr) _pinned_by->unpin(_memory.data());
}

boost::asio::awaitable<void> StagingRing::wait_for_give_back() {
  namespace asio = boost::asio;
  // The timer never expires: give_back() cancels the wait, as does cancelling this
  // coroutine (the awaitable operators do when another stage fails).
  _slot_freed.expires_at(asio::steady_timer::time_point::max());
  boost::system::error_code ec;
  co_await _slot_freed.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none) {
    throw boost::system::system_error(asio::error::operation_aborted);
  }
}

boost::asio::awaitable<SlotLease> StagingRing::acquire() {
  while (_free.empty()) co_await wait_for_give_back();
  const std::size_t index = _free.back();
  _free.pop_back();
  _leased[index] = true;
  co_return SlotLease(this, index);
}

boost::asio::awaitable<void> StagingRing::all_given_back() {
  while (_free.size() < _slots) co_await wait_for_give_back();
}

void StagingRing::give_back(std::size_t index) noexcept {
  // Each slot has at most one lease: a second return is a bug in the caller.
  if (index >= _slots || !_leased[index]) {
    spdlog::error("internal error: staging slot {} returned twice", index);
    return;
  }
  _leased[index] = false;
  _free.push_back(index);
  try {
    _slot_freed.cancel();  // wakes a waiting acquire(); the timer service never fails here
  } catch (...) {
  }
}

}  // namespace weightcast::detail
