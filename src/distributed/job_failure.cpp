// The failure policy's end of the process (the one place under src/ that ends it) and the
// job's watchdog, which ends it when the calling thread cannot come back.
#include "weightcast/distributed/detail/job_failure.hpp"

#include "weightcast/core/detail/running_time.hpp"
#include "weightcast/core/log.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <unistd.h>

namespace weightcast::detail {

void FailureReport::report(const Error& error) noexcept {
  std::lock_guard lock(_mutex);
  if (_reported) return;
  _reported = true;
  try {
    if (_options.on_failure) _options.on_failure(error);
  } catch (...) {  // documented as must-not-throw; a throwing one changes nothing here
  }
}

void FailureReport::end_process(const Error& error) noexcept {
  report(error);
  // Nobody catches this failure: without a hook of the caller's, the log says why the
  // process ended.
  if (!_options.on_failure) spdlog::error("{}", error.what());
  {
    std::lock_guard lock(_mutex);  // one thread ends it; another that comes waits here
    try {
      if (_options.before_exit) _options.before_exit(error);
    } catch (...) {
    }
    std::fflush(nullptr);
    ::_exit(exit_status(error.code()));
  }
}

void Watchdog::watch() {
  std::unique_lock lock(_mutex);
  for (;;) {
    _changed.wait(lock, [this] {
      return _closing || (_remote_since && !_unwinding) || (_blocking && !_unwinding);
    });
    if (_closing) return;
    if (_remote_since && !_unwinding) {
      // A call with no timeout (Blocking) may still return after another rank's failure:
      // a collective every rank had entered (MPI_Comm_dup, which the failing rank left
      // first) returns within milliseconds, and the thread then unwinds and raises, as the
      // failure policy says. One that does not return by `blocking_return_most` never
      // will: end then rather than after the whole grace, which a launcher's teardown may
      // not wait.
      if (_blocking) {
        _changed.wait_for(lock, blocking_return_most,
                          [this] { return _closing || _unwinding || !_blocking; });
        if (_closing || _unwinding) continue;
      }
      if (!_blocking && _changed.wait_until(lock, *_remote_since + unwind_grace,
                                            [this] { return _closing || _unwinding; })) {
        continue;
      }
      lock.unlock();
      // The calling thread is stuck: end with the job's failure, once every rank knows.
      // Reported before that wait, as end_with does: a launcher tearing the job down
      // (mpirun's SIGTERM, then SIGKILL) may not let this rank wait and print after.
      const auto failure = _control.remote_failure();
      const Error error =
          failure ? Error(*failure) : Error(Errc::internal, "the job ended without a cause");
      _failure.report(error);
      _control.await_told();
      _control.stop_reader(reader_stop_most);
      _failure.end_process(error);
    }
    if (_blocking && !_unwinding) {
      const std::uint64_t generation = _blocking_generation;
      if (wait_running(lock, _blocking_timeout, [&] {
            return _closing || _unwinding || !_blocking ||
                   _blocking_generation != generation || _remote_since.has_value();
          })) {
        continue;
      }
      const std::string what = _blocking_what;
      const auto timeout = _blocking_timeout;
      lock.unlock();
      blocked_past_timeout(what, timeout);
    }
  }
}

// Waits on `_changed` until @p done() holds, at most @p most of the time this process ran
// (detail::wait_running): a rank stopped for `timeout`, then resumed, must not blame the
// others (meanwhile rank 0 has named it, and its ABORT waits to be read).
template <class Done>
bool Watchdog::wait_running(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds most,
                            Done done) {
  return detail::wait_running(
      most, std::chrono::seconds(1), std::chrono::milliseconds(500),
      [&](Clock::duration step) { _changed.wait_for(lock, step); }, done);
}

void Watchdog::blocked_past_timeout(const std::string& what,
                                    std::chrono::milliseconds timeout) {
  // Rank 0 meets the same stall and knows every rank's state: let it speak first.
  _control.defer_to_root(root_grace(timeout));
  if (const auto failure = _control.remote_failure()) {
    _failure.report(*failure);  // before the wait, as above
    _control.await_told();
    _control.stop_reader(reader_stop_most);
    _failure.end_process(*failure);
  }
  const Error error(Errc::timeout,
                    fmt::format("rank {}: {} did not return within {} ms (timeout): {}", _rank,
                                what, timeout.count(), _control.stall_report()));
  _control.abort(error);
  _failure.report(error);
  _control.linger(linger_most(timeout));
  _control.stop_reader(reader_stop_most);
  _failure.end_process(error);
}

}  // namespace weightcast::detail
