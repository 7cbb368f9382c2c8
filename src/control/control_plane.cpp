// The control plane over TCP: rendezvous with a job token, rank 0's shared bytes, ABORT,
// final reports. Boost.Asio lives here only (it is slow to compile).
#include "weightcast/control/control_plane.hpp"

#include "weightcast/config/config.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/detail/running_time.hpp"
#include "weightcast/core/log.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <utility>

namespace weightcast {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

RendezvousOptions rendezvous_options(const Config& config, const World& world) {
  RendezvousOptions options;
  if (!config.rendezvous_address.empty()) {
    options.address = config.rendezvous_address;
    options.address_source = "rendezvous.address";
  } else if (!world.master_addr.empty()) {
    options.address = world.master_addr;
    options.address_source = "MASTER_ADDR";
  } else if (!world.root_host.empty()) {
    options.address = world.root_host;
    options.address_source = world.root_host_source;
  }
  options.spans_hosts = world.spans_hosts;
  // "[::1]", as an IPv6 address is written beside a port (RFC 3986), is the address ::1.
  if (options.address.size() > 2 && options.address.front() == '[' &&
      options.address.back() == ']') {
    options.address = options.address.substr(1, options.address.size() - 2);
  }
  options.port = config.rendezvous_port;
  options.token = config.rendezvous_token;
  if (options.token.empty()) {
    if (const char* token = std::getenv("WEIGHTCAST_TOKEN")) options.token = token;
  }
  options.timeout = config.timeout;
  options.job_id = world.job_id;
  options.job_id_source = world.job_id_source;
  return options;
}

namespace {

// "1-3, 5, 7-1023": ranks, ascending, with runs as ranges; at most 16 items, then how many
// ranks in all (a world of a million ranks must not make a megabyte message).
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  std::size_t items = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (items == 16) {
      out += fmt::format(", … ({} ranks in all)", ranks.size());
      break;
    }
    out += (out.empty() ? "" : ", ") + (j == i ? std::to_string(ranks[i])
                                                : fmt::format("{}-{}", ranks[i], ranks[j]));
    ++items;
    i = j + 1;
  }
  return out;
}

using detail::Frame;
using detail::frame_bytes;
using detail::frame_header_bytes;
using detail::FrameReader;
using detail::decode_status;
using detail::encode_status;
// Rank 0 gives each connection this long (at most) to say hello: a stranger that connects
// and says nothing, or trickles bytes, holds a file descriptor no longer than this.
constexpr std::chrono::milliseconds greeting_timeout{5'000};
// Connections rank 0 lets wait for their hello at once; one more closes the oldest, so a
// flood of silent connections cannot exhaust file descriptors nor lock real peers out (a
// real peer says hello within a round trip of connecting).
constexpr std::size_t max_pending_greetings = 64;
// Pause before accepting again when the process is out of file descriptors (EMFILE, ENFILE)
// or memory: the connection waits in the backlog meanwhile, and retrying at once would spin.
constexpr std::chrono::milliseconds accept_backoff{100};
// How long rank 0 waits for the others to hang up after an ABORT: long enough for them to
// print it, short enough that a stopped peer does not hold the job.
constexpr std::chrono::milliseconds abort_grace{10'000};

// The longest step of a rendezvous wait between looks at `RendezvousOptions::stop`.
constexpr std::chrono::milliseconds stop_step{100};

// How far past what was asked a wait ran, when it ran past it: time this process did not run
// (stopped by SIGSTOP or a debugger, or starved), which does not count against a deadline.
// Every wait here waits in steps of at most a second and moves its deadline on by this (the
// rule of the loader's watchdog): a rank stopped for `timeout` and resumed would otherwise
// find its deadline passed before it looked at what arrived meanwhile, and blame the others.
Clock::duration overrun(Clock::duration took, Clock::duration asked) {
  return std::max(took - asked, Clock::duration::zero());
}

std::string milliseconds(std::chrono::milliseconds d) { return fmt::format("{} ms", d.count()); }

// "host:port", or "[v6:address]:port" for an IPv6 address (RFC 3986's form).
std::string host_port(std::string_view host, unsigned port) {
  return host.find(':') != std::string_view::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
}

// What to try when rank 0 cannot listen on its rendezvous address, by the bind's error.
std::string listen_hint(const boost::system::error_code& ec) {
  if (ec.category() != boost::system::system_category()) return "";
  switch (ec.value()) {
    case EADDRINUSE:
      return " (another job on this port? give each job its own rendezvous.port)";
    case EADDRNOTAVAIL:
      return " (no interface of this host has that address: set rendezvous.address to one "
             "of this host's, or leave it auto)";
    case EACCES:
      return " (ports below 1024 need privileges: set rendezvous.port to 1024 or more)";
    case EINVAL:
      return " (an IPv6 link-local address needs its interface: fe80::1%eth0)";
    default:
      return "";
  }
}

// Sends a whole frame before @p deadline (moved on by the time this process did not run:
// overrun); the socket may be non-blocking (Asio's reactor).
void send_all(int fd, std::string_view bytes, Clock::time_point deadline, int peer_rank) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      bytes.remove_prefix(static_cast<std::size_t>(sent));
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                              Clock::now());
      if (left.count() <= 0) {
        throw Error(Errc::timeout,
                    fmt::format("control plane: rank {} did not take a message within the "
                                "timeout (stalled?)",
                                peer_rank));
      }
      pollfd p{fd, POLLOUT, 0};
      const std::chrono::milliseconds step(std::min<long long>(left.count(), 1000));
      const auto begin = Clock::now();
      ::poll(&p, 1, static_cast<int>(step.count()));
      deadline += overrun(Clock::now() - begin, step);
      continue;
    }
    throw system_error(Errc::unavailable, errno,
                       fmt::format("control plane: sending to rank {}", peer_rank));
  }
}

