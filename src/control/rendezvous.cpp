// The rendezvous as coroutines on Boost.Asio: rank 0's accept loop, each connection's
// `greet` raced against its greeting timeout, and a watch over the deadline and the stop; a
// peer's connect attempts, its hello and rank 0's answer raced against their own bounds.
// Every write is a `write_frame` raced against `expire` (control_stream.hpp), as the session's.
#include "weightcast/control/detail/rendezvous.hpp"

#include "weightcast/control/detail/control_io.hpp"
#include "weightcast/control/detail/control_stream.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/log.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

namespace weightcast::detail {

namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;
using namespace asio::experimental::awaitable_operators;
using Clock = ControlClock;

// An operation's error code (and result) as values: a coroutine raced with `||` must return
// rather than throw, or the race waits for the other side.
constexpr auto as_result = asio::as_tuple(use_awaitable);

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

// A coroutine's exception leaves io_context::run() (the rendezvous's caller sees it).
void rethrow(const std::exception_ptr& e) { if (e) std::rethrow_exception(e); }

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
// yet acknowledged waits for the peer's delayed ACK (40 ms on Linux): every load on several
// ranks waited that long for the catalogue. Best effort: a socket that refuses the option
// still works, later.
void no_delay(tcp::socket& socket) {
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
}

// @return whether @p bytes went out whole on @p socket within @p most.
awaitable<bool> write_within(tcp::socket& socket, std::string_view bytes,
                             Clock::duration most) {
  std::size_t sent = 0;
  auto written = co_await (write_frame(socket, bytes, sent) || expire(most));
  co_return written.index() == 0 && !std::get<0>(written);
}

// Moves a connected socket from the rendezvous's io_context to the session's.
tcp::socket rehome(tcp::socket& socket, asio::io_context& io) {
  const auto protocol = socket.local_endpoint().protocol();
  const int fd = socket.release();
  return tcp::socket(io, protocol, fd);
}

// ---- rank 0 ----------------------------------------------------------------------------

// A connection that has not shown the job token yet. It may be a stranger, so it gets a
// deadline of its own and at most `max_hello_bytes` are read from it.
struct Greeting {
  explicit Greeting(tcp::socket s) : socket(std::move(s)) {}
  tcp::socket socket;
  std::string from;
  bool over = false;  // joined, refused, timed out or closed
};
using GreetingPtr = std::shared_ptr<Greeting>;

// What a connection's first message said: a hello, or why it is refused; neither when the
// connection closed (or was closed) first.
struct Heard {
  std::optional<Hello> hello;
  std::string refusal;
};

// Reads and decodes a connection's first message.
awaitable<Heard> greet(tcp::socket& socket) {
  Heard heard;
  std::array<char, frame_header_bytes> header{};
  auto [error, n] = co_await asio::async_read(socket, asio::buffer(header), as_result);
  if (error) co_return heard;
  FrameHeader frame{};
  try {
    // Checked before anything is allocated: a 4 GiB length is refused from 5 bytes.
    frame = decode_frame_header(header, FrameReader::greeting, "first message");
  } catch (const Error& e) {
    heard.refusal = fmt::format("not a weightcast hello ({})", e.what());
  }
  if (!heard.refusal.empty()) co_return heard;
  std::string payload(frame.payload_bytes, '\0');
  std::tie(error, n) = co_await asio::async_read(socket, asio::buffer(payload), as_result);
  if (error) co_return heard;
  try {
    heard.hello = decode_hello(payload, "hello");
  } catch (const Error& e) {
    heard.refusal = e.what();
  }
  co_return heard;
}

class Reception {
 public:
  Reception(asio::io_context& session_io, const World& world, const RendezvousOptions& options)
      : _session_io(session_io),
        _world(world),
        _options(options),
        _greeting_wait(std::min(options.timeout, greeting_timeout)) {}

