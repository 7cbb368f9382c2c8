/**
 * @file control/detail/control_session.hpp
 * @brief `ControlPlane::Impl`: the control plane's state once the rendezvous is over, shared
 *        by the main thread's calls (control_plane.cpp) and the reader thread
 *        (control_reader.cpp). Boost.Asio inside: only control/'s sources include it.
 */
#pragma once

#include "weightcast/control/control_plane.hpp"
#include "weightcast/control/detail/control_io.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/detail/running_time.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace weightcast {

namespace detail {

/// One rank 0 ⇄ peer connection.
struct Connection {
  using tcp = boost::asio::ip::tcp;
  using Clock = ControlClock;
  Connection(int peer_rank, tcp::socket s) : rank(peer_rank), socket(std::move(s)) {}
  int rank;
  tcp::socket socket;
  std::mutex write_mutex;
  bool closed = false;               // guarded by Impl::mutex
  bool told = false;                 // rank 0: the peer sent the ABORT it ends with; likewise
  Clock::time_point last_heard;      // the last whole frame from the peer; guarded likewise
  std::uint64_t progress = 0;        // the peer's chunks landed, by its last PROGRESS; likewise
  std::array<char, frame_header_bytes> header{};
  std::string payload;
  // SHARE_PART (a peer) or REPORT_PART (rank 0) payloads so far, until the SHARE or REPORT
  // ending them.
  std::string parts;
};

}  // namespace detail

struct ControlPlane::Impl {
  using tcp = boost::asio::ip::tcp;
  using Clock = detail::ControlClock;
  using Connection = detail::Connection;
  using Frame = detail::Frame;

  World world;
  RendezvousOptions options;
  boost::asio::io_context io;
  // Rank 0: index = peer rank (0 unused). Others: one connection, to rank 0, at index 0.
  std::vector<std::unique_ptr<Connection>> connections;
  std::thread reader;
  std::atomic<bool> reader_done{false};  // the reader thread has returned from io.run()

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> shared;                  // peers: SHARE payloads not yet taken
  std::vector<std::optional<RankReport>> reports;  // rank 0
  std::optional<Verdict> verdict;                  // peers: rank 0's verdict
  bool finished = false;     // rank 0: verdict sent; hang-ups are expected now
  bool terminating = false;  // an ABORT is being spread; hang-ups are expected now
  bool sent_abort = false;
  std::atomic<bool> ending{false};  // an ABORT was sent or received, or a peer was lost
  // Another rank's ABORT or a lost peer (status, message), set by the reader thread: the
  // main thread's waits throw it as a RemoteAbort (throw_if_remote_failure). Guarded by
  // `mutex`.
  std::optional<std::pair<int, std::string>> remote_failure;
  // Heartbeat: every connection carries a PROGRESS frame (this rank's chunks landed) each
  // `heartbeat_interval`, sent by the reader thread, which runs whatever the main thread is
  // blocked in. A peer silent for `silence_after` is stopped or hung, not merely slow.
  std::atomic<std::uint64_t> my_progress{0};
  std::chrono::milliseconds heartbeat_interval;
  Clock::duration silence_after;
  // A heartbeat later than this past its interval, or a wait of the main thread that long
  // past what it asked: this process did not run meanwhile (stopped, or starved).
  Clock::duration suspended_after;
  Clock::time_point last_tick;  // the reader's last heartbeat; guarded by `mutex`
  std::optional<boost::asio::steady_timer> heartbeat_timer;
  std::function<void()> ending_hook;  // on_ending's; guarded by `mutex`
  std::mutex ending_hook_mutex;       // held while the hook runs

  Impl(const World& w, const RendezvousOptions& o)
      : world(w),
        options(o),
        heartbeat_interval(std::clamp<std::chrono::milliseconds>(
            o.timeout / 10, std::chrono::milliseconds(10), std::chrono::milliseconds(1000))),
        silence_after(4 * heartbeat_interval),
        suspended_after(std::min<Clock::duration>(heartbeat_interval,
                                                  std::chrono::milliseconds(500))) {}

  // Whether @p c is open but has sent nothing for `silence_after` of the time this process
  // ran. A peer's silence is known only while the reader runs: a process stopped, then
  // resumed, finds its peers' frames waiting in the sockets, and until the reader's next
  // heartbeat (which discounts the time it did not run, and by then the reader has read
  // what waited) it calls no peer silent. Caller holds `mutex`.
  [[nodiscard]] bool silent(const Connection& c, Clock::time_point now) const {
    const bool reader_current = now - last_tick <= heartbeat_interval + suspended_after;
    return !c.closed && reader_current && now - c.last_heard > silence_after;
  }

  // Waits on `changed` until @p done() holds, at most @p most of the time this process ran
  // (detail::RunningClock, as the loader's watchdog counts): in steps of at most a heartbeat
  // interval. A wait that runs out on a step that ended far
  // later than asked (this process was stopped, then resumed) takes one step more: the
  // reader thread resumed with this one, and what arrived meanwhile (the catalogue, an ABORT,
  // heartbeats) is waiting in the sockets for it; the time stopped is no peer's stall. Caller
  // holds `mutex` through @p lock. @return whether @p done() holds.
  template <class Done>
  bool wait_running(std::unique_lock<std::mutex>& lock, Clock::duration most, Done done) {
    return detail::wait_running(
        most, heartbeat_interval, suspended_after,
        [&](Clock::duration step) { changed.wait_for(lock, step); }, done);
  }

  // Whether every connection is closed. Caller holds `mutex`.
  [[nodiscard]] bool all_closed() const {
    return std::none_of(connections.begin(), connections.end(),
                        [](const auto& c) { return c && !c->closed; });
  }

  // Rank 0 ending the job: whether no rank is left to wait for. Each has hung up, sent the
  // ABORT itself (told), or fell silent (a stopped process never hangs up). Caller holds
  // `mutex`.
  [[nodiscard]] bool none_to_wait_for(Clock::time_point now) const {
    return std::none_of(connections.begin(), connections.end(), [&](const auto& c) {
      return c && !c->closed && !c->told && !silent(*c, now);
    });
  }

  // ---- the reader thread (control_reader.cpp) -------------------------------------------

  /// Starts reading every connection, and the heartbeats, on the reader thread.
  void start_reader();
  // Sends this rank's PROGRESS on every open connection, then again after the interval; stops
  // once every connection is closed, so that the reader thread returns.
  void heartbeat();
  void send_heartbeat(Connection& c, const std::string& frame) noexcept;
  void read_next(Connection& c);
  void dispatch(Connection& c, Frame type);
  static std::string whole(Connection& c);
  void lost(Connection& c, const std::string& why);
  void terminate(int status, const std::string& message, int origin);
  void run_ending_hook() noexcept;

  // ---- sends from the main thread (control_plane.cpp) -----------------------------------

  // Throws another rank's failure, once the reader has recorded one. Caller holds `mutex`.
  void throw_if_remote_failure() const;
  void send_quietly(Connection& c, const std::string& frame) noexcept;
  void send(Connection& c, Frame type, std::string_view payload);
  void send_in_pieces(Connection& c, Frame part, Frame last, std::string_view bytes);
};

}  // namespace weightcast
