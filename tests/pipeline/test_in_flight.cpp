// The pipeline's in-flight bookkeeping (pipeline/detail/in_flight.hpp), as the Run:ai streamer
// tests its inflight chunks: records leave in plan order or fail loudly, hold their slot
// until they are done with, and a chunk's cast windows are packed, bounded and reused.
#include "weightcast/pipeline/detail/in_flight.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/io/detail/staging_ring.hpp"

#include "support/ring_lease.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include <cstdint>
#include <exception>
#include <string>
#include <optional>
#include <vector>

using namespace weightcast;
using detail::HeldSlot;
using detail::InFlight;
using detail::PlanOrder;
using detail::SlotLease;
using detail::StagingRing;
using detail::Uploading;
using test::lease_now;

namespace {

// Whether @p ring has every slot back, without waiting: the wait is cancelled when it does
// not end at once, so no waiter outlives the check.
bool all_back(boost::asio::io_context& context, StagingRing& ring) {
  bool back = false;
  bool ended = false;
  boost::asio::cancellation_signal cancel;
  boost::asio::co_spawn(
      context,
      [&]() -> boost::asio::awaitable<void> {
        co_await ring.all_given_back();
        back = true;
      },
      boost::asio::bind_cancellation_slot(cancel.slot(),
                                          [&](std::exception_ptr) { ended = true; }));
  context.restart();
  context.poll();
  if (!ended) {
    cancel.emit(boost::asio::cancellation_type::all);
    context.poll();
  }
  REQUIRE(ended);
  return back;
}

}  // namespace

TEST_CASE("in flight: records leave in plan order, and out of order is an internal error",
          "[pipeline][in-flight]") {
  PlanOrder<InFlight> posted("broadcasts landed out of order");
  CHECK(posted.empty());
  for (std::size_t c = 0; c < 3; ++c) {
    InFlight record;
    record.chunk = c;
    posted.push(std::move(record));
  }
  CHECK(posted.size() == 3);
  // A reference to the oldest stays valid while records are pushed behind it.
  InFlight& oldest = posted.front(0);
  for (std::size_t c = 3; c < 40; ++c) {
    InFlight record;
    record.chunk = c;
    posted.push(std::move(record));
  }
  CHECK(&oldest == &posted.front(0));
  CHECK(posted.take(0).chunk == 0);
  try {
    static_cast<void>(posted.take(2));
    FAIL("chunk 2 taken before chunk 1");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::internal);
    CHECK(std::string(e.what()) == "broadcasts landed out of order");
  }
  CHECK(posted.size() == 39);  // the refused take left chunk 1 in place
  for (std::size_t c = 1; c < 40; ++c) CHECK(posted.take(c).chunk == c);
  CHECK(posted.empty());
  CHECK_THROWS_AS(posted.front(40), Error);  // nothing left to take
}

TEST_CASE("in flight: an upload's slot is leased until its record is taken and dropped",
          "[pipeline][in-flight]") {
  boost::asio::io_context context;
  StagingRing ring(context.get_executor(), 2, 4096);
  PlanOrder<Uploading> uploading("chunks reached upload completion out of order");
  for (std::size_t c = 0; c < 2; ++c) {
    Uploading record;
    record.chunk = c;
    record.lease = lease_now(context, ring);
    uploading.push(std::move(record));
  }
  CHECK_FALSE(all_back(context, ring));
  // The completion stage waits on the front record's copies while it stays queued.
  CHECK(uploading.front(0).lease.index() == 0);
  CHECK_FALSE(all_back(context, ring));
  {
    Uploading done = uploading.take(0);
    CHECK(done.lease.index() == 0);
  }
  // Slot 0 is free again, slot 1 still leased by chunk 1's record.
  SlotLease next = lease_now(context, ring);
  CHECK(next.index() == 0);
  next = SlotLease{};
  SECTION("dropping the queue gives every slot back (a failed load)") {
    { PlanOrder<Uploading> dropped = std::move(uploading); }
    CHECK(all_back(context, ring));
  }
  SECTION("a placed chunk's record holds no slot: the held slot does") {
    Uploading placed;  // what a placed upload hands on
    placed.chunk = 2;
    CHECK(placed.copies.empty());
    PlanOrder<HeldSlot> held("a placed chunk reached its post unread");
    HeldSlot slot;
    slot.chunk = 1;
    slot.lease = std::move(uploading.front(1).lease);
    slot.source = slot.lease.data();
    held.push(std::move(slot));
    static_cast<void>(uploading.take(1));
    CHECK_FALSE(all_back(context, ring));
    try {
      static_cast<void>(held.take(2));
      FAIL("chunk 2 posted before chunk 1");
    } catch (const Error& e) {
      CHECK(std::string(e.what()) == "a placed chunk reached its post unread");
    }
    // The post moves the lease into the chunk's InFlight: the slot stays leased until the
    // sends have completed.
    InFlight posted;
    posted.chunk = 1;
    posted.lease = held.take(1).lease;
    CHECK(held.empty());
    CHECK(posted.lease.data() == ring.slot_data(1));
    CHECK_FALSE(all_back(context, ring));
    posted = InFlight{};
    CHECK(all_back(context, ring));
  }
}

TEST_CASE("in flight: cast windows are packed within the chunk's bytes and reused",
          "[pipeline][in-flight]") {
  std::vector<std::vector<std::byte>> spare;
  InFlight first;
  first.chunk = 7;
  std::byte* a = first.add_window(3, 100, 10, 16, spare);
  std::byte* b = first.add_window(4, 0, 6, 16, spare);
  CHECK(first.window_memory.size() == 16);
  CHECK(a == first.window_memory.data());
  CHECK(b == a + 10);
  REQUIRE(first.windows.size() == 2);
  CHECK(first.windows[0].want == 3);
  CHECK(first.windows[0].local_offset == 100);
  CHECK(first.windows[0].at == 0);
  CHECK(first.windows[1].want == 4);
  CHECK(first.windows[1].at == 10);
  try {
    first.add_window(5, 0, 1, 16, spare);
    FAIL("a window past the chunk's cast bytes");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::internal);
    CHECK(std::string(e.what()) == "chunk 7's cast windows exceed 16 bytes");
  }
  const std::byte* memory = first.window_memory.data();
  first.recycle_windows(spare);
  CHECK(first.windows.empty());
  REQUIRE(spare.size() == 1);

  SECTION("the next chunk's windows reuse the landed chunk's memory") {
    InFlight second;
    second.chunk = 8;
    CHECK(second.add_window(1, 0, 8, 12, spare) == memory);
    CHECK(spare.empty());
    CHECK(second.window_memory.size() >= 12);
    CHECK(second.add_window(1, 8, 4, 12, spare) == memory + 8);
  }
  SECTION("a chunk with more cast bytes grows it once, before any window points into it") {
    InFlight second;
    second.chunk = 8;
    std::byte* first_window = second.add_window(1, 0, 8, 64, spare);
    CHECK(second.window_memory.size() == 64);
    CHECK(second.add_window(2, 0, 56, 64, spare) == first_window + 8);
  }
  SECTION("a chunk with no cast wants takes no memory") {
    InFlight second;
    second.recycle_windows(spare);
    CHECK(spare.size() == 1);
  }
}