  std::vector<std::optional<tcp::socket>> run() {
    const tcp::endpoint endpoint = resolve(_options);
    boost::system::error_code ec;
    _acceptor.open(endpoint.protocol(), ec);
    if (!ec) _acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) _acceptor.bind(endpoint, ec);
    if (!ec) _acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      throw Error(Errc::unavailable,
                  fmt::format("rendezvous: cannot listen on {}: {}{}",
                              host_port(_options.address, _options.port), ec.message(),
                              listen_hint(ec.category() == boost::system::system_category()
                                              ? ec.value()
                                              : 0)));
    }
    spdlog::debug("rendezvous: listening on {} (from {}) for {} peer(s)",
                  host_port(_options.address, _options.port), _options.address_source,
                  _world.world_size - 1);
    _connections.resize(_world.world_size);
    _deadline = Clock::now() + _options.timeout;  // moved on by overrun
    asio::co_spawn(_io, accept_loop(), rethrow);
    asio::co_spawn(_io, watch(), rethrow);
    _io.run();
    if (_joined != _world.world_size - 1) fail();
    std::vector<std::optional<tcp::socket>> joined(_world.world_size);
    for (int r = 1; r < _world.world_size; ++r) {
      joined[r] = rehome(*_connections[r], _session_io);
    }
    return joined;
  }

 private:
  // Keeps accepting through errors until the rendezvous closes the acceptor: a failed accept
  // (out of file descriptors, a connection reset before it was taken) must not lock the real
  // peers out.
  awaitable<void> accept_loop() {
    for (;;) {
      auto [error, socket] = co_await _acceptor.async_accept(as_result);
      if (!_acceptor.is_open() || error == asio::error::operation_aborted) co_return;
      if (!error) {
        no_delay(socket);
        receive(std::move(socket));
        continue;
      }
      const bool exhausted = error.category() == boost::system::system_category() &&
                             (error.value() == EMFILE || error.value() == ENFILE ||
                              error.value() == ENOBUFS || error.value() == ENOMEM);
      const auto pause = exhausted ? accept_backoff : std::chrono::milliseconds(10);
      if (exhausted && !std::exchange(_warned_accept, true)) {
        spdlog::warn("rendezvous: cannot accept a connection on {}: {}; retrying every {}",
                     host_port(_options.address, _options.port), error.message(),
                     milliseconds(pause));
      } else {
        spdlog::debug("rendezvous: accept failed: {}; retrying in {}", error.message(),
                      milliseconds(pause));
      }
      _accept_pause.expires_after(pause);
      if (auto [wait_error] = co_await _accept_pause.async_wait(as_result);
          wait_error || !_acceptor.is_open()) {
        co_return;
      }
    }
  }

  // Ends the rendezvous once every peer has joined, the deadline has passed or a stop was
  // requested. It looks in short steps: a rank 0 stopped meanwhile takes, once resumed, the
  // hellos waiting in its sockets rather than blaming the ranks that sent them (the deadline
  // moves on by the time it did not run), and a stop ends the wait within `stop_step`.
  awaitable<void> watch() {
    while (_joined < _world.world_size - 1 && Clock::now() < _deadline &&
           !_options.stop.stop_requested()) {
      const auto begin = Clock::now();
      const auto until = std::min<Clock::time_point>(_deadline, begin + stop_step);
      _tick.expires_at(until);
      co_await _tick.async_wait(as_result);  // cancelled when the last peer joins
      _deadline += overrun(Clock::now() - begin, until - begin);
    }
    end();
  }

  // A new connection: it waits for its hello beside at most `max_pending_greetings` others.
  void receive(tcp::socket socket) {
    auto g = std::make_shared<Greeting>(std::move(socket));
    boost::system::error_code peer_error;
    auto remote = g->socket.remote_endpoint(peer_error);
    g->from = peer_error ? std::string("?")
                         : host_port(remote.address().to_string(), remote.port());
    if (_pending.size() >= max_pending_greetings) {
      // A real peer says hello within a round trip; the oldest waiting is the likeliest
      // stranger.
      const GreetingPtr oldest = _pending.front();
      ++_dropped;
      if (!std::exchange(_warned_flood, true)) {
        spdlog::warn("rendezvous: {} connections are waiting to say hello; closing the "
                     "oldest, from {} (a flood of connections? further ones at debug level)",
                     _pending.size(), oldest->from);
      } else {
        spdlog::debug("rendezvous: closing the connection from {}: too many waiting",
                      oldest->from);
      }
      close(*oldest);
    }
    _pending.push_back(g);
    asio::co_spawn(_io, meet(g), rethrow);
  }

  // One connection's hello, within the greeting timeout.
  awaitable<void> meet(GreetingPtr g) {
    asio::steady_timer timer(_io);
    timer.expires_after(_greeting_wait);
    auto heard = co_await (greet(g->socket) || timer.async_wait(use_awaitable));
    if (g->over) co_return;
    if (heard.index() == 1) {
      ++_dropped;
      spdlog::debug("rendezvous: closing the connection from {}: no hello within {}", g->from,
                    milliseconds(_greeting_wait));
      close(*g);
      co_return;
    }
    Heard& said = std::get<0>(heard);
    if (said.hello) {
      co_await admit(*g, *said.hello);
    } else if (!said.refusal.empty()) {
      co_await refuse(*g, std::move(said.refusal));
    } else {
      close(*g);
    }
  }

  // A hello: the peer joins, or is refused.
  awaitable<void> admit(Greeting& g, const Hello& hello) {
    const std::string refusal = judge(hello);
    if (!refusal.empty()) {
      co_await refuse(g, refusal);
      co_return;
    }
    const int rank = hello.rank;
    // The rank is taken before the welcome goes out, so that a second hello for it meanwhile
    // is refused; out of `_pending`, the connection is no longer the rendezvous's to close.
    forget(g);
    _connections[rank] = std::move(g.socket);
    const auto most = std::clamp<Clock::duration>(_deadline - Clock::now(),
                                                  std::chrono::milliseconds(100),
                                                  std::chrono::seconds(1));
    if (!co_await write_within(*_connections[rank], frame_bytes(Frame::welcome, {}), most)) {
      _connections[rank].reset();
      co_return;
    }
    ++_joined;
    spdlog::debug("rendezvous: rank {} joined from {}", rank, g.from);
    if (_joined == _world.world_size - 1) end();
  }

  // @return why @p hello is refused; "" when its rank may join.
  std::string judge(const Hello& hello) const {
    // The token first: a stranger learns nothing about this job's shape.
    if (!tokens_equal(hello.token, _options.token)) {
      return "wrong job token (a rank of another job on this port, or ranks started with "
             "different rendezvous.token or WEIGHTCAST_TOKEN)";
    }
    const int rank = hello.rank;
    // Without a token two jobs on one port would take each other's ranks (plain mpirun sets
    // none); their launchers' job ids tell them apart.
    if (!hello.job_id.empty() && !_options.job_id.empty() && hello.job_id != _options.job_id) {
      return fmt::format("rank {} belongs to another job: its launcher's job id is '{}', "
                         "this job's is '{}' ({}); two jobs are using rendezvous port {}: "
                         "give each its own rendezvous.port",
                         rank, printable(hello.job_id), printable(_options.job_id),
                         _options.job_id_source, _options.port);
    }
    if (hello.world_size != _world.world_size) {
      return fmt::format("world size {}, rank 0 has {}", hello.world_size, _world.world_size);
    }
    if (rank <= 0 || rank >= _world.world_size) {
      return fmt::format("rank {} is not a peer rank of a world of {}", rank,
                         _world.world_size);
    }
    if (_connections[rank]) return fmt::format("rank {} already joined", rank);
    return {};
  }

  awaitable<void> refuse(Greeting& g, std::string reason) {
    reason.resize(std::min(reason.size(), max_status_message_bytes));
    _last_refusal = fmt::format("from {}: {}", g.from, reason);
    // A wrong-token peer is worth a warning; a stream of junk connections is not worth a
    // screenful.
    if (++_refused <= 10) {
      spdlog::warn("rendezvous: refused a connection {}{}", _last_refusal,
                   _refused == 10 ? " (further refusals are logged at debug level)" : "");
    } else {
      spdlog::debug("rendezvous: refused a connection {}", _last_refusal);
    }
    // A fresh socket's send buffer takes a refusal at once; a peer that takes nothing
    // learns by the closed connection instead.
    co_await write_within(g.socket, frame_bytes(Frame::reject, reason),
                          std::chrono::milliseconds(100));
    close(g);
  }

  // Forgets @p g (its coroutine then sees `over` and returns); the socket stays open.
  void forget(Greeting& g) {
    g.over = true;
    std::erase_if(_pending, [&](const GreetingPtr& p) { return p.get() == &g; });
  }

  // Closes @p g's connection unless its greeting is over; its reads, if any, end.
  void close(Greeting& g) {
    if (g.over) return;
    forget(g);
    boost::system::error_code ignored;
    g.socket.close(ignored);
  }

  // Stops accepting and closes every connection still waiting to say hello: the coroutines
  // return, and with them io_context::run().
  void end() {
    boost::system::error_code ignored;
    _acceptor.close(ignored);
    _accept_pause.cancel();
    _tick.cancel();
    for (const GreetingPtr& g : std::deque<GreetingPtr>(_pending)) close(*g);
  }

  // Some rank did not join: tells the ranks that did, and throws.
  [[noreturn]] void fail() {
    std::vector<int> missing;
    for (int r = 1; r < _world.world_size; ++r) {
      if (!_connections[r]) missing.push_back(r);
    }
    const bool stopped = _options.stop.stop_requested();
    const std::string at = host_port(_options.address, _options.port);
    std::string message =
        stopped ? fmt::format("rendezvous: stopped (RendezvousOptions::stop) while rank(s) {} "
                              "had not joined rank 0 at {}",
                              rank_list(missing), at)
                : fmt::format("rendezvous: rank(s) {} did not join rank 0 at {} within {}",
                              rank_list(missing), at, milliseconds(_options.timeout));
    const Errc code = stopped ? Errc::interrupted : Errc::timeout;
    if (_refused > 0) {
      message += fmt::format("; refused {} connection(s), last {}", _refused, _last_refusal);
    }
    if (_dropped > 0) {
      message += fmt::format("; closed {} connection(s) that sent no hello in time", _dropped);
    }
    const std::string abort = frame_bytes(
        Frame::abort, encode_status(exit_status(code), fmt::format("rank 0: {}", message)));
    asio::co_spawn(_io, tell_joined(abort), rethrow);
    _io.restart();
    _io.run();
    throw Error(code, message);
  }

  // Sends @p abort to every rank that joined, a second at most each.
  awaitable<void> tell_joined(const std::string& abort) {
    for (int r = 1; r < _world.world_size; ++r) {
      if (!_connections[r]) continue;
      co_await write_within(*_connections[r], abort, std::chrono::seconds(1));
    }
  }

  asio::io_context& _session_io;
  const World& _world;
  const RendezvousOptions& _options;
  const std::chrono::milliseconds _greeting_wait;
  std::vector<std::optional<tcp::socket>> _connections;  // index = rank, on _io until joined
  asio::io_context _io;  // the rendezvous's own: it ends when the rendezvous does
  tcp::acceptor _acceptor{_io};
  asio::steady_timer _accept_pause{_io};
  asio::steady_timer _tick{_io};
  Clock::time_point _deadline;
  int _joined = 0;
  int _refused = 0;
  int _dropped = 0;  // closed unheard: no hello in time, or the oldest of too many waiting
  std::string _last_refusal;
  bool _warned_flood = false;
  bool _warned_accept = false;
  std::deque<GreetingPtr> _pending;  // oldest first
};

