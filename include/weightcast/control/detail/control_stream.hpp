/**
 * @file control/detail/control_stream.hpp
 * @brief The two awaitables every control-plane write is made of, in the rendezvous and in
 *        the session: a frame written whole, and a bound of running time to race it against
 *        (`co_await (write_frame(...) || expire(...))`, as Asio's C++20 chat server writes).
 *        Boost.Asio inside: only control/'s sources include this header.
 */
#pragma once

#include "weightcast/control/detail/control_io.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string_view>

namespace weightcast::detail {

/**
 * @brief Writes all of @p bytes to @p socket.
 * @param sent counts the bytes that went, also when the write is cancelled (lost a race):
 *        a frame cut after its first byte leaves the stream mid-frame.
 * @return the error that ended the write early; none once every byte went.
 * @note Returns its error rather than throwing: a coroutine raced with `||` that throws
 *       makes the race wait for the other side.
 */
inline boost::asio::awaitable<boost::system::error_code> write_frame(
    boost::asio::ip::tcp::socket& socket, std::string_view bytes, std::size_t& sent) {
  while (sent < bytes.size()) {
    auto [error, n] = co_await socket.async_write_some(
        boost::asio::buffer(bytes.data() + sent, bytes.size() - sent),
        boost::asio::as_tuple(boost::asio::use_awaitable));
    sent += n;
    if (error) co_return error;
  }
  co_return boost::system::error_code{};
}

/**
 * @brief Returns once @p most of the time this process ran has passed: it waits in steps of
 *        at most a second, and a step that ended far later than asked (the process was
 *        stopped, or starved) moves the end on by the overrun, as every control-plane wait
 *        counts time (`overrun`).
 * @throws boost::system::system_error when cancelled, i.e. when the race is lost.
 */
inline boost::asio::awaitable<void> expire(ControlClock::duration most) {
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  auto until = ControlClock::now() + most;
  while (ControlClock::now() < until) {
    const auto begin = ControlClock::now();
    const auto step = std::min<ControlClock::duration>(until - begin, std::chrono::seconds(1));
    timer.expires_after(step);
    co_await timer.async_wait(boost::asio::use_awaitable);
    until += overrun(ControlClock::now() - begin, step);
  }
}

}  // namespace weightcast::detail
