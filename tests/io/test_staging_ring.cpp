// The staging ring on its own (io/detail/staging_ring.hpp): leases, their order, the wait when
// every slot is leased, cancellation, and the ring's size. Pinning against a device that
// refuses it is tested in tests/device/test_gpu.cpp beside the GPU's own.
#include "weightcast/io/detail/staging_ring.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/device/device.hpp"

#include "support/ring_lease.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <fmt/core.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <set>
#include <utility>
#include <vector>

using namespace weightcast;
using detail::SlotLease;
using detail::StagingRing;
using test::lease_now;

TEST_CASE("staging ring: slots are page-aligned, disjoint, rounded up to the page",
          "[staging]") {
  boost::asio::io_context context;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  StagingRing ring(context.get_executor(), 3, page + 1);
  CHECK(ring.slots() == 3);
  CHECK(ring.slot_bytes() == 2 * page);
  CHECK(ring.total_bytes() == 6 * page);
  CHECK_FALSE(ring.pinned());
  std::set<std::byte*> starts;
  for (std::size_t i = 0; i < ring.slots(); ++i) {
    std::byte* data = ring.slot_data(i);
    CHECK(reinterpret_cast<std::uintptr_t>(data) % page == 0);
    starts.insert(data);
    // Every byte of every slot is the ring's to write.
    std::memset(data, static_cast<int>(i + 1), ring.slot_bytes());
  }
  CHECK(starts.size() == 3);
  for (std::size_t i = 0; i < ring.slots(); ++i) {
    CHECK(ring.slot_data(i)[0] == std::byte(i + 1));
    CHECK(ring.slot_data(i)[ring.slot_bytes() - 1] == std::byte(i + 1));
  }
  SECTION("0 slots and 0 bytes are one slot of one page") {
    StagingRing small(context.get_executor(), 0, 0);
    CHECK(small.slots() == 1);
    CHECK(small.slot_bytes() == page);
  }
  SECTION("a host device asks for no pinning") {
    auto device = make_host_device();
    StagingRing pinned(context.get_executor(), 2, page, device.get());
    CHECK_FALSE(pinned.pinned());
  }
}

TEST_CASE("staging ring: slots × slot size past 2^64 bytes fails with 69 naming both",
          "[staging]") {
  // The page rounding of the slot size and the product with the slot count wrapped: a slot
  // of 2^64 - 1 bytes rounded to 0 and the ring mapped nothing; 2^20 slots of 2^50 bytes
  // made 2^70, mapped as 0. Every slot then pointed at memory the ring did not hold.
  boost::asio::io_context context;
  const std::vector<std::pair<std::size_t, std::uint64_t>> sizes = {
      {1, ~std::uint64_t{0}},
      {2, ~std::uint64_t{0} - 5000},
      {std::size_t{1} << 20, std::uint64_t{1} << 50},
      {~std::size_t{0}, 4096},
  };
  for (const auto& [slots, slot_bytes] : sizes) {
    INFO(slots << " slots of " << slot_bytes << " bytes");
    try {
      StagingRing ring(context.get_executor(), slots, slot_bytes);
      FAIL("a ring of " << ring.slots() << " slots of " << ring.slot_bytes() << " bytes");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
      CHECK_THAT(e.what(), Catch::Contains(fmt::format(
                               "cannot allocate the staging ring ({} slots of {} bytes", slots,
                               slot_bytes)));
    }
  }
}

TEST_CASE("staging ring: the slot given back last is leased next, and all_given_back waits "
          "for every lease",
          "[staging]") {
  // A read that completes at submit is paced to one slot (the loader's read stage): that
  // only reuses one buffer, as dd does, if the ring hands back the slot freed last.
  boost::asio::io_context context;
  StagingRing ring(context.get_executor(), 3, 4096);
  SlotLease a = lease_now(context, ring);
  SlotLease b = lease_now(context, ring);
  CHECK(a.index() == 0);
  CHECK(b.index() == 1);
  CHECK(a.data() == ring.slot_data(0));
  const std::size_t first = a.index();
  const std::size_t second = b.index();
  a = SlotLease{};
  b = SlotLease{};
  CHECK(lease_now(context, ring).index() == second);  // back again at once
  SlotLease c = lease_now(context, ring);
  CHECK(c.index() == second);
  SlotLease d = lease_now(context, ring);
  CHECK(d.index() == first);

  bool all_back = false;
  boost::asio::co_spawn(
      context,
      [&]() -> boost::asio::awaitable<void> {
        co_await ring.all_given_back();
        all_back = true;
      },
      boost::asio::detached);
  context.restart();
  context.poll();
  CHECK_FALSE(all_back);  // two leases still held
  c = SlotLease{};
  context.poll();
  CHECK_FALSE(all_back);
  d = SlotLease{};
  context.run();
  CHECK(all_back);
}

TEST_CASE("staging ring: acquire waits while every slot is leased, and a given-back slot "
          "wakes it",
          "[staging]") {
  boost::asio::io_context context;
  StagingRing ring(context.get_executor(), 2, 4096);
  SlotLease a = lease_now(context, ring);
  SlotLease b = lease_now(context, ring);
  std::optional<SlotLease> waiting;
  boost::asio::co_spawn(
      context, [&]() -> boost::asio::awaitable<void> { waiting = co_await ring.acquire(); },
      boost::asio::detached);
  context.restart();
  context.poll();
  CHECK_FALSE(waiting.has_value());  // the backpressure: no third slot
  SECTION("moving a lease keeps the slot leased") {
    SlotLease moved = std::move(a);
    context.poll();
    CHECK_FALSE(waiting.has_value());
    moved = SlotLease{};
    context.run();
    REQUIRE(waiting.has_value());
    CHECK(waiting->index() == 0);
  }
  SECTION("a released lease gives nothing back") {
    CHECK(b.release() == 1);
    b = SlotLease{};
    context.poll();
    CHECK_FALSE(waiting.has_value());
    a = SlotLease{};
    context.run();
    REQUIRE(waiting.has_value());
    CHECK(waiting->index() == 0);
    // The released slot is the caller's to give back, once, by index.
    SlotLease adopted(&ring, 1);
  }
}

TEST_CASE("staging ring: a cancelled acquire leaves the ring whole", "[staging]") {
  // A stage fails while the read stage waits for a slot: the wait is cancelled, and every
  // slot must still come back (an Asio channel's send side stayed blocked here).
  boost::asio::io_context context;
  StagingRing ring(context.get_executor(), 1, 4096);
  std::optional<SlotLease> held = lease_now(context, ring);
  boost::asio::cancellation_signal cancel;
  std::exception_ptr failure;
  bool ended = false;
  boost::asio::co_spawn(
      context,
      [&]() -> boost::asio::awaitable<void> { static_cast<void>(co_await ring.acquire()); },
      boost::asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
        failure = e;
        ended = true;
      }));
  context.restart();
  context.poll();
  CHECK_FALSE(ended);
  cancel.emit(boost::asio::cancellation_type::all);
  context.poll();
  REQUIRE(ended);
  REQUIRE(failure);
  try {
    std::rethrow_exception(failure);
  } catch (const boost::system::system_error& e) {
    CHECK(e.code() == boost::asio::error::operation_aborted);
  }
  held.reset();
  CHECK(lease_now(context, ring).index() == 0);
}