// ---- a peer ----------------------------------------------------------------------------

class Joining {
 public:
  Joining(asio::io_context& session_io, const World& world, const RendezvousOptions& options)
      : _session_io(session_io), _world(world), _options(options) {}

  tcp::socket run() {
    _endpoint = resolve(_options);
    _deadline = Clock::now() + _options.timeout;  // moved on by overrun
    const std::string hello_payload =
        encode_hello({_world.rank, _world.world_size, _options.token, _options.job_id});
    if (_options.token.size() > max_token_bytes) {
      // Rank 0 would refuse the hello unread; say why here.
      throw Error(Errc::config, fmt::format("rendezvous.token is {} bytes; rank 0 takes at most {}",
                                            _options.token.size(), max_token_bytes));
    }
    _hello = frame_bytes(Frame::hello, hello_payload);
    asio::co_spawn(_io, join(), rethrow);
    _io.run();
    return std::move(*_root);
  }

 private:
  // Connects and says hello until rank 0 answers, the deadline passes or a stop is requested.
  awaitable<void> join() {
    while (Clock::now() < _deadline) {
      check_stop();
      tcp::socket socket(_io);
      // Up to 5 s for the connect.
      const auto connect_until = std::min(_deadline, Clock::now() + std::chrono::seconds(5));
      auto connected =
          co_await (socket.async_connect(_endpoint, as_result) || lapse(connect_until));
      check_stop();
      if (connected.index() == 1) {
        _last_error = "connect timed out";
        continue;
      }
      if (auto [error] = std::get<0>(connected); error) {
        _last_error = error.message();
        co_await pause();
        continue;
      }
      no_delay(socket);
      std::size_t sent = 0;
      auto hello = co_await (write_frame(socket, _hello, sent) || lapse(_deadline));
      check_stop();
      if (hello.index() == 1) {
        _last_error = "control plane: rank 0 did not take a message within the timeout "
                      "(stalled?)";
        break;
      }
      if (const auto error = std::get<0>(hello)) {
        // Closed before the hello went out (e.g. as the oldest of a flood): try again.
        _last_error = fmt::format("control plane: sending to rank 0: {}", error.message());
      } else if (co_await answered(socket)) {
        co_return;
      }
      co_await pause();
    }
    throw Error(Errc::unavailable,
                fmt::format("rendezvous: cannot reach rank 0 at {} (from {}) within {}: {} (is "
                            "rank 0 running? check rendezvous.address and rendezvous.port)",
                            host_port(_options.address, _options.port), _options.address_source,
                            milliseconds(_options.timeout), _last_error));
  }