// Reads rank 0's answer to a hello before @p deadline, moved on like send_all's (later the
// reader thread reads).
// @return nothing when the connection closed (@p timed_out false) or the deadline passed
//         (@p timed_out true).
// @throws Error `unavailable` when the header is not one a joining peer accepts (checked
//         before the payload is read or allocated).
std::optional<std::pair<Frame, std::string>> recv_reply(int fd, Clock::time_point deadline,
                                                        std::string_view what, bool& timed_out) {
  timed_out = false;
  auto read_exact = [&](char* out, std::size_t bytes) {
    while (bytes > 0) {
      const ssize_t got = ::recv(fd, out, bytes, MSG_DONTWAIT);
      if (got > 0) {
        out += got;
        bytes -= static_cast<std::size_t>(got);
        continue;
      }
      if (got == 0) return false;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                              Clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        return false;
      }
      pollfd p{fd, POLLIN, 0};
      const std::chrono::milliseconds step(std::min<long long>(left.count(), 1000));
      const auto begin = Clock::now();
      ::poll(&p, 1, static_cast<int>(step.count()));
      deadline += overrun(Clock::now() - begin, step);
    }
    return true;
  };
  std::array<char, frame_header_bytes> header{};
  if (!read_exact(header.data(), header.size())) return std::nullopt;
  const auto [type, length] = detail::decode_frame_header(header, FrameReader::joining, what);
  std::string payload(length, '\0');
  if (!read_exact(payload.data(), length)) return std::nullopt;
  return std::make_pair(type, std::move(payload));
}

// A loopback rendezvous in a world on several hosts: rank 0 would listen where no other host
// can reach it and every rank off its host would retry until `timeout` and then blame rank 0.
void refuse_loopback(const RendezvousOptions& options, const tcp::endpoint& endpoint) {
  if (options.spans_hosts.empty() || !endpoint.address().is_loopback()) return;
  const std::string resolved = endpoint.address().to_string() == options.address
                                   ? std::string()
                                   : fmt::format(" (resolved to {})", endpoint.address().to_string());
  throw Error(Errc::config,
              fmt::format("rendezvous: address {}{} from {} is loopback, but the ranks run on "
                          "more than one host ({}): the ranks on other hosts cannot reach rank "
                          "0 there; set rendezvous.address (or MASTER_ADDR) to an address of "
                          "rank 0's host that every host can reach",
                          options.address, resolved, options.address_source,
                          options.spans_hosts));
}

