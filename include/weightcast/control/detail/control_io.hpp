/**
 * @file control/detail/control_io.hpp
 * @brief What the rendezvous and the session share: whole frames sent and received on a
 *        control-plane socket within a deadline of the time this process ran, and what their
 *        messages say of ranks, addresses, durations and a failed listen. No Boost.Asio: a
 *        socket is taken by descriptor (Asio's reactor keeps it non-blocking).
 */
#pragma once

#include "weightcast/control/detail/control_wire.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
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

/**
 * @brief Sends all of @p bytes on socket @p fd before @p deadline (moved on by the time this
 *        process did not run: `overrun`); the socket may be non-blocking.
 * @throws Error `timeout` (75) naming @p peer_rank when the peer takes nothing in time;
 *         `unavailable` (69) when the send fails (the peer is gone).
 */
void send_all(int fd, std::string_view bytes, ControlClock::time_point deadline, int peer_rank);

/**
 * @brief Reads rank 0's answer to a hello on socket @p fd before @p deadline, moved on as
 *        `send_all`'s (after the rendezvous the session's reader thread reads).
 * @return nothing when the connection closed (@p timed_out false) or the deadline passed
 *         (@p timed_out true).
 * @throws Error `unavailable` (69) when the header is not one a joining peer accepts (checked
 *         before the payload is read or allocated).
 */
std::optional<std::pair<Frame, std::string>> recv_reply(int fd, ControlClock::time_point deadline,
                                                        std::string_view what, bool& timed_out);

}  // namespace weightcast::detail