  // Waits until @p until or a stop, in steps of at most `stop_step`; the time this process
  // did not run moves @p until and the deadline on.
  awaitable<void> lapse(Clock::time_point until) {
    asio::steady_timer timer(_io);
    while (Clock::now() < until && !_options.stop.stop_requested()) {
      const auto begin = Clock::now();
      const auto step_until = std::min<Clock::time_point>(until, begin + stop_step);
      timer.expires_at(step_until);
      co_await timer.async_wait(use_awaitable);  // throws when the race is lost
      const auto late = overrun(Clock::now() - begin, step_until - begin);
      _deadline += late;
      until += late;
    }
  }

  // Before the next attempt. Ranks usually start together and try before rank 0 listens: the
  // first retries come soon (a refused connect costs microseconds), or every load waits out
  // the first pause.
  awaitable<void> pause() {
    const auto step = std::min<Clock::duration>(std::min<Clock::duration>(_backoff, stop_step),
                                                _deadline - Clock::now());
    const auto begin = Clock::now();
    asio::steady_timer timer(_io);
    timer.expires_after(step);
    co_await timer.async_wait(as_result);
    _deadline += overrun(Clock::now() - begin, step);
    _backoff = std::min(_backoff * 2, std::chrono::milliseconds(1000));
  }

  void check_stop() const {
    if (!_options.stop.stop_requested()) return;
    throw Error(Errc::interrupted,
                fmt::format("rendezvous: stopped (RendezvousOptions::stop) before rank 0 at {} "
                            "accepted this rank",
                            host_port(_options.address, _options.port)));
  }