tcp::endpoint resolve(const RendezvousOptions& options) {
  boost::system::error_code ec;
  auto address = asio::ip::make_address(options.address, ec);
  if (!ec) {
    const tcp::endpoint endpoint(address, options.port);
    refuse_loopback(options, endpoint);
    return endpoint;
  }
  asio::io_context io;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(options.address, std::to_string(options.port), ec);
  if (ec || results.empty()) {
    throw Error(Errc::unavailable,
                fmt::format("rendezvous: cannot resolve {} '{}': {}",
                            options.address_source == "rendezvous.address"
                                ? std::string("rendezvous.address")
                                : fmt::format("rank 0's address (from {})", options.address_source),
                            options.address, ec.message()));
  }
  refuse_loopback(options, results.begin()->endpoint());
  return results.begin()->endpoint();
}

// Every control-plane message is one small write that waits for its answer (hello → welcome,
// catalogue → ready, report → verdict). Under Nagle's algorithm a write that follows one not
// yet acknowledged waits for the peer's delayed ACK (40 ms on Linux): measured here, every
// load on several ranks waited 40–50 ms for the catalogue. Best effort: a socket that refuses
// the option still works, later.
void no_delay(tcp::socket& socket) {
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
}

// Moves a connected socket from the rendezvous io_context to the long-lived one.
tcp::socket rehome(tcp::socket& socket, asio::io_context& io) {
  const auto protocol = socket.local_endpoint().protocol();
  const int fd = socket.release();
  return tcp::socket(io, protocol, fd);
}


}  // namespace

/// One rank 0 ⇄ peer connection.
struct Connection {
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

struct ControlPlane::Impl {
  World world;
  RendezvousOptions options;
  asio::io_context io;
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
  std::optional<asio::steady_timer> heartbeat_timer;
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

  // ---- rendezvous ------------------------------------------------------------------------

  void accept_peers() {
    const tcp::endpoint endpoint = resolve(options);
    asio::io_context rendezvous_io;
    tcp::acceptor acceptor(rendezvous_io);
    boost::system::error_code ec;
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw Error(Errc::unavailable,
                  fmt::format("rendezvous: cannot listen on {}: {}{}",
                              host_port(options.address, options.port), ec.message(),
                              listen_hint(ec)));
    }
    spdlog::debug("rendezvous: listening on {} (from {}) for {} peer(s)",
                  host_port(options.address, options.port), options.address_source,
                  world.world_size - 1);
    connections.resize(world.world_size);
    auto deadline = Clock::now() + options.timeout;  // moved on by overrun
    const auto greeting_wait = std::min(options.timeout, greeting_timeout);
    int joined = 0;
    int refused = 0;
    int dropped = 0;  // closed unheard: no hello in time, or the oldest of too many waiting
    std::string last_refusal;
    bool warned_flood = false;
    bool warned_accept = false;

    // A connection that has not shown the job token yet. It may be a stranger, so it gets
    // a deadline of its own and at most `max_hello_bytes` are read from it.
    struct Greeting {
      Greeting(tcp::socket s, asio::io_context& context)
          : socket(std::move(s)), timer(context) {}
      tcp::socket socket;
      asio::steady_timer timer;
      std::array<char, frame_header_bytes> header{};
      std::string payload;
      std::string from;
      bool over = false;  // joined, refused, timed out or closed
    };
    using GreetingPtr = std::shared_ptr<Greeting>;
    std::deque<GreetingPtr> pending;  // oldest first

