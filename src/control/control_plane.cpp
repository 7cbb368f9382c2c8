// The control plane's session, from its callers' threads: rank 0's shared bytes, reports, the
// verdict, ABORT and the waits for the other ranks (the rendezvous: rendezvous.cpp; the
// coroutines on the io_context: control_reader.cpp).
#include "weightcast/control/control_plane.hpp"

#include "weightcast/control/detail/control_session.hpp"
#include "weightcast/control/detail/rendezvous.hpp"

#include <boost/asio/post.hpp>
#include <fmt/core.h>


namespace weightcast {

using detail::encode_status;
using detail::frame_bytes;
using detail::milliseconds;
using detail::rank_list;
using Clock = detail::ControlClock;
using Frame = detail::Frame;
using detail::Connection;

namespace {

// How long rank 0 waits for the others to hang up after an ABORT: long enough for them to
// print it, short enough that a stopped peer does not hold the job.
constexpr std::chrono::milliseconds abort_grace{10'000};

}  // namespace

// Throws another rank's failure, once the reader has recorded one. Caller holds `mutex`.
void ControlPlane::Impl::throw_if_remote_failure() const {
  if (remote_failure) {
    throw RemoteAbort(errc_for_exit_status(remote_failure->first), remote_failure->second);
  }
}

detail::OutgoingPtr ControlPlane::Impl::post(Connection& c, std::string frame,
                                              Clock::duration most) {
  auto out = std::make_shared<detail::Outgoing>();
  out->frame = std::move(frame);
  out->most = most;
  boost::asio::post(io, [this, &c, out] { queue(c, out); });
  return out;
}

std::exception_ptr ControlPlane::Impl::outcome(const detail::OutgoingPtr& out) {
  std::unique_lock lock(mutex);
  // The writer settles every frame within its bound; a second more covers a frame queued
  // behind another. Only a stopped io_context (stop_reader) leaves one unsettled.
  if (!wait_running(lock, out->most + std::chrono::seconds(1), [&] { return out->done; })) {
    return std::make_exception_ptr(
        Error(Errc::timeout, "control plane: a message was not sent within the timeout "
                             "(the control plane is stopped)"));
  }
  return out->error;
}

void ControlPlane::Impl::send_quietly(const std::string& frame) noexcept {
  try {
    std::vector<detail::OutgoingPtr> sent;
    for (auto& connection : connections) {
      if (connection) sent.push_back(post(*connection, frame, detail::abort_send_most));
    }
    // A peer that cannot take it is dead or stalled; the launcher reaps it.
    for (const auto& out : sent) outcome(out);
  } catch (...) {
  }
}

void ControlPlane::Impl::send(Connection& c, Frame type, std::string_view payload) {
  try {
    if (auto error = outcome(post(c, frame_bytes(type, payload), options.timeout))) {
      std::rethrow_exception(error);
    }
  } catch (const Error&) {
    // A peer that failed sends its ABORT and hangs up: a send to it may fail (EPIPE) before
    // the reader has read that ABORT. Give the reader a moment; when it is ending the
    // process with the peer's message and status, that is the job's cause, not this send.
    std::unique_lock lock(mutex);
    wait_running(lock, std::chrono::seconds(1),
                 [&] { return c.closed || remote_failure.has_value(); });
    if (!sent_abort) throw_if_remote_failure();
    throw;
  }
}

// Sends @p bytes as one frame of @p last, or, longer than one frame carries
// (max_share_bytes), as frames of @p part of that size and a last one of @p last.
void ControlPlane::Impl::send_in_pieces(Connection& c, Frame part, Frame last,
                                        std::string_view bytes) {
  while (bytes.size() > detail::max_share_bytes) {
    send(c, part, bytes.substr(0, detail::max_share_bytes));
    bytes.remove_prefix(detail::max_share_bytes);
  }
  send(c, last, bytes);
}

ControlPlane::ControlPlane(const World& world, const RendezvousOptions& options)
    : _impl(std::make_unique<Impl>(world, options)) {
  if (world.world_size <= 1) return;
  if (world.rank == 0) {
    auto sockets = detail::accept_peers(_impl->io, world, options);
    _impl->connections.resize(world.world_size);
    for (int r = 1; r < world.world_size; ++r) {
      _impl->connections[r] = std::make_unique<detail::Connection>(r, std::move(*sockets[r]));
    }
  } else {
    _impl->connections.push_back(std::make_unique<detail::Connection>(
        0, detail::connect_to_root(_impl->io, world, options)));
  }
  _impl->start();
}

ControlPlane::~ControlPlane() {
  if (!_impl) return;
  _impl->io.stop();
  if (_impl->io_thread.joinable()) _impl->io_thread.join();
}

bool ControlPlane::ending() const noexcept { return _impl->ending; }

void ControlPlane::note_progress(std::uint64_t chunks_landed) noexcept {
  _impl->my_progress.store(chunks_landed, std::memory_order_relaxed);
}

std::string ControlPlane::stall_report() const {
  Impl& impl = *_impl;
  if (impl.world.world_size <= 1) return {};
  const auto now = Clock::now();
  std::vector<int> silent;
  std::vector<std::pair<int, std::uint64_t>> silent_progress;  // as last heard
  Clock::duration quiet = Clock::duration::max();  // the shortest silence among them
  std::vector<std::pair<int, std::uint64_t>> alive{{impl.world.rank, impl.my_progress.load()}};
  {
    std::lock_guard lock(impl.mutex);
    for (const auto& connection : impl.connections) {
      if (!connection || connection->closed) continue;
      if (impl.silent(*connection, now)) {
        silent.push_back(connection->rank);
        silent_progress.emplace_back(connection->rank, connection->progress);
        quiet = std::min(quiet, now - connection->last_heard);
      } else {
        alive.emplace_back(connection->rank, connection->progress);
      }
    }
  }
  std::sort(alive.begin(), alive.end());
  std::string out;
  if (!silent.empty()) {
    std::sort(silent.begin(), silent.end());
    std::sort(silent_progress.begin(), silent_progress.end());
    // A heartbeat thread answers whatever the load is blocked in, so silence is a stopped or
    // hung process, or a network that no longer carries its frames (a link down).
    out = fmt::format("rank(s) {} sent nothing over the control plane for {:.1f} s (stopped, "
                      "the process hung, or the network to it failed",
                      rank_list(silent), std::chrono::duration<double>(quiet).count());
    // How far the silent got, as last heard (the others' counts follow); nothing before the
    // load, when every count is 0.
    const bool loading =
        std::any_of(alive.begin(), alive.end(), [](auto& a) { return a.second > 0; }) ||
        std::any_of(silent_progress.begin(), silent_progress.end(),
                    [](auto& a) { return a.second > 0; });
    if (loading && silent_progress.size() <= 8) {
      for (std::size_t i = 0; i < silent_progress.size(); ++i) {
        out += fmt::format("{} rank {} had landed {} chunks when last heard",
                           i == 0 ? ";" : ",", silent_progress[i].first,
                           silent_progress[i].second);
      }
    }
    out += ")";
  } else {
    out = impl.world.rank == 0 ? "every rank answers on the control plane"
                               : "rank 0 answers on the control plane";
  }
  const auto [fewest, most] = std::minmax_element(
      alive.begin(), alive.end(), [](auto& a, auto& b) { return a.second < b.second; });
  if (most->second == 0) {
    // Before the load (a rendezvous, MPI_Init_thread): no chunk counts to tell.
  } else if (alive.size() <= 8) {
    out += "; chunks landed:";
    for (std::size_t i = 0; i < alive.size(); ++i) {
      out += fmt::format("{} rank {} {}", i == 0 ? "" : ",", alive[i].first, alive[i].second);
    }
    // Rank 0 sees every count: with none silent, the ranks behind are the ones to look at
    // (a link that still carries heartbeats but crawls, say).
    if (silent.empty() && impl.world.rank == 0 && fewest->second != most->second) {
      std::vector<int> behind;
      for (const auto& [rank, chunks] : alive) {
        if (chunks == fewest->second) behind.push_back(rank);
      }
      out += fmt::format("; furthest behind: rank(s) {} (a slow rank, or a slow link to it)",
                         rank_list(behind));
    }
  } else if (fewest->second == most->second) {
    out += fmt::format("; chunks landed: {} on each of {} ranks", fewest->second, alive.size());
  } else {
    std::vector<int> behind;
    for (const auto& [rank, chunks] : alive) {
      if (chunks == fewest->second) behind.push_back(rank);
    }
    out += fmt::format("; fewest chunks landed: {}, on rank(s) {}; most: {}", fewest->second,
                       rank_list(behind), most->second);
  }
  return out;
}

void ControlPlane::await_hangups(std::chrono::milliseconds most) {
  Impl& impl = *_impl;
  if (impl.world.rank != 0 || impl.world.world_size <= 1) return;
  std::vector<int> open;
  {
    std::unique_lock lock(impl.mutex);
    if (impl.wait_running(lock, most, [&] { return impl.all_closed(); })) return;
    for (auto& connection : impl.connections) {
      if (connection && !connection->closed) open.push_back(connection->rank);
    }
  }
  throw Error(Errc::timeout,
              fmt::format("rank(s) {} did not end within {} of the verdict (timeout): {}",
                          rank_list(open), milliseconds(most), stall_report()));
}

void ControlPlane::on_ending(std::function<void()> hook) {
  std::lock_guard running(_impl->ending_hook_mutex);  // a hook in progress returns first
  std::lock_guard lock(_impl->mutex);
  _impl->ending_hook = std::move(hook);
}

void ControlPlane::linger(std::chrono::milliseconds most) noexcept {
  Impl& impl = *_impl;
  if (impl.world.rank == 0 || impl.connections.empty() || !impl.connections[0]) return;
  std::unique_lock lock(impl.mutex);
  if (!impl.sent_abort) return;
  const Connection& root = *impl.connections[0];
  impl.wait_running(lock, most, [&] { return root.closed; });
}

void ControlPlane::defer_to_root(std::chrono::milliseconds most) noexcept {
  Impl& impl = *_impl;
  if (impl.world.rank == 0 || impl.connections.empty() || !impl.connections[0]) return;
  std::unique_lock lock(impl.mutex);
  const Connection& root = *impl.connections[0];
  // Rank 0's ABORT or a lost connection (remote_failure); a silent rank 0 will send neither.
  impl.wait_running(lock, most, [&] {
    return root.closed || impl.remote_failure.has_value() || impl.silent(root, Clock::now());
  });
}

void ControlPlane::stop_reader(std::chrono::milliseconds most) noexcept {
  Impl* impl = _impl.get();
  if (impl == nullptr || !impl->io_thread.joinable() ||
      impl->io_thread.get_id() == std::this_thread::get_id()) {
    return;
  }
  impl->io.stop();  // thread-safe; run() returns once the handler in progress, if any, ends
  if (impl->io_returned.wait_for(most) == std::future_status::ready) impl->io_thread.join();
}

int ControlPlane::rank() const noexcept { return _impl->world.rank; }
int ControlPlane::world_size() const noexcept { return _impl->world.world_size; }

bool ControlPlane::aborted() const noexcept {
  std::lock_guard lock(_impl->mutex);
  return _impl->sent_abort;
}

std::optional<RemoteAbort> ControlPlane::remote_failure() const {
  std::lock_guard lock(_impl->mutex);
  if (!_impl->remote_failure) return std::nullopt;
  return RemoteAbort(errc_for_exit_status(_impl->remote_failure->first),
                     _impl->remote_failure->second);
}

void ControlPlane::await_told() noexcept {
  Impl& impl = *_impl;
  if (impl.world.rank != 0 || impl.world.world_size <= 1) return;
  std::unique_lock lock(impl.mutex);
  // A silent rank (stopped) is not waited for; the wait wakes each heartbeat to see.
  impl.wait_running(lock, std::min<Clock::duration>(impl.options.timeout, abort_grace),
                    [&] { return impl.none_to_wait_for(Clock::now()); });
}

std::string ControlPlane::share(std::string bytes) {
  Impl& impl = *_impl;
  if (impl.world.world_size <= 1) return bytes;
  if (impl.world.rank == 0) {
    for (auto& connection : impl.connections) {
      if (connection) impl.send_in_pieces(*connection, Frame::share_part, Frame::share, bytes);
    }
    return bytes;
  }
  std::unique_lock lock(impl.mutex);
  if (!impl.wait_running(lock, impl.options.timeout, [&] {
        return !impl.shared.empty() || impl.remote_failure.has_value();
      })) {
    throw Error(Errc::timeout, fmt::format("control plane: nothing from rank 0 within {} "
                                           "(rank 0 stalled?)",
                                           milliseconds(impl.options.timeout)));
  }
  impl.throw_if_remote_failure();
  std::string front = std::move(impl.shared.front());
  impl.shared.pop_front();
  return front;
}

void ControlPlane::abort(const Error& error) noexcept {
  Impl& impl = *_impl;
  if (impl.world.world_size <= 1) return;
  const std::string frame =
      frame_bytes(Frame::abort, encode_status(exit_status(error.code()), error.what()));
  impl.ending = true;
  {
    std::lock_guard lock(impl.mutex);
    if (impl.sent_abort) return;
    impl.sent_abort = true;
    if (impl.world.rank == 0 && impl.terminating) return;  // the reader is already on it
    if (impl.world.rank == 0) impl.terminating = true;
  }
  impl.send_quietly(frame);
  if (impl.world.rank != 0) return;
  // Let the others print the message before the launcher tears the job down.
  std::unique_lock lock(impl.mutex);
  // A silent rank (stopped) is not waited for; the wait wakes each heartbeat to see.
  impl.wait_running(lock, std::min<Clock::duration>(impl.options.timeout, abort_grace),
                    [&] { return impl.none_to_wait_for(Clock::now()); });
}

std::vector<RankReport> ControlPlane::gather(RankReport mine, std::string_view what) {
  Impl& impl = *_impl;
  mine.rank = impl.world.rank;
  if (impl.world.rank != 0) {
    impl.send_in_pieces(*impl.connections.at(0), Frame::report_part, Frame::report,
                        detail::encode_report(mine));
    return {};
  }
  std::unique_lock lock(impl.mutex);
  impl.reports.resize(impl.world.world_size);
  impl.reports[0] = std::move(mine);
  const bool all = impl.wait_running(lock, impl.options.timeout, [&] {
    if (impl.remote_failure) return true;
    for (auto& r : impl.reports) {
      if (!r) return false;
    }
    return true;
  });
  impl.throw_if_remote_failure();
  if (!all) {
    std::vector<int> missing;
    for (int r = 1; r < impl.world.world_size; ++r) {
      if (!impl.reports[r]) missing.push_back(r);
    }
    throw Error(Errc::timeout, fmt::format("no {} from rank(s) {} within {} (stalled?)", what,
                                           rank_list(missing), milliseconds(impl.options.timeout)));
  }
  std::vector<RankReport> out;
  for (auto& r : impl.reports) out.push_back(std::move(*r));
  // Under the lock: a report that arrives from now on is the next gather's.
  impl.reports.assign(impl.reports.size(), std::nullopt);
  return out;
}

Verdict ControlPlane::finish(Verdict verdict) {
  Impl& impl = *_impl;
  if (impl.world.world_size <= 1) return verdict;
  if (impl.world.rank == 0) {
    {
      std::lock_guard lock(impl.mutex);
      impl.finished = true;
    }
    impl.send_quietly(frame_bytes(Frame::done, encode_status(verdict.status, verdict.message)));
    return verdict;
  }
  std::unique_lock lock(impl.mutex);
  if (!impl.wait_running(lock, impl.options.timeout, [&] {
        return impl.verdict.has_value() || impl.remote_failure.has_value();
      })) {
    throw Error(Errc::timeout, fmt::format("no verdict from rank 0 within {} (rank 0 stalled?)",
                                           milliseconds(impl.options.timeout)));
  }
  if (!impl.verdict) impl.throw_if_remote_failure();
  return *impl.verdict;
}

}  // namespace weightcast