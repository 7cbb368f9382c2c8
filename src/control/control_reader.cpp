// The control plane's coroutines, on its io_context's thread: from the end of the rendezvous
// each connection's reader (shared bytes, reports, the verdict, ABORT) and writer, and the
// heartbeat; they end the job when another rank fails or is lost.
#include "weightcast/control/detail/control_session.hpp"
#include "weightcast/control/detail/control_stream.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <fmt/core.h>

#include <cerrno>

namespace weightcast {

namespace asio = boost::asio;
using asio::awaitable;
using namespace asio::experimental::awaitable_operators;
using detail::decode_status;
using detail::encode_status;
using detail::frame_bytes;
using detail::FrameReader;
using detail::Outgoing;
using detail::OutgoingPtr;

namespace {

constexpr auto as_result = asio::as_tuple(asio::use_awaitable);

// How long a heartbeat waits for room in the socket's send buffer before it is skipped.
constexpr std::chrono::milliseconds heartbeat_room{100};

// A coroutine's exception leaves io.run() on the io_context's thread and ends the process
// (std::terminate): every path inside catches what a peer can cause, so one that escapes is
// a bug, not a failure to report.
void rethrow(const std::exception_ptr& e) {
  if (e) std::rethrow_exception(e);
}

std::exception_ptr stalled(int rank) {
  return std::make_exception_ptr(
      Error(Errc::timeout, fmt::format("control plane: rank {} did not take a message within "
                                       "the timeout (stalled?)",
                                       rank)));
}

}  // namespace

void ControlPlane::Impl::start() {
  reports.resize(world.world_size);
  const auto now = Clock::now();
  last_tick = now;
  for (auto& connection : connections) {
    if (!connection) continue;
    connection->last_heard = now;
    asio::co_spawn(io, read_loop(*connection), rethrow);
    asio::co_spawn(io, write_loop(*connection), rethrow);
  }
  heartbeat_timer.emplace(io);
  asio::co_spawn(io, heartbeat_loop(), rethrow);
  keep_running.emplace(io.get_executor());
  std::promise<void> returned;
  io_returned = returned.get_future();
  io_thread = std::thread([this, returned = std::move(returned)]() mutable {
    io.run();
    returned.set_value();
  });
}

awaitable<void> ControlPlane::Impl::heartbeat_loop() {
  for (;;) {
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
      // A writer at work carries frames that show this rank alive already.
      if (connection->writing || !connection->outbox.empty()) continue;
      auto out = std::make_shared<Outgoing>();
      out->frame = frame;
      out->most = heartbeat_room;
      out->heartbeat = true;
      queue(*connection, std::move(out));
    }
    if (!open) co_return;
    heartbeat_timer->expires_after(heartbeat_interval);
    if (auto [error] = co_await heartbeat_timer->async_wait(as_result); error) co_return;
  }
}

awaitable<void> ControlPlane::Impl::read_loop(Connection& c) {
  const std::string closed = "its control connection closed (the process died or was killed)";
  for (;;) {
    if (auto [error, n] = co_await asio::async_read(c.socket, asio::buffer(c.header), as_result);
        error) {
      co_return lost(c, closed);
    }
    detail::FrameHeader header{};
    try {
      // Type and length are checked before the payload is allocated.
      header = detail::decode_frame_header(
          c.header, world.rank == 0 ? FrameReader::root : FrameReader::peer,
          fmt::format("message from rank {}", c.rank));
    } catch (const Error& e) {
      co_return lost(c, fmt::format("it sent a malformed control message ({})", e.what()));
    }
    c.payload.resize(header.payload_bytes);
    if (auto [error, n] = co_await asio::async_read(c.socket, asio::buffer(c.payload), as_result);
        error) {
      co_return lost(c, closed);
    }
    try {
      dispatch(c, header.type);
    } catch (const Error& e) {
      co_return lost(c, fmt::format("it sent a malformed control message ({})", e.what()));
    }
  }
}

// The chat server's writer: frames go out one at a time, in the order queued; with none
// queued it waits on `wake`. It returns once the connection is closed and its queue empty.
awaitable<void> ControlPlane::Impl::write_loop(Connection& c) {
  for (;;) {
    if (c.outbox.empty()) {
      {
        std::lock_guard lock(mutex);
        if (c.closed) break;
      }
      co_await c.wake.async_wait(as_result);  // cancelled by queue() and lost()
      continue;
    }
    OutgoingPtr out = std::move(c.outbox.front());
    c.outbox.pop_front();
    c.writing = true;
    std::exception_ptr error = co_await write_one(c, *out);
    c.writing = false;
    settle(out, std::move(error));
  }
  c.writer_done = true;
}

awaitable<std::exception_ptr> ControlPlane::Impl::write_one(Connection& c, const Outgoing& out) {
  if (c.cut) co_return stalled(c.rank);
  if (out.heartbeat) {
    // Only into a send buffer with room, where its 13 bytes go whole: a peer that reads
    // nothing gets no heartbeat rather than half of one.
    auto room = co_await (c.socket.async_wait(asio::socket_base::wait_write, as_result) ||
                          detail::expire(out.most));
    if (room.index() == 1 || std::get<0>(std::get<0>(room))) co_return nullptr;
  }
  std::size_t sent = 0;
  auto written = co_await (detail::write_frame(c.socket, out.frame, sent) ||
                           detail::expire(out.most));
  if (written.index() == 1) {
    if (sent > 0) c.cut = true;
    co_return out.heartbeat ? nullptr : stalled(c.rank);
  }
  if (const auto error = std::get<0>(written)) {
    co_return out.heartbeat
        ? nullptr
        : std::make_exception_ptr(system_error(
              Errc::unavailable, error.value(),
              fmt::format("control plane: sending to rank {}", c.rank)));
  }
  co_return nullptr;
}

void ControlPlane::Impl::queue(Connection& c, OutgoingPtr out) {
  if (c.writer_done) {
    // The connection is closed and its writer gone: as a send on a hung-up socket fails.
    return settle(out, std::make_exception_ptr(system_error(
                           Errc::unavailable, EPIPE,
                           fmt::format("control plane: sending to rank {}", c.rank))));
  }
  c.outbox.push_back(std::move(out));
  c.wake.cancel_one();
}

void ControlPlane::Impl::settle(const OutgoingPtr& out, std::exception_ptr error) {
  {
    std::lock_guard lock(mutex);
    out->done = true;
    out->error = std::move(error);
  }
  if (!out->heartbeat) changed.notify_all();
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
  // Nothing left to beat for.
  if (none_open && heartbeat_timer) heartbeat_timer->cancel();
  // Hang up: a write in progress fails (EPIPE), and the writer, woken, fails what is queued
  // and returns. The descriptor stays open until ~ControlPlane.
  boost::system::error_code ignored;
  c.socket.shutdown(asio::socket_base::shutdown_both, ignored);
  c.wake.cancel();
  if (expected) return;
  terminate(exit_status(Errc::unavailable), fmt::format("rank {} is gone: {}", c.rank, why),
            c.rank);
}

// Another rank's failure (@p status, @p message; from rank @p origin) ends the job: on rank
// 0 after telling every other rank but @p origin (the ABORT is queued to each writer, which
// gives it 2 s as `abort` does; nobody waits for it here). Nothing here ends the process: the main
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
    auto out = std::make_shared<Outgoing>();
    out->frame = frame;
    out->most = detail::abort_send_most;
    queue(*connection, std::move(out));
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