    // Forgets @p g (its handlers then see `over` and return); the socket stays open.
    auto forget = [&](Greeting& g) {
      g.over = true;
      std::erase_if(pending, [&](const GreetingPtr& p) { return p.get() == &g; });
      g.timer.cancel();
    };
    auto close_greeting = [&](Greeting& g) {
      if (g.over) return;
      forget(g);
      boost::system::error_code ignored;
      g.socket.close(ignored);
    };
    auto refuse = [&](Greeting& g, std::string reason) {
      reason.resize(std::min(reason.size(), detail::max_status_message_bytes));
      last_refusal = fmt::format("from {}: {}", g.from, reason);
      // A wrong-token peer is worth a warning; a stream of junk connections is not worth a
      // screenful.
      if (++refused <= 10) {
        spdlog::warn("rendezvous: refused a connection {}{}", last_refusal,
                     refused == 10 ? " (further refusals are logged at debug level)" : "");
      } else {
        spdlog::debug("rendezvous: refused a connection {}", last_refusal);
      }
      try {
        // A fresh socket's send buffer takes a refusal at once; never let one hold the loop.
        send_all(g.socket.native_handle(), frame_bytes(Frame::reject, reason),
                 Clock::now() + std::chrono::milliseconds(100), -1);
      } catch (const Error&) {
        // The refused peer learns by the closed connection instead.
      }
      close_greeting(g);
    };
    auto on_hello = [&](Greeting& g) {
      detail::Hello hello;
      try {
        hello = detail::decode_hello(g.payload, "hello");
      } catch (const Error& e) {
        return refuse(g, e.what());
      }
      // The token first: a stranger learns nothing about this job's shape.
      if (!detail::tokens_equal(hello.token, options.token)) {
        return refuse(g, "wrong job token (a rank of another job on this port, or ranks "
                         "started with different rendezvous.token or WEIGHTCAST_TOKEN)");
      }
      const int rank = hello.rank;
      // Without a token two jobs on one port would take each other's ranks (plain mpirun
      // sets none); their launchers' job ids tell them apart.
      if (!hello.job_id.empty() && !options.job_id.empty() && hello.job_id != options.job_id) {
        return refuse(g, fmt::format("rank {} belongs to another job: its launcher's job id is "
                                     "'{}', this job's is '{}' ({}); two jobs are using "
                                     "rendezvous port {}: give each its own rendezvous.port",
                                     rank, printable(hello.job_id), printable(options.job_id),
                                     options.job_id_source, options.port));
      }
      if (hello.world_size != world.world_size) {
        return refuse(g, fmt::format("world size {}, rank 0 has {}", hello.world_size,
                                     world.world_size));
      }
      if (rank <= 0 || rank >= world.world_size) {
        return refuse(g, fmt::format("rank {} is not a peer rank of a world of {}", rank,
                                     world.world_size));
      }
      if (connections[rank]) return refuse(g, fmt::format("rank {} already joined", rank));
      try {
        send_all(g.socket.native_handle(), frame_bytes(Frame::welcome, {}),
                 std::min(deadline, Clock::now() + std::chrono::seconds(1)), rank);
      } catch (const Error&) {
        return close_greeting(g);
      }
      forget(g);
      connections[rank] = std::make_unique<Connection>(rank, rehome(g.socket, io));
      ++joined;
      spdlog::debug("rendezvous: rank {} joined from {}", rank, g.from);
    };
    auto greet = [&](tcp::socket socket) {
      auto g = std::make_shared<Greeting>(std::move(socket), rendezvous_io);
      boost::system::error_code peer_error;
      auto remote = g->socket.remote_endpoint(peer_error);
      g->from = peer_error ? std::string("?")
                           : host_port(remote.address().to_string(), remote.port());
      if (pending.size() >= max_pending_greetings) {
        // A real peer says hello within a round trip; the oldest waiting is the likeliest
        // stranger.
        const GreetingPtr oldest = pending.front();
        ++dropped;
        if (!std::exchange(warned_flood, true)) {
          spdlog::warn("rendezvous: {} connections are waiting to say hello; closing the "
                       "oldest, from {} (a flood of connections? further ones at debug level)",
                       pending.size(), oldest->from);
        } else {
          spdlog::debug("rendezvous: closing the connection from {}: too many waiting",
                        oldest->from);
        }
        close_greeting(*oldest);
      }
      pending.push_back(g);
      g->timer.expires_after(greeting_wait);
      g->timer.async_wait([&, g](boost::system::error_code error) {
        if (error || g->over) return;
        ++dropped;
        spdlog::debug("rendezvous: closing the connection from {}: no hello within {}",
                      g->from, milliseconds(greeting_wait));
        close_greeting(*g);
      });
      asio::async_read(g->socket, asio::buffer(g->header), [&, g](auto error, std::size_t) {
        if (error || g->over) return close_greeting(*g);
        detail::FrameHeader header{};
        try {
          // Checked before anything is allocated: a 4 GiB length is refused from 5 bytes.
          header = detail::decode_frame_header(g->header, FrameReader::greeting,
                                               "first message");
        } catch (const Error& e) {
          return refuse(*g, fmt::format("not a weightcast hello ({})", e.what()));
        }
        g->payload.resize(header.payload_bytes);
        asio::async_read(g->socket, asio::buffer(g->payload), [&, g](auto error2, std::size_t) {
          if (error2 || g->over) return close_greeting(*g);
          on_hello(*g);
        });
      });
    };
    // Keeps accepting through errors until the rendezvous closes the acceptor: a failed
    // accept (out of file descriptors, a connection reset before it was taken) must not lock
    // the real peers out.
    asio::steady_timer accept_pause(rendezvous_io);
    std::function<void()> accept_next = [&] {
      acceptor.async_accept([&](boost::system::error_code error, tcp::socket socket) {
        if (!acceptor.is_open() || error == asio::error::operation_aborted) return;
        if (!error) {
          no_delay(socket);
          greet(std::move(socket));
          return accept_next();
        }
        const bool exhausted = error.category() == boost::system::system_category() &&
                               (error.value() == EMFILE || error.value() == ENFILE ||
                                error.value() == ENOBUFS || error.value() == ENOMEM);
        const auto pause = exhausted ? accept_backoff : std::chrono::milliseconds(10);
        if (exhausted && !std::exchange(warned_accept, true)) {
          spdlog::warn("rendezvous: cannot accept a connection on {}: {}; retrying every {}",
                       host_port(options.address, options.port), error.message(),
                       milliseconds(pause));
        } else {
          spdlog::debug("rendezvous: accept failed: {}; retrying in {}", error.message(),
                        milliseconds(pause));
        }
        accept_pause.expires_after(pause);
        accept_pause.async_wait([&](boost::system::error_code wait_error) {
          if (!wait_error && acceptor.is_open()) accept_next();
        });
      });
    };
    accept_next();
    while (joined < world.world_size - 1 && Clock::now() < deadline &&
           !options.stop.stop_requested()) {
      // In short steps: a rank 0 stopped meanwhile takes, once resumed, the hellos waiting in
      // its sockets rather than blaming the ranks that sent them, and a stop ends the wait.
      const auto begin = Clock::now();
      const auto until = std::min<Clock::time_point>(deadline, begin + stop_step);
      rendezvous_io.run_one_until(until);
      deadline += overrun(Clock::now() - begin, until - begin);
    }
    acceptor.close();
    for (const GreetingPtr& g : std::deque<GreetingPtr>(pending)) close_greeting(*g);
    if (joined == world.world_size - 1) return;

