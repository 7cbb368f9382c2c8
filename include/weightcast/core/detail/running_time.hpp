// Deadlines counted in the time this process ran, not by the wall clock: a rank stopped
// (SIGSTOP, a debugger) and resumed must not find its deadline passed and blame a peer for
// the time it was not running itself; meanwhile the others met its stall and named it, and
// what they sent (an ABORT, a verdict) waits to be read. The loader's watchdog, the control
// plane's waits and the job's waits all count time this way.
#pragma once

#include <algorithm>
#include <chrono>

namespace weightcast::detail {

/**
 * @brief A steady clock that leaves out the stretches in which this process did not run.
 *
 * Such a stretch is seen only by a wait that ends far later than asked: its owner calls
 * `woke(due)` after each bounded wait (a timer, a condition variable's `wait_for`), and a
 * wake-up more than @p late_after past @p due takes all of its lateness out of `now()`.
 * Lateness up to @p late_after (scheduling under load) counts as running time. Not
 * thread-safe: one owner calls `woke`, and `now` on the same thread (or under its lock).
 */
class RunningClock {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RunningClock(Clock::duration late_after) : _late_after(late_after) {}

  /// @return the steady clock less the time this process was seen not to run: compare two
  ///         readings of the same clock, never one with `steady_clock::now()`.
  [[nodiscard]] Clock::time_point now() const { return Clock::now() - _not_running; }

  /// Records the end of a wait that was due to end at @p due (`steady_clock` time).
  /// @return whether it ended more than `late_after` past @p due: the process did not run
  ///         meanwhile, and that lateness no longer counts.
  bool woke(Clock::time_point due) {
    const Clock::duration late = Clock::now() - due;
    if (late <= _late_after) return false;
    _not_running += late;
    return true;
  }

 private:
  Clock::duration _late_after;
  Clock::duration _not_running{};
};

/**
 * @brief Waits until @p done() holds, at most @p most of the time this process ran
 *        (`RunningClock`).
 *
 * Waits in steps of at most @p max_step, calling @p wait_for(step) (e.g. a condition
 * variable's `wait_for` with the caller's lock). A wait that runs out on a step that ended
 * more than @p late_after past what it asked (the process did not run meanwhile) takes one
 * step more: what arrived meanwhile is looked at before the wait gives up.
 * @return whether @p done() holds.
 */
template <class WaitFor, class Done>
bool wait_running(std::chrono::steady_clock::duration most,
                  std::chrono::steady_clock::duration max_step,
                  std::chrono::steady_clock::duration late_after, WaitFor wait_for, Done done) {
  using Clock = std::chrono::steady_clock;
  RunningClock running(late_after);
  Clock::time_point end = running.now() + most;
  while (!done()) {
    const Clock::duration left = end - running.now();
    if (left <= Clock::duration::zero()) return false;
    const Clock::duration step = std::min(left, max_step);
    const Clock::time_point due = Clock::now() + step;
    wait_for(step);
    if (running.woke(due) && end <= running.now()) end = running.now() + step;
  }
  return true;
}

}  // namespace weightcast::detail
