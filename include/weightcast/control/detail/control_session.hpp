/**
 * @file control/detail/control_session.hpp
 * @brief `ControlPlane::Impl`: the control plane's state once the rendezvous is over, shared
 *        by the callers' threads (control_plane.cpp) and the coroutines on the control
 *        plane's io_context (control_reader.cpp). Boost.Asio inside: only control/'s sources
 *        include it.
 *
 * One model, as Asio's C++20 chat server: each connection is a reader and a writer coroutine
 * with a queue of frames between them, and a heartbeat coroutine feeds every queue; one
 * thread of the control plane's own runs the io_context, and nothing else touches a socket.
 * A caller's send posts its frame to the writer and waits on `changed` for its outcome.
 */
#pragma once

#include "weightcast/control/control_plane.hpp"
#include "weightcast/control/detail/control_io.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/detail/running_time.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/executor_work_guard.hpp>
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
#include <exception>
#include <future>
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

/// How long an ABORT or the verdict may take to go out to one peer: one that cannot take it
/// in that time is dead or stalled, and the launcher reaps it.
inline constexpr std::chrono::seconds abort_send_most{2};

/// A frame on its way to a peer, from the moment a caller (or the heartbeat) queues it until
/// its writer has written it, or given up.
struct Outgoing {
  std::string frame;
  ControlClock::duration most{};  // bound on the write, of the time this process ran
  // A heartbeat is skipped rather than waited for when the peer takes nothing (its receive
  // window is full: it is not reading), and nobody waits for its outcome.
  bool heartbeat = false;
  bool done = false;         // written or given up; guarded by Impl::mutex
  std::exception_ptr error;  // why it was not written, once done; likewise
};
using OutgoingPtr = std::shared_ptr<Outgoing>;

/// One rank 0 ⇄ peer connection.
struct Connection {
  using tcp = boost::asio::ip::tcp;
  using Clock = ControlClock;
  Connection(int peer_rank, tcp::socket s)
      : rank(peer_rank), socket(std::move(s)), wake(socket.get_executor()) {
    wake.expires_at(boost::asio::steady_timer::time_point::max());
  }
  int rank;
  tcp::socket socket;
  bool closed = false;               // guarded by Impl::mutex
  bool told = false;                 // rank 0: the peer sent the ABORT it ends with; likewise
  Clock::time_point last_heard;      // the last whole frame from the peer; guarded likewise
  std::uint64_t progress = 0;        // the peer's chunks landed, by its last PROGRESS; likewise
  std::array<char, frame_header_bytes> header{};
  std::string payload;
  // SHARE_PART (a peer) or REPORT_PART (rank 0) payloads so far, until the SHARE or REPORT
  // ending them.
  std::string parts;
  // The writer's side; the io_context's thread only. `wake` never expires: queueing a frame,
  // or the connection's end, cancels its wait (the chat server's signal).
  std::deque<OutgoingPtr> outbox;
  boost::asio::steady_timer wake;
  bool writing = false;      // a frame is being written
  bool writer_done = false;  // the writer returned: nothing queued from now on goes out
  // A write gave up after part of its frame went: the peer's stream stops mid-frame, so no
  // later frame could be read as one.
  bool cut = false;
};

}  // namespace detail

struct ControlPlane::Impl {
  using tcp = boost::asio::ip::tcp;
  using Clock = detail::ControlClock;
  using Connection = detail::Connection;
  using Frame = detail::Frame;
  using Outgoing = detail::Outgoing;
  using OutgoingPtr = detail::OutgoingPtr;

  World world;
  RendezvousOptions options;
  boost::asio::io_context io;
  // Rank 0: index = peer rank (0 unused). Others: one connection, to rank 0, at index 0.
  std::vector<std::unique_ptr<Connection>> connections;
  // Runs `io` and nothing else: the readers, writers and heartbeat are coroutines on it.
  std::thread io_thread;
  std::future<void> io_returned;  // ready once io_thread has returned from io.run()
  // Keeps io.run() going once every connection is closed, so that a frame posted then still
  // reaches its writer and fails there (as a send on a hung-up socket does) instead of
  // waiting out its bound; io.stop() ends it (~ControlPlane, stop_reader).
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>
      keep_running;

  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> shared;                  // peers: SHARE payloads not yet taken
  std::vector<std::optional<RankReport>> reports;  // rank 0
  std::optional<Verdict> verdict;                  // peers: rank 0's verdict
  bool finished = false;     // rank 0: verdict sent; hang-ups are expected now
  bool terminating = false;  // an ABORT is being spread; hang-ups are expected now
  bool sent_abort = false;
  std::atomic<bool> ending{false};  // an ABORT was sent or received, or a peer was lost
  // Another rank's ABORT or a lost peer (status, message), set on the io_context's thread: the
  // main thread's waits throw it as a RemoteAbort (throw_if_remote_failure). Guarded by
  // `mutex`.
  std::optional<std::pair<int, std::string>> remote_failure;
  // Heartbeat: every connection carries a PROGRESS frame (this rank's chunks landed) each
  // `heartbeat_interval`, sent from the io_context's thread, which runs whatever the main
  // thread is blocked in. A peer silent for `silence_after` is stopped or hung, not merely slow.
  std::atomic<std::uint64_t> my_progress{0};
  std::chrono::milliseconds heartbeat_interval;
  Clock::duration silence_after;
  // A heartbeat later than this past its interval, or a wait of the main thread that long
  // past what it asked: this process did not run meanwhile (stopped, or starved).
  Clock::duration suspended_after;
  Clock::time_point last_tick;  // the last heartbeat; guarded by `mutex`
  // The heartbeat's; cancelled once every connection is closed: nothing is left to beat for.
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
  // io_context's thread resumed with this one, and what arrived meanwhile (the catalogue, an ABORT,
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

  // ---- on the io_context's thread (control_reader.cpp) -------------------------------------

  /// Spawns every connection's reader and writer and the heartbeat, and the thread that runs
  /// them.
  void start();
  boost::asio::awaitable<void> read_loop(Connection& c);
  boost::asio::awaitable<void> write_loop(Connection& c);
  // Sends this rank's PROGRESS on every open connection whose writer is idle, each interval;
  // returns once every connection is closed.
  boost::asio::awaitable<void> heartbeat_loop();
  // Writes one frame within its bound. @return why it was not written (none: it was, or a
  // heartbeat was skipped).
  boost::asio::awaitable<std::exception_ptr> write_one(Connection& c, const Outgoing& out);
  // Puts @p out in @p c's queue and wakes its writer, or fails it at once when the writer
  // has returned.
  void queue(Connection& c, OutgoingPtr out);
  void settle(const OutgoingPtr& out, std::exception_ptr error);
  void dispatch(Connection& c, Frame type);
  static std::string whole(Connection& c);
  void lost(Connection& c, const std::string& why);
  void terminate(int status, const std::string& message, int origin);
  void run_ending_hook() noexcept;

  // ---- from the callers' threads (control_plane.cpp) ---------------------------------------

  // Throws another rank's failure, once the reader has recorded one. Caller holds `mutex`.
  void throw_if_remote_failure() const;
  // Hands @p frame to @p c's writer (through the io_context), bounded by @p most.
  OutgoingPtr post(Connection& c, std::string frame, Clock::duration most);
  // Waits for @p out's outcome. @return why it was not written (none: it was).
  std::exception_ptr outcome(const OutgoingPtr& out);
  void send_quietly(const std::string& frame) noexcept;
  void send(Connection& c, Frame type, std::string_view payload);
  void send_in_pieces(Connection& c, Frame part, Frame last, std::string_view bytes);
};

}  // namespace weightcast