    std::vector<int> missing;
    for (int r = 1; r < world.world_size; ++r) {
      if (!connections[r]) missing.push_back(r);
    }
    const bool stopped = options.stop.stop_requested();
    std::string message =
        stopped ? fmt::format("rendezvous: stopped (RendezvousOptions::stop) while rank(s) {} "
                              "had not joined rank 0 at {}",
                              rank_list(missing), host_port(options.address, options.port))
                : fmt::format("rendezvous: rank(s) {} did not join rank 0 at {} within {}",
                              rank_list(missing), host_port(options.address, options.port),
                              milliseconds(options.timeout));
    const Errc code = stopped ? Errc::interrupted : Errc::timeout;
    if (refused > 0) {
      message += fmt::format("; refused {} connection(s), last {}", refused, last_refusal);
    }
    if (dropped > 0) {
      message += fmt::format("; closed {} connection(s) that sent no hello in time", dropped);
    }
    const std::string abort_message = fmt::format("rank 0: {}", message);
    for (auto& connection : connections) {
      if (!connection) continue;
      try {
        send_all(connection->socket.native_handle(),
                 frame_bytes(Frame::abort, encode_status(exit_status(code), abort_message)),
                 Clock::now() + std::chrono::seconds(1), connection->rank);
      } catch (const Error&) {
      }
    }
    throw Error(code, message);
  }