  // Reads rank 0's answer to a hello, within the deadline.
  // @return nothing when the connection closed (@p timed_out false) or the deadline passed
  //         (@p timed_out true).
  awaitable<std::optional<std::pair<Frame, std::string>>> read_reply(tcp::socket& socket,
                                                                     bool& timed_out) {
    std::array<char, frame_header_bytes> header{};
    auto got = co_await (asio::async_read(socket, asio::buffer(header), as_result) ||
                         lapse(_deadline));
    check_stop();
    timed_out = got.index() == 1;
    if (timed_out || std::get<0>(std::get<0>(got))) co_return std::nullopt;
    FrameHeader frame{};
    try {
      // Checked before the payload is read or allocated.
      frame = decode_frame_header(header, FrameReader::joining, "reply");
    } catch (const Error& e) {
      throw Error(Errc::unavailable,
                  fmt::format("rendezvous: {} answered this rank's hello with a malformed "
                              "message ({}); is rendezvous.port another service's?",
                              host_port(_options.address, _options.port), e.what()));
    }
    std::string payload(frame.payload_bytes, '\0');
    got = co_await (asio::async_read(socket, asio::buffer(payload), as_result) ||
                    lapse(_deadline));
    check_stop();
    timed_out = got.index() == 1;
    if (timed_out || std::get<0>(std::get<0>(got))) co_return std::nullopt;
    co_return std::make_pair(frame.type, std::move(payload));
  }

