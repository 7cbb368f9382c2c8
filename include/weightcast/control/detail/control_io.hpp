/**
 * @file control/detail/control_io.hpp
 * @brief What the rendezvous and the session share without Boost.Asio: how a deadline counts
 *        the time this process ran, and what their messages say of ranks, addresses,
 *        durations and a failed listen (the awaitables they write with:
 *        control_stream.hpp).
 */
#pragma once

#include "weightcast/control/detail/control_wire.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::detail {

using ControlClock = std::chrono::steady_clock;

/// The longest step of a rendezvous wait between looks at `RendezvousOptions::stop`.
inline constexpr std::chrono::milliseconds stop_step{100};

/// How far past what was asked a wait ran, when it ran past it: time this process did not run
/// (stopped by SIGSTOP or a debugger, or starved), which does not count against a deadline.
/// Every wait of the control plane waits in steps of at most a second and moves its deadline
/// on by this (the rule of the loader's watchdog): a rank stopped for `timeout` and resumed
/// would otherwise find its deadline passed before it looked at what arrived meanwhile, and
/// blame the others.
inline ControlClock::duration overrun(ControlClock::duration took, ControlClock::duration asked) {
  return std::max(took - asked, ControlClock::duration::zero());
}

/// @return e.g. "1-3, 5, 7-1023": ranks, ascending, with runs as ranges; at most 16 items,
///         then how many ranks in all (a world of a million ranks must not make a megabyte
///         message).
std::string rank_list(const std::vector<int>& ranks);

/// @return e.g. "300000 ms".
std::string milliseconds(std::chrono::milliseconds d);

/// @return "host:port", or "[v6:address]:port" for an IPv6 address (RFC 3986's form).
std::string host_port(std::string_view host, unsigned port);

/// @return what to try when rank 0 cannot listen on its rendezvous address, by the bind's
///         errno @p error (e.g. " (another job on this port? ...)"); "" when there is no advice.
std::string listen_hint(int error);

}  // namespace weightcast::detail
