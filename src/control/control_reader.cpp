// The control plane's reader thread: from the end of the rendezvous it reads every
// connection (shared bytes, reports, the verdict, ABORT), sends the heartbeats, and ends the
// job when another rank fails or is lost.
#include "weightcast/control/detail/control_session.hpp"

#include <boost/asio/read.hpp>
#include <fmt/core.h>

#include <poll.h>
#include <sys/socket.h>

namespace weightcast {

namespace asio = boost::asio;
using detail::decode_status;
using detail::encode_status;
using detail::frame_bytes;
using detail::FrameReader;
using detail::send_all;

void ControlPlane::Impl::start_reader() {
  reports.resize(world.world_size);
  const auto now = Clock::now();
  last_tick = now;
  for (auto& connection : connections) {
    if (!connection) continue;
    connection->last_heard = now;
    read_next(*connection);
  }
  heartbeat_timer.emplace(io);
  heartbeat();
  reader = std::thread([this] {
    io.run();
    reader_done = true;
  });
}

// Sends this rank's PROGRESS on every open connection, then again after the interval; stops
// once every connection is closed, so that the reader thread returns.
void ControlPlane::Impl::heartbeat() {
  {
    // A heartbeat far later than its interval: this process was stopped (or starved), and
    // heard nothing meanwhile; that time is no peer's silence.
    std::lock_guard lock(mutex);
    const auto now = Clock::now();
    if (const auto late = now - last_tick - heartbeat_interval; late > suspended_after) {
      for (auto& connection : connections) {
        if (connection) connection->last_heard = std::min(connection->last_heard + late, now);
      }
    }
    last_tick = now;
  }
  const std::string frame =
      frame_bytes(Frame::progress, detail::encode_progress(my_progress.load()));
  bool open = false;
  for (auto& connection : connections) {
    if (!connection) continue;
    {
      std::lock_guard lock(mutex);
      if (connection->closed) continue;
    }
    open = true;
    send_heartbeat(*connection, frame);
  }
  if (!open) return;
  heartbeat_timer->expires_after(heartbeat_interval);
  heartbeat_timer->async_wait([this](boost::system::error_code ec) {
    if (!ec) heartbeat();
  });
}

// A heartbeat is skipped rather than waited for: when the main thread is sending (it holds
// the write lock, and its frame shows this rank alive) or the peer's receive window is full
// (it is not reading). A send buffer that polls writable takes 13 bytes whole.
void ControlPlane::Impl::send_heartbeat(Connection& c, const std::string& frame) noexcept {
  std::unique_lock lock(c.write_mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;
  pollfd p{c.socket.native_handle(), POLLOUT, 0};
  if (::poll(&p, 1, 0) != 1 || (p.revents & POLLOUT) == 0) return;
  try {
    send_all(c.socket.native_handle(), frame,
             Clock::now() + std::chrono::milliseconds(100), c.rank);
  } catch (const Error&) {
    // A peer that is gone is the reader's to report.
  }
}

void ControlPlane::Impl::read_next(Connection& c) {
  asio::async_read(c.socket, asio::buffer(c.header), [this, &c](auto ec, std::size_t) {
    if (ec) return lost(c, "its control connection closed (the process died or was killed)");
    detail::FrameHeader header{};
    try {
      // Type and length are checked before the payload is allocated.
      header = detail::decode_frame_header(
          c.header, world.rank == 0 ? FrameReader::root : FrameReader::peer,
          fmt::format("message from rank {}", c.rank));
    } catch (const Error& e) {
      return lost(c, fmt::format("it sent a malformed control message ({})", e.what()));
    }
    c.payload.resize(header.payload_bytes);
    asio::async_read(c.socket, asio::buffer(c.payload), [this, &c, header](auto ec2,
                                                                          std::size_t) {
      if (ec2) return lost(c, "its control connection closed (the process died or was killed)");
      try {
        dispatch(c, header.type);
      } catch (const Error& e) {
        return lost(c, fmt::format("it sent a malformed control message ({})", e.what()));
      }
      read_next(c);
    });
  });
}

void ControlPlane::Impl::dispatch(Connection& c, Frame type) {
  const std::string what = fmt::format("message from rank {}", c.rank);
  {
    std::lock_guard lock(mutex);
    c.last_heard = Clock::now();
  }
  switch (type) {
    case Frame::progress: {
      const std::uint64_t chunks = detail::decode_progress(c.payload, what);
      std::lock_guard lock(mutex);
      c.progress = chunks;
      return;
    }
    case Frame::share_part:
    case Frame::report_part:
      // Grows by what arrived, frame by frame, never by a length announced ahead.
      c.parts += c.payload;
      return;
    case Frame::share: {
      std::string bytes = whole(c);
      std::lock_guard lock(mutex);
      shared.push_back(std::move(bytes));
      changed.notify_all();
      return;
    }
    case Frame::report: {
      RankReport report = detail::decode_report(whole(c), what);
      if (report.rank != c.rank) {
        throw Error(Errc::unavailable,
                    fmt::format("{}: report of rank {}, not the connection's", what,
                                report.rank));
      }
      std::lock_guard lock(mutex);
      reports[c.rank] = std::move(report);
      changed.notify_all();
      return;
    }
    case Frame::done: {
      auto [status, message] = decode_status(c.payload, what);
      std::lock_guard lock(mutex);
      verdict = Verdict{status, std::move(message)};
      changed.notify_all();
      return;
    }
    case Frame::abort: {
      auto [status, message] = decode_status(c.payload, what);
      terminate(status == 0 ? exit_status(Errc::unavailable) : status, message, c.rank);
      return;
    }
    default:
      throw Error(Errc::unavailable, fmt::format("unexpected message type {}",
                                                 static_cast<int>(type)));
  }
}

// The bytes a SHARE or REPORT ends: the parts before it, then its own payload.
std::string ControlPlane::Impl::whole(Connection& c) {
  std::string bytes = std::move(c.parts);
  c.parts = {};
  if (bytes.empty()) return std::move(c.payload);
  bytes += c.payload;
  return bytes;
}

// A connection ended or misbehaved: unless that was expected, the job is over.
void ControlPlane::Impl::lost(Connection& c, const std::string& why) {
  bool expected = false;
  bool none_open = false;
  {
    std::lock_guard lock(mutex);
    c.closed = true;
    // A peer that sent its own ABORT waits for rank 0 to hang up (linger).
    expected = finished || terminating ||
               (world.rank != 0 && (verdict.has_value() || sent_abort));
    none_open = all_closed();
    changed.notify_all();
  }
  // Nothing left to beat for: the reader thread returns as soon as its other work is done
  // (~ControlPlane joins it).
  if (none_open && heartbeat_timer) heartbeat_timer->cancel();
  // Hang up but keep the descriptor: the main thread may be in send_all() on this
  // connection (share, gather, abort), and close() would write the socket's handle while
  // that thread reads it, and free the number for the next file or socket the process
  // opens. ~ControlPlane closes it after joining this thread.
  ::shutdown(c.socket.native_handle(), SHUT_RDWR);
  if (expected) return;
  terminate(exit_status(Errc::unavailable), fmt::format("rank {} is gone: {}", c.rank, why),
            c.rank);
}

// Another rank's failure (@p status, @p message; from rank @p origin) ends the job: on rank
// 0 after telling every other rank but @p origin. Nothing here ends the process: the main
// thread's waits throw it (throw_if_remote_failure), and the ending hook (on_ending) stops
// the load; the caller decides what then (weightcast/distributed/job.hpp's failure policy).
void ControlPlane::Impl::terminate(int status, const std::string& message, int origin) {
  ending = true;
  if (world.rank != 0) {
    {
      std::lock_guard lock(mutex);
      if (remote_failure) return;
      remote_failure.emplace(status, message);
      terminating = true;  // rank 0's hang-up is expected now
    }
    changed.notify_all();
    // The connection stays open until this process ends or the job lets go of the control
    // plane, both after this rank has reported the failure: rank 0 waits for that hang-up
    // (bounded by abort_grace) before it ends, and a launcher tears the job down on rank
    // 0's exit, which would cut this rank's message off if it hung up first.
    run_ending_hook();
    return;
  }
  {
    std::lock_guard lock(mutex);
    // The rank whose ABORT this is printed it and waits for rank 0 to hang up (linger):
    // waiting for it in turn would hold both until the grace.
    if (origin > 0 && origin < static_cast<int>(connections.size()) && connections[origin]) {
      connections[origin]->told = true;
    }
    if (terminating) return;  // the main thread is already spreading its own failure
    terminating = true;
    remote_failure.emplace(status, message);
  }
  const std::string frame = frame_bytes(Frame::abort, encode_status(status, message));
  for (auto& connection : connections) {
    if (!connection || connection->rank == origin) continue;
    send_quietly(*connection, frame);
  }
  changed.notify_all();
  run_ending_hook();
}

// The ending hook (on_ending), once.
void ControlPlane::Impl::run_ending_hook() noexcept {
  std::lock_guard running(ending_hook_mutex);  // on_ending waits for it
  std::function<void()> hook;
  {
    std::lock_guard lock(mutex);
    hook = std::exchange(ending_hook, nullptr);
  }
  if (hook) hook();
}

}  // namespace weightcast
