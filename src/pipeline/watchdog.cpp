// The pipeline's watchdog (a load that makes no progress for `timeout` fails; LoadOptions::stop
// ends it) and how often the landing stage polls.
#include "weightcast/pipeline/detail/pipeline.hpp"

#include "weightcast/core/error.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>

#include <algorithm>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;

// Ends the load when no stage has made progress for `timeout`: nothing waits forever.
awaitable<void> Pipeline::watchdog() {
  const auto tick = std::min<Clock::duration>(_load.options.timeout, std::chrono::seconds(1));
  while (!_finished) {
    // A stop request (LoadOptions::stop) cancels the wait; its error is the cause, and
    // cancels the other stages. Checked before the wait too: its wake-up may have run
    // before this stage first waited.
    if (_load.options.stop.stop_requested()) throw stopped();
    _watchdog_timer.expires_after(tick);
    const auto due = Clock::now() + tick;
    boost::system::error_code ec;
    co_await _watchdog_timer.async_wait(asio::redirect_error(use_awaitable, ec));
    if (_finished) co_return;
    if (_load.options.stop.stop_requested()) throw stopped();
    if (ec) throw boost::system::system_error(ec);  // cancelled: another stage failed
    // A wake-up far later than asked: this process was stopped (SIGSTOP, a debugger) or
    // starved, and could make no progress meanwhile (detail::RunningClock).
    // That time is not a stall of the load (a rank stopped for `timeout` and resumed ended
    // the job blaming the others); if the others stalled on it, they have said so.
    _load.running.woke(due);
    if (_load.running.now() - _load.last_progress >= _load.options.timeout) {
      // A broadcast is collective: where this rank waits on one, the rank holding it back
      // is another (stopped, stuck, or gone without its connection closing).
      const std::string where =
          _landing && _load.transport.world_size() > 1
              ? fmt::format(" waiting for chunk {}'s broadcast to complete, which needs "
                            "every rank: another rank stopped taking part",
                            *_landing)
              : std::string();
      throw Error(Errc::timeout,
                  fmt::format("no progress for {} ms (timeout): the load stalled{}",
                              _load.options.timeout.count(), where));
    }
  }
}

Error Pipeline::stopped() {
  return Error(Errc::interrupted, "the load was stopped (LoadOptions::stop was requested)");
}

// The landing stage's poll: how late a completed broadcast may be noticed, and, while at
// most two are in flight, how late the next one is posted. A receiving rank under mpi also
// copies the bytes inside its polls (MpiBroadcast::test), so a long sleep between polls
// delays the copy's start. 3 ranks on 2 cores, the broadcast stage against plain MPI_Bcast
// (bench/bcast_bench, old and new binaries alternating): 0.58, 0.63, 0.64 with a 1 ms cap
// and 0.72, 0.71, 0.81 with 50 µs beside O_DIRECT reads; 0.56 to 0.65 either way beside
// buffered reads, which take the cores (bench/RESULTS.md). A 16 MiB broadcast over
// NVLink takes about 0.2 ms, so a 1 ms cap
// would bound a GPU job to two chunks per millisecond. Rank 0 with a host arena keeps
// 1 ms: its one thread also copies the buffered reads, and polling it every 100 µs or less
// made the whole load slower (2 ranks: 0.42 to 0.40 and 0.35 of MPI_Bcast).
std::chrono::microseconds Pipeline::landing_poll_cap() const noexcept {
  if (_load.transport.rank() == 0 && _load.arena.kind() == MemoryKind::host) {
    return std::chrono::microseconds(1000);
  }
  return std::chrono::microseconds(50);
}

}  // namespace weightcast::detail