  // Reads rank 0's answer to the hello just sent on @p socket.
  // @return true once rank 0 welcomed this rank (`_root` holds the connection); false when rank
  //         0 closed the connection without a word (`_last_error` says so).
  awaitable<bool> answered(tcp::socket& socket) {
    bool timed_out = false;
    auto reply = co_await read_reply(socket, timed_out);
    if (!reply && timed_out) {
      // Connected, and the hello went out, but no answer: rank 0 answers a hello at once, so
      // it is stopped or hung, or the port is another service's.
      throw Error(Errc::timeout,
                  fmt::format("rendezvous: {} accepted this rank's connection but did not "
                              "answer its hello within {} (timeout): is rank 0 stopped or "
                              "hung, or is rendezvous.port another service's?",
                              host_port(_options.address, _options.port),
                              milliseconds(_options.timeout)));
    }
    if (!reply) {
      // Refused without a word, e.g. closed as the oldest of a flood of connections.
      _last_error = "rank 0 closed the connection during the rendezvous";
      co_return false;
    }
    switch (reply->first) {
      case Frame::welcome:
        _root = rehome(socket, _session_io);
        co_return true;
      case Frame::reject:
        throw Error(Errc::config,
                    fmt::format("rendezvous: rank 0 at {} refused this rank: {}",
                                host_port(_options.address, _options.port), reply->second));
      case Frame::abort: {
        auto [status, message] = decode_status(reply->second, "abort from rank 0");
        throw RemoteAbort(status == 0 ? Errc::unavailable : errc_for_exit_status(status),
                          message);
      }
      default:
        throw Error(Errc::unavailable, "rendezvous: rank 0 answered with an unknown message");
    }
  }

  asio::io_context& _session_io;
  const World& _world;
  const RendezvousOptions& _options;
  tcp::endpoint _endpoint;
  Clock::time_point _deadline;
  std::chrono::milliseconds _backoff{2};
  std::string _hello;
  std::string _last_error = "no attempt";
  std::optional<tcp::socket> _root;  // on _session_io
  asio::io_context _io;  // the rendezvous's own: it ends when the rendezvous does
};

}  // namespace

std::vector<std::optional<tcp::socket>> accept_peers(asio::io_context& io, const World& world,
                                                     const RendezvousOptions& options) {
  return Reception(io, world, options).run();
}

tcp::socket connect_to_root(asio::io_context& io, const World& world,
                            const RendezvousOptions& options) {
  return Joining(io, world, options).run();
}

}  // namespace weightcast::detail
