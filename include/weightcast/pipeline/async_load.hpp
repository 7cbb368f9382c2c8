/**
 * @file async_load.hpp
 * @brief The coroutine form of `load`, for trainers that already run a Boost.Asio loop.
 *
 * Include only where you use it: Boost.Asio is heavy to compile. (weightcast/distributed/asio.hpp
 * includes it beside the coroutine form of `run_job`.)
 */
#pragma once

#include "weightcast/pipeline/loader.hpp"

#include <boost/asio/awaitable.hpp>

namespace weightcast {

/**
 * @brief Loads @p catalogue on a strand of the calling coroutine's executor; other work on
 *        that `io_context` keeps running while chunks stream.
 *
 * The executor may run handlers on several threads (an `io_context` run by a thread pool):
 * the strand keeps the load's stages, and so its `LoadOptions` hooks, to one at a time,
 * though not always on the same thread.
 *
 * @p device and @p transport must outlive the returned awaitable.
 * @throws Error as the blocking `load` does.
 */
boost::asio::awaitable<LoadResult> async_load(Catalogue catalogue, Device& device,
                                              Transport& transport, LoadOptions options = {});

}  // namespace weightcast
