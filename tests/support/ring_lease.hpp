// Leasing a staging ring slot from a test, outside any pipeline (test_staging_ring.cpp,
// test_in_flight.cpp).
#pragma once

#include "weightcast/io/detail/staging_ring.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include <optional>
#include <utility>

namespace weightcast::test {

/// Leases one slot of @p ring, running @p context until it is had (REQUIREs that it is).
inline detail::SlotLease lease_now(boost::asio::io_context& context, detail::StagingRing& ring) {
  std::optional<detail::SlotLease> got;
  boost::asio::co_spawn(
      context, [&]() -> boost::asio::awaitable<void> { got = co_await ring.acquire(); },
      boost::asio::detached);
  context.restart();
  context.run();
  REQUIRE(got.has_value());
  return std::move(*got);
}

}  // namespace weightcast::test