  void connect_to_root() {
    const tcp::endpoint endpoint = resolve(options);
    auto deadline = Clock::now() + options.timeout;  // moved on by overrun
    // Ranks usually start together and try before rank 0 listens: the first retries come
    // soon (a refused connect costs microseconds), or every load waits out the first pause.
    auto backoff = std::chrono::milliseconds(2);
    std::string last_error = "no attempt";
    auto pause = [&] {
      const auto step = std::min<Clock::duration>(
          std::min<Clock::duration>(backoff, stop_step), deadline - Clock::now());
      const auto begin = Clock::now();
      std::this_thread::sleep_for(step);
      deadline += overrun(Clock::now() - begin, step);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    };
    auto check_stop = [&] {
      if (!options.stop.stop_requested()) return;
      throw Error(Errc::interrupted,
                  fmt::format("rendezvous: stopped (RendezvousOptions::stop) before rank 0 at {} "
                              "accepted this rank",
                              host_port(options.address, options.port)));
    };
    const std::string hello_payload =
        detail::encode_hello({world.rank, world.world_size, options.token, options.job_id});
    if (options.token.size() > detail::max_token_bytes) {
      // Rank 0 would refuse the hello unread; say why here.
      throw Error(Errc::config, fmt::format("rendezvous.token is {} bytes; rank 0 takes at most {}",
                                            options.token.size(), detail::max_token_bytes));
    }
    const std::string hello = frame_bytes(Frame::hello, hello_payload);
    while (Clock::now() < deadline) {
      check_stop();
      asio::io_context connect_io;
      tcp::socket socket(connect_io);
      boost::system::error_code result = asio::error::would_block;
      socket.async_connect(endpoint, [&](boost::system::error_code ec) { result = ec; });
      // Up to 5 s for the connect, in steps of a second (overrun).
      auto connect_until = std::min(deadline, Clock::now() + std::chrono::seconds(5));
      while (result == asio::error::would_block && Clock::now() < connect_until &&
             !options.stop.stop_requested()) {
        const auto begin = Clock::now();
        const auto until = std::min<Clock::time_point>(connect_until, begin + stop_step);
        connect_io.run_until(until);
        const auto stopped = overrun(Clock::now() - begin, until - begin);
        deadline += stopped;
        connect_until += stopped;
      }
      check_stop();
      if (result == asio::error::would_block) {
        last_error = "connect timed out";
        continue;
      }
      if (result) {
        last_error = result.message();
        pause();
        continue;
      }
      no_delay(socket);
      try {
        send_all(socket.native_handle(), hello, deadline, 0);
      } catch (const Error& e) {
        // Closed before the hello went out (e.g. as the oldest of a flood): try again.
        last_error = e.what();
        pause();
        continue;
      }
      std::optional<std::pair<Frame, std::string>> reply;
      bool timed_out = false;
      try {
        reply = recv_reply(socket.native_handle(), deadline, "reply", timed_out);
      } catch (const Error& e) {
        throw Error(Errc::unavailable,
                    fmt::format("rendezvous: {} answered this rank's hello with a malformed "
                                "message ({}); is rendezvous.port another service's?",
                                host_port(options.address, options.port), e.what()));
      }
      if (!reply && timed_out) {
        // Connected, and the hello went out, but no answer: rank 0 answers a hello at once,
        // so it is stopped or hung, or the port is another service's.
        throw Error(Errc::timeout,
                    fmt::format("rendezvous: {} accepted this rank's connection but did not "
                                "answer its hello within {} (timeout): is rank 0 stopped or "
                                "hung, or is rendezvous.port another service's?",
                                host_port(options.address, options.port),
                                milliseconds(options.timeout)));
      }
      if (!reply) {
        // Refused without a word, e.g. closed as the oldest of a flood of connections.
        last_error = "rank 0 closed the connection during the rendezvous";
        pause();
        continue;
      }
      switch (reply->first) {
        case Frame::welcome:
          connections.push_back(std::make_unique<Connection>(0, rehome(socket, io)));
          return;
        case Frame::reject:
          throw Error(Errc::config,
                      fmt::format("rendezvous: rank 0 at {} refused this rank: {}",
                                  host_port(options.address, options.port), reply->second));
        case Frame::abort: {
          auto [status, message] = decode_status(reply->second, "abort from rank 0");
          throw RemoteAbort(status == 0 ? Errc::unavailable : errc_for_exit_status(status),
                            message);
        }
        default:
          throw Error(Errc::unavailable, "rendezvous: rank 0 answered with an unknown message");
      }
    }
    throw Error(Errc::unavailable,
                fmt::format("rendezvous: cannot reach rank 0 at {} (from {}) within {}: {} (is "
                            "rank 0 running? check rendezvous.address and rendezvous.port)",
                            host_port(options.address, options.port), options.address_source,
                            milliseconds(options.timeout), last_error));
  }

