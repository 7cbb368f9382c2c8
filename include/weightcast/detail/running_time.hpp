// A wait bounded by the time this process ran, not by the wall clock: a rank stopped
// (SIGSTOP, a debugger) and resumed must not find its deadline passed and blame a peer for
// the time it was not running itself; meanwhile the others met its stall and named it, and
// what they sent (an ABORT, a verdict) waits to be read.
#pragma once

#include <algorithm>
#include <chrono>

namespace weightcast::detail {

/**
 * @brief Waits until @p done() holds, at most @p most of the time this process ran.
 *
 * Waits in steps of at most @p max_step, calling @p wait_for(step) (e.g. a condition
 * variable's `wait_for` with the caller's lock); each step counts at most as long as it asked
 * for. A wait that runs out on a step that ended more than @p late_after past what it asked
 * (the process did not run meanwhile) takes one step more: what arrived meanwhile is looked
 * at before the wait gives up.
 * @return whether @p done() holds.
 */
template <class WaitFor, class Done>
bool wait_running(std::chrono::steady_clock::duration most,
                  std::chrono::steady_clock::duration max_step,
                  std::chrono::steady_clock::duration late_after, WaitFor wait_for, Done done) {
  using Clock = std::chrono::steady_clock;
  Clock::duration left = most;
  while (!done()) {
    if (left <= Clock::duration::zero()) return false;
    const Clock::duration step = std::min(left, max_step);
    const auto begin = Clock::now();
    wait_for(step);
    const Clock::duration took = Clock::now() - begin;
    left -= std::min(took, step);
    if (left <= Clock::duration::zero() && took > step + late_after) left = step;
  }
  return true;
}

}  // namespace weightcast::detail