  // ---- the reader thread -----------------------------------------------------------------

  void start_reader() {
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
  void heartbeat() {
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
  void send_heartbeat(Connection& c, const std::string& frame) noexcept {
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

  void read_next(Connection& c) {
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

  void dispatch(Connection& c, Frame type) {
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
  static std::string whole(Connection& c) {
    std::string bytes = std::move(c.parts);
    c.parts = {};
    if (bytes.empty()) return std::move(c.payload);
    bytes += c.payload;
    return bytes;
  }

  // Sends @p bytes as one frame of @p last, or, longer than one frame carries
  // (max_share_bytes), as frames of @p part of that size and a last one of @p last.
  void send_in_pieces(Connection& c, Frame part, Frame last, std::string_view bytes) {
    while (bytes.size() > detail::max_share_bytes) {
      send(c, part, bytes.substr(0, detail::max_share_bytes));
      bytes.remove_prefix(detail::max_share_bytes);
    }
    send(c, last, bytes);
  }

  // A connection ended or misbehaved: unless that was expected, the job is over.
  void lost(Connection& c, const std::string& why) {
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
  void terminate(int status, const std::string& message, int origin) {
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
  void run_ending_hook() noexcept {
    std::lock_guard running(ending_hook_mutex);  // on_ending waits for it
    std::function<void()> hook;
    {
      std::lock_guard lock(mutex);
      hook = std::exchange(ending_hook, nullptr);
    }
    if (hook) hook();
  }

  // Throws another rank's failure, once the reader has recorded one. Caller holds `mutex`.
  void throw_if_remote_failure() const {
    if (remote_failure) {
      throw RemoteAbort(errc_for_exit_status(remote_failure->first), remote_failure->second);
    }
  }

  void send_quietly(Connection& c, const std::string& frame) noexcept {
    try {
      std::lock_guard lock(c.write_mutex);
      send_all(c.socket.native_handle(), frame, Clock::now() + std::chrono::seconds(2), c.rank);
    } catch (...) {
      // A peer that cannot take the ABORT is dead or stalled; the launcher reaps it.
    }
  }

  void send(Connection& c, Frame type, std::string_view payload) {
    try {
      std::lock_guard lock(c.write_mutex);
      send_all(c.socket.native_handle(), frame_bytes(type, payload),
               Clock::now() + options.timeout, c.rank);
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

};

ControlPlane::ControlPlane(const World& world, const RendezvousOptions& options)
    : _impl(std::make_unique<Impl>(world, options)) {
  if (world.world_size <= 1) return;
  if (world.rank == 0) {
    _impl->accept_peers();
  } else {
    _impl->connect_to_root();
  }
  _impl->start_reader();
}

ControlPlane::~ControlPlane() {
  if (!_impl) return;
  _impl->io.stop();
  if (_impl->reader.joinable()) _impl->reader.join();
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
  if (impl == nullptr || !impl->reader.joinable() ||
      impl->reader.get_id() == std::this_thread::get_id()) {
    return;
  }
  impl->io.stop();  // thread-safe; run() returns once the handler in progress, if any, ends
  const auto until = Clock::now() + most;
  while (!impl->reader_done && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (impl->reader_done) impl->reader.join();
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
  for (auto& connection : impl.connections) {
    if (connection) impl.send_quietly(*connection, frame);
  }
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
    const std::string frame =
        frame_bytes(Frame::done, encode_status(verdict.status, verdict.message));
    for (auto& connection : impl.connections) {
      if (connection) impl.send_quietly(*connection, frame);
    }
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
