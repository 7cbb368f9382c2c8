// The tcp transport (weightcast/transport/detail/transport_tcp.hpp): a star of non-blocking sockets
// from rank 0, with a relay from each other node's leader to its node's ranks for broadcasts,
// advanced inside Pending::test().
#include "weightcast/transport/detail/transport_tcp.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/transport/detail/node_ring.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstring>
#include <deque>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

namespace weightcast {
namespace {

using Clock = std::chrono::steady_clock;
using detail::UniqueFd;

constexpr std::array<char, 8> hello_magic{'w', 'c', 't', 'c', 'p', 'h', 'i', '1'};
constexpr std::array<char, 8> accept_magic{'w', 'c', 't', 'c', 'p', 'o', 'k', '1'};
constexpr std::size_t hello_bytes = 8 + 4 + 4 + tcp_nonce_bytes;
// Large buffers let a rank that polls every millisecond keep the link busy in between.
constexpr int socket_buffer_bytes = 16 << 20;
// Strangers that hold a connection open without a hello: at most this many wait at once.
constexpr std::size_t max_unidentified = 64;
constexpr int max_stranger_logs = 4;

std::string errno_text(int error) { return std::system_category().message(error); }

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    throw Error(Errc::unavailable,
                fmt::format("transport tcp: fcntl(O_NONBLOCK): {}", errno_text(errno)));
  }
}

void tune(int fd) {
  const int one = 1;
  // Best effort: the kernel caps the buffers at its maximum, and a smaller one only costs
  // throughput.
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &socket_buffer_bytes, sizeof socket_buffer_bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &socket_buffer_bytes, sizeof socket_buffer_bytes);
}

void put_u32(std::byte* to, std::uint32_t v) { std::memcpy(to, &v, sizeof v); }
std::uint32_t get_u32(const std::byte* from) {
  std::uint32_t v;
  std::memcpy(&v, from, sizeof v);
  return v;
}

std::chrono::milliseconds left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

// Waits for @p events on @p fd, in slices so that @p stop is seen. @return false at the
// deadline.
bool wait_for(int fd, short events, Clock::time_point deadline, const std::stop_token& stop,
              std::string_view what) {
  while (true) {
    if (stop.stop_requested()) {
      throw Error(Errc::interrupted, fmt::format("transport tcp: stopped while {}", what));
    }
    const auto wait = std::min(left(deadline), std::chrono::milliseconds(50));
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(wait.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) {
      throw Error(Errc::unavailable,
                  fmt::format("transport tcp: poll while {}: {}", what, errno_text(errno)));
    }
    if (n == 0 && Clock::now() >= deadline) return false;
  }
}

// ---- the connections and their queues -------------------------------------------------------

// What goes before each operation's bytes on a connection.
struct Header {
  std::uint64_t bytes = 0;
  std::uint32_t kind = 0;  // 1 broadcast, 2 exchange
  std::uint32_t tag = 0;
};
static_assert(sizeof(Header) == 16);
constexpr std::uint32_t kind_broadcast = 1;
constexpr std::uint32_t kind_exchange = 2;

std::string_view kind_name(std::uint32_t kind) {
  return kind == kind_broadcast ? "a broadcast" : kind == kind_exchange ? "an exchange" : "junk";
}

// One operation's bytes on one connection, in one direction: the header first, then the
// caller's buffers.
struct Transfer {
  Header header;    // sent, or what this rank expects
  Header received;  // a receive's header as it arrives
  std::vector<iovec> iov;
  std::size_t index = 0;  // the iovec in progress
  std::uint64_t moved = 0;  // bytes sent or received so far, the header's included
  // A relay's send: the receive whose bytes it forwards; it sends no byte of the payload
  // before that byte has landed (its header was checked first).
  std::shared_ptr<const Transfer> source;
  bool done = false;
};

// How many bytes of @p t may go now: all of them, or, for a relay's send, its header and the
// payload bytes its source has received so far.
std::uint64_t sendable(const Transfer& t) {
  if (!t.source) return UINT64_MAX;
  const std::uint64_t landed =
      t.source->moved > sizeof(Header) ? t.source->moved - sizeof(Header) : 0;
  return sizeof(Header) + landed - t.moved;
}

struct Link {
  int peer = -1;
  UniqueFd fd;
  std::deque<std::shared_ptr<Transfer>> sends;
  std::deque<std::shared_ptr<Transfer>> receives;
  std::optional<Error> broken;  // once set, every operation on the link fails with it
  bool lost = false;            // broken because the peer went (TcpConnectionLost)

  [[noreturn]] void rethrow() const {
    if (lost) throw TcpConnectionLost(peer, broken->what());
    throw Error(broken->code(), broken->what());
  }

  void fail(Error error, bool peer_lost = false) {
    if (broken) return;
    broken = std::move(error);
    lost = peer_lost;
    // Closed at once: nothing reads or writes memory through this link any more.
    fd.reset();
    sends.clear();
    receives.clear();
  }
};

// Marks @p n bytes of @p t's iovecs done. @return true when all are.
bool consume(Transfer& t, std::size_t n) {
  t.moved += n;
  while (n > 0 && t.index < t.iov.size()) {
    iovec& v = t.iov[t.index];
    const std::size_t step = std::min(n, v.iov_len);
    v.iov_base = static_cast<char*>(v.iov_base) + step;
    v.iov_len -= step;
    n -= step;
    if (v.iov_len == 0) ++t.index;
  }
  while (t.index < t.iov.size() && t.iov[t.index].iov_len == 0) ++t.index;
  return t.index == t.iov.size();
}

class Connections {
 public:
  explicit Connections(int rank, int world_size) : _rank(rank), _links(world_size) {
    for (int r = 0; r < world_size; ++r) _links[r].peer = r;
  }
  [[nodiscard]] int rank() const noexcept { return _rank; }
  [[nodiscard]] int world_size() const noexcept { return static_cast<int>(_links.size()); }
  Link& link(int peer) { return _links[static_cast<std::size_t>(peer)]; }

  // Moves every connection's queues as far as the sockets take without blocking.
  void progress() {
    for (Link& l : _links) {
      if (!l.fd || l.broken) continue;
      advance_sends(l);
      if (!l.broken) advance_receives(l);
    }
  }

 private:
  void advance_sends(Link& l) {
    while (!l.sends.empty()) {
      Transfer& t = *l.sends.front();
      while (t.index < t.iov.size()) {
        msghdr message{};
        message.msg_iov = t.iov.data() + t.index;
        message.msg_iovlen = std::min<std::size_t>(t.iov.size() - t.index, IOV_MAX);
        if (t.source) {
          // A relay forwards only what has landed: the iovecs cut at that many bytes.
          std::uint64_t budget = sendable(t);
          if (budget == 0) return;
          _cut.clear();
          for (std::size_t i = t.index; i < t.iov.size() && _cut.size() < IOV_MAX && budget > 0;
               ++i) {
            iovec v = t.iov[i];
            v.iov_len = static_cast<std::size_t>(std::min<std::uint64_t>(v.iov_len, budget));
            budget -= v.iov_len;
            if (v.iov_len > 0) _cut.push_back(v);
          }
          message.msg_iov = _cut.data();
          message.msg_iovlen = _cut.size();
        }
        // MSG_NOSIGNAL: a peer that is gone is an error here, not SIGPIPE.
        const ssize_t n = ::sendmsg(l.fd.get(), &message, MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return;
          return lost(l, errno);
        }
        consume(t, static_cast<std::size_t>(n));
      }
      t.done = true;
      l.sends.pop_front();
    }
  }

  void advance_receives(Link& l) {
    while (!l.receives.empty()) {
      Transfer& t = *l.receives.front();
      while (t.index < t.iov.size()) {
        // The header alone first: it is checked before any byte lands in the destination.
        const bool header = t.index == 0;
        const int count = header ? 1 : static_cast<int>(std::min<std::size_t>(
                                            t.iov.size() - t.index, IOV_MAX));
        const ssize_t n = ::readv(l.fd.get(), t.iov.data() + t.index, count);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return;
          return lost(l, errno);
        }
        if (n == 0) return lost(l, 0);
        consume(t, static_cast<std::size_t>(n));
        if (header && t.index > 0 && !check_header(l, t)) return;
      }
      t.done = true;
      l.receives.pop_front();
    }
  }

  bool check_header(Link& l, const Transfer& t) {
    const Header& got = t.received;
    const Header& want = t.header;
    if (got.bytes == want.bytes && got.kind == want.kind && got.tag == want.tag) return true;
    l.fail(Error(Errc::internal,
                 fmt::format("transport tcp: rank {} sent {} of {} bytes (tag {}), but this rank "
                             "posted {} of {} bytes (tag {}) from it: the ranks' plans differ "
                             "(every rank must load with the same settings)",
                             l.peer, kind_name(got.kind), got.bytes, got.tag,
                             kind_name(want.kind), want.bytes, want.tag)));
    return false;
  }

  void lost(Link& l, int error) {
    const std::string why =
        error == 0 ? "it closed the connection" : fmt::format("{}", errno_text(error));
    l.fail(Error(Errc::unavailable,
                 fmt::format("transport tcp: connection to rank {} lost ({}); that rank has "
                             "probably failed or been killed",
                             l.peer, why)),
           true);
  }

  int _rank;
  std::vector<Link> _links;
  std::vector<iovec> _cut;  // a relay's iovecs cut at what has landed
};

// Who sends a rank its broadcasts, and to whom it sends them: the relay of `TcpNodes`.
struct Relay {
  int upstream = 0;             // the rank this rank receives broadcasts from (not rank 0's)
  std::vector<int> downstream;  // the ranks it sends them to
};

// A node's leader: its lowest rank.
int leader_of(const std::vector<int>& node, int rank) {
  for (int r = 0; r < rank; ++r) {
    if (node[static_cast<std::size_t>(r)] == node[static_cast<std::size_t>(rank)]) return r;
  }
  return rank;
}

Relay relay_for(int rank, int world_size, const TcpNodes& nodes) {
  WEIGHTCAST_EXPECT(nodes.node.empty() || nodes.node.size() == static_cast<std::size_t>(world_size),
                    Errc::internal,
                    fmt::format("transport tcp: {} node(s) given for a world of {} ranks",
                                nodes.node.size(), world_size));
  Relay relay;
  const auto& node = nodes.node;
  // Whether rank r gets its broadcasts from rank 0 itself.
  auto from_root = [&](int r) {
    return node.empty() || node[static_cast<std::size_t>(r)] == node[0] || leader_of(node, r) == r;
  };
  if (rank == 0) {
    for (int r = 1; r < world_size; ++r) {
      if (from_root(r)) relay.downstream.push_back(r);
    }
    return relay;
  }
  relay.upstream = from_root(rank) ? 0 : leader_of(node, rank);
  if (!node.empty() && node[static_cast<std::size_t>(rank)] != node[0] &&
      leader_of(node, rank) == rank) {
    for (int r = rank + 1; r < world_size; ++r) {
      if (node[static_cast<std::size_t>(r)] == node[static_cast<std::size_t>(rank)]) {
        relay.downstream.push_back(r);
      }
    }
  }
  return relay;
}

std::string relay_socket_name(std::uint64_t relay_id, int leader) {
  return fmt::format("weightcast-relay-{:016x}-{}", relay_id, leader);
}

// One operation: its transfers on each connection, and the memcpys already done.
class TcpPending final : public Pending {
 public:
  TcpPending(std::shared_ptr<Connections> connections,
             std::vector<std::pair<int, std::shared_ptr<Transfer>>> transfers)
      : _connections(std::move(connections)), _transfers(std::move(transfers)) {}

  ~TcpPending() override {
    for (auto& [peer, transfer] : _transfers) {
      if (transfer->done) continue;
      Link& l = _connections->link(peer);
      // Its buffers may be freed now: the link must never touch them, and the byte stream
      // cannot resume mid-operation.
      l.fail(Error(Errc::unavailable,
                   fmt::format("transport tcp: connection to rank {} closed: an operation on it "
                               "was abandoned (the load failed or was stopped)",
                               peer)));
    }
  }

  bool test() override {
    _connections->progress();
    bool all = true;
    for (auto& [peer, transfer] : _transfers) {
      if (transfer->done) continue;
      const Link& l = _connections->link(peer);
      if (l.broken) l.rethrow();
      all = false;
    }
    return all;
  }

 private:
  std::shared_ptr<Connections> _connections;
  std::vector<std::pair<int, std::shared_ptr<Transfer>>> _transfers;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::shared_ptr<Connections> connections, Relay relay)
      : _connections(std::move(connections)), _relay(std::move(relay)) {}

  [[nodiscard]] std::string_view name() const noexcept override { return "tcp"; }
  [[nodiscard]] int rank() const noexcept override { return _connections->rank(); }
  [[nodiscard]] int world_size() const noexcept override { return _connections->world_size(); }

  std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes, int root) override {
    const Range range{data, bytes};
    return broadcast_group(std::span<const Range>(&range, 1), root, nullptr);
  }

  std::unique_ptr<Pending> broadcast_group(std::span<const Range> ranges, int root,
                                           void* /*ready_event*/) override {
    WEIGHTCAST_EXPECT(root == 0, Errc::config,
                      fmt::format("transport tcp: a broadcast from rank {}: tcp connects rank 0 "
                                  "to each rank, so only rank 0 broadcasts",
                                  root));
    std::uint64_t total = 0;
    for (const Range& r : ranges) total += r.bytes;
    if (total == 0 || world_size() == 1) return nullptr;
    std::vector<Planned> transfers;
    auto make = [&](bool send) {
      auto t = std::make_shared<Transfer>();
      t->header = Header{total, kind_broadcast, 0};
      t->iov.reserve(ranges.size() + 1);
      t->iov.push_back({send ? &t->header : &t->received, sizeof(Header)});
      for (const Range& r : ranges) {
        if (r.bytes > 0) t->iov.push_back({r.data, static_cast<std::size_t>(r.bytes)});
      }
      return t;
    };
    std::shared_ptr<const Transfer> received;
    if (rank() != 0) {
      auto t = make(false);
      received = t;
      enqueue(_relay.upstream, false, std::move(t), transfers);
    }
    // A leader forwards what it receives, byte by byte as it lands (its upstream is listed
    // first, so each poll receives before it forwards).
    for (const int peer : _relay.downstream) {
      auto t = make(true);
      t->source = received;
      enqueue(peer, true, std::move(t), transfers);
    }
    return start(std::move(transfers));
  }

  std::unique_ptr<Pending> exchange(std::span<const Message> sends,
                                    std::span<const Message> receives, int tag) override {
    // Messages to and from this rank itself: paired in posting order, copied now.
    std::vector<const Message*> self_sends;
    std::vector<const Message*> self_receives;
    for (const Message& m : sends) {
      if (m.peer == rank()) self_sends.push_back(&m);
    }
    for (const Message& m : receives) {
      if (m.peer == rank()) self_receives.push_back(&m);
    }
    WEIGHTCAST_EXPECT(self_sends.size() == self_receives.size(), Errc::internal,
                      fmt::format("transport tcp: rank {} posts {} message(s) to itself but {} "
                                  "from itself",
                                  rank(), self_sends.size(), self_receives.size()));
    for (std::size_t i = 0; i < self_sends.size(); ++i) {
      WEIGHTCAST_EXPECT(self_sends[i]->bytes == self_receives[i]->bytes, Errc::internal,
                        fmt::format("transport tcp: rank {}'s message {} to itself has {} bytes, "
                                    "its receive {}",
                                    rank(), i, self_sends[i]->bytes, self_receives[i]->bytes));
    }
    // One transfer per peer and direction, the peer's messages in posting order.
    std::vector<Planned> transfers;
    auto gather = [&](std::span<const Message> messages, bool send) {
      std::vector<std::shared_ptr<Transfer>> by_peer(static_cast<std::size_t>(world_size()));
      for (const Message& m : messages) {
        if (m.peer == rank() || m.bytes == 0) continue;
        WEIGHTCAST_EXPECT(m.peer >= 0 && m.peer < world_size(), Errc::internal,
                          fmt::format("transport tcp: a message {} rank {} of a world of {}",
                                      send ? "to" : "from", m.peer, world_size()));
        WEIGHTCAST_EXPECT(
            rank() == 0 || m.peer == 0, Errc::config,
            fmt::format("transport tcp: rank {} cannot {} rank {} directly: tcp connects "
                        "rank 0 to each rank (a star), so messages go between rank 0 and "
                        "another rank only (use transport: mpi or nccl for such a placement)",
                        rank(), send ? "send to" : "receive from", m.peer));
        auto& t = by_peer[static_cast<std::size_t>(m.peer)];
        if (!t) {
          t = std::make_shared<Transfer>();
          t->header = Header{0, kind_exchange, static_cast<std::uint32_t>(tag)};
          t->iov.push_back({send ? &t->header : &t->received, sizeof(Header)});
        }
        t->header.bytes += m.bytes;
        t->iov.push_back({m.data, static_cast<std::size_t>(m.bytes)});
      }
      for (auto& t : by_peer) {
        if (t) enqueue(static_cast<int>(&t - by_peer.data()), send, std::move(t), transfers);
      }
    };
    gather(sends, true);
    gather(receives, false);
    // Once nothing can refuse the operation any more.
    for (std::size_t i = 0; i < self_sends.size(); ++i) {
      std::memmove(self_receives[i]->data, self_sends[i]->data, self_sends[i]->bytes);
    }
    return start(std::move(transfers));
  }

 private:
  // Collected first, queued only once every transfer of the operation is known to be
  // accepted: a refusal (a broken link, a message the star cannot carry) must not leave a
  // transfer queued on another link, whose buffers the caller frees after the throw.
  struct Planned {
    int peer;
    bool send;
    std::shared_ptr<Transfer> transfer;
  };

  static void enqueue(int peer, bool send, std::shared_ptr<Transfer> t,
                      std::vector<Planned>& planned) {
    planned.push_back({peer, send, std::move(t)});
  }

  std::unique_ptr<Pending> start(std::vector<Planned> planned) {
    if (planned.empty()) return nullptr;
    for (const Planned& p : planned) {
      if (const Link& l = _connections->link(p.peer); l.broken) l.rethrow();
    }
    std::vector<std::pair<int, std::shared_ptr<Transfer>>> transfers;
    for (Planned& p : planned) {
      Link& l = _connections->link(p.peer);
      (p.send ? l.sends : l.receives).push_back(p.transfer);
      transfers.emplace_back(p.peer, std::move(p.transfer));
    }
    auto pending = std::make_unique<TcpPending>(_connections, std::move(transfers));
    // A first push now: the bytes start moving before the loader's first poll.
    pending->test();
    return pending;
  }

  std::shared_ptr<Connections> _connections;
  Relay _relay;
};

// ---- the handshake ----------------------------------------------------------------------------

// A connection to rank 0 that has not shown its hello yet.
struct Unidentified {
  UniqueFd fd;
  std::array<std::byte, hello_bytes> hello{};
  std::size_t got = 0;
};

// Reads what is there of @p u's hello. @return the rank it names once whole and right, -1
// while incomplete; throws nothing: a wrong hello is reported through @p refusal.
int read_hello(Unidentified& u, int world_size, const TcpNonce& nonce, std::string& refusal) {
  const ssize_t n = ::recv(u.fd.get(), u.hello.data() + u.got, u.hello.size() - u.got, 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return -1;
  if (n <= 0) {
    refusal = "closed before its hello";
    return -2;
  }
  u.got += static_cast<std::size_t>(n);
  if (u.got < u.hello.size()) return -1;
  const std::byte* p = u.hello.data();
  if (std::memcmp(p, hello_magic.data(), hello_magic.size()) != 0) {
    refusal = "not a weightcast rank's hello";
    return -2;
  }
  if (std::memcmp(p + 16, nonce.data(), nonce.size()) != 0) {
    refusal = "a wrong secret (not a rank of this job)";
    return -2;
  }
  const auto rank = static_cast<int>(get_u32(p + 8));
  const auto size = static_cast<int>(get_u32(p + 12));
  if (size != world_size || rank < 1 || rank >= world_size) {
    refusal = fmt::format("it says rank {} of {}, but this job has ranks 1..{}", rank, size,
                          world_size - 1);
    return -2;
  }
  return rank;
}

// Blocking send of a few handshake bytes, bounded.
void send_all(int fd, const void* data, std::size_t bytes, Clock::time_point deadline,
              const std::stop_token& stop, std::string_view what) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLOUT, deadline, stop, what)) {
        throw Error(Errc::timeout, fmt::format("transport tcp: timed out {}", what));
      }
      continue;
    }
    throw Error(Errc::unavailable, fmt::format("transport tcp: {}: {}", what, errno_text(errno)));
  }
}

}  // namespace

TcpNonce tcp_nonce() {
  TcpNonce nonce{};
  std::size_t got = 0;
  while (got < nonce.size()) {
    const ssize_t n = ::getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error(Errc::unavailable,
                  fmt::format("transport tcp: getrandom: {}", errno_text(errno)));
    }
    got += static_cast<std::size_t>(n);
  }
  return nonce;
}

TcpListener::TcpListener(std::string_view address) : _address(address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(_address.c_str(), "0", &hints, &found); rc != 0) {
    throw Error(Errc::unavailable,
                fmt::format("transport tcp: rank 0's address {} does not resolve: {}", _address,
                            ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  int error = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      error = errno;
      continue;
    }
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 ||
        ::listen(fd.get(), SOMAXCONN) != 0) {
      error = errno;
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      error = errno;
      continue;
    }
    _port = ntohs(bound.ss_family == AF_INET6
                      ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                      : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    set_nonblocking(fd.get());
    tune(fd.get());  // accepted sockets inherit the buffers; the window scale is set at SYN
    _fd = std::move(fd);
    return;
  }
  throw Error(Errc::unavailable,
              fmt::format("transport tcp: cannot listen on {} (rank 0's rendezvous address): {}",
                          _address, errno_text(error)));
}

namespace {

// Accepts a connection from each rank of @p expected on @p listen_fd (rank 0's data port, or
// a leader's relay socket): each must show its hello within the wait; strangers are closed
// and logged, and once every expected rank is in, each hears that it was accepted.
// @p who ("rank 0") and @p what ("data port") name the listener in messages.
void accept_ranks(int listen_fd, Connections& connections, const std::vector<int>& expected,
                  const TcpNonce& nonce, Clock::time_point deadline,
                  std::chrono::milliseconds timeout, const std::stop_token& stop,
                  std::string_view who, std::string_view what, std::string_view at) {
  const int world_size = connections.world_size();
  std::vector<Unidentified> waiting;
  std::size_t joined = 0;
  int strangers = 0;
  auto refuse = [&](std::string_view why) {
    if (++strangers <= max_stranger_logs) {
      spdlog::warn("transport tcp: {} refused a connection to its {} {}: {}", who, what, at, why);
    }
  };
  while (joined < expected.size()) {
    if (stop.stop_requested()) {
      throw Error(Errc::interrupted,
                  fmt::format("transport tcp: stopped while {} waited for the ranks", who));
    }
    if (Clock::now() >= deadline) {
      std::string missing;
      for (const int r : expected) {
        if (!connections.link(r).fd) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      throw Error(Errc::timeout,
                  fmt::format("transport tcp: rank(s) {} did not connect to {}'s {} {} within "
                              "{} ms",
                              missing, who, what, at, timeout.count()));
    }
    std::vector<pollfd> polled{{listen_fd, POLLIN, 0}};
    for (const Unidentified& u : waiting) polled.push_back({u.fd.get(), POLLIN, 0});
    const auto wait = std::min(left(deadline), std::chrono::milliseconds(50));
    const int n = ::poll(polled.data(), polled.size(), static_cast<int>(wait.count()));
    if (n < 0 && errno != EINTR) {
      throw Error(Errc::unavailable,
                  fmt::format("transport tcp: poll on {}: {}", at, errno_text(errno)));
    }
    if (n <= 0) continue;
    // Hellos first (indices shift as refused ones go).
    for (std::size_t i = polled.size(); i-- > 1;) {
      if (polled[i].revents == 0) continue;
      Unidentified& u = waiting[i - 1];
      std::string refusal;
      const int rank = read_hello(u, world_size, nonce, refusal);
      if (rank == -1) continue;
      if (rank >= 1 && std::find(expected.begin(), expected.end(), rank) == expected.end()) {
        refusal = fmt::format("it says rank {}, which does not connect here", rank);
      } else if (rank >= 1 && connections.link(rank).fd) {
        refusal = fmt::format("rank {} has connected already", rank);
      }
      if (!refusal.empty()) {
        refuse(refusal);
      } else {
        connections.link(rank).fd = std::move(u.fd);
        ++joined;
      }
      waiting.erase(waiting.begin() + static_cast<std::ptrdiff_t>(i - 1));
    }
    if (polled[0].revents != 0) {
      UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
          throw Error(Errc::unavailable,
                      fmt::format("transport tcp: accept on {}: {}", at, errno_text(errno)));
        }
        continue;
      }
      if (waiting.size() >= max_unidentified) {
        refuse("too many connections without a hello");
        waiting.erase(waiting.begin());
      }
      waiting.push_back(Unidentified{std::move(fd)});
    }
  }
  // Every rank is in: each hears that it was accepted, and the strangers are dropped.
  waiting.clear();
  for (const int r : expected) {
    Link& l = connections.link(r);
    tune(l.fd.get());
    send_all(l.fd.get(), accept_magic.data(), accept_magic.size(), deadline, stop,
             fmt::format("accepting rank {} on {}", r, at));
  }
}

// A rank's side of the handshake on a connected @p fd: its hello, then the listener's
// acceptance. @p whose names the listener ("rank 0's data port 10.0.0.1:5000").
void show_hello(int fd, int rank, int world_size, const TcpNonce& nonce,
                Clock::time_point deadline, std::chrono::milliseconds timeout,
                const std::stop_token& stop, std::string_view whose, std::string_view owner) {
  std::array<std::byte, hello_bytes> hello{};
  std::memcpy(hello.data(), hello_magic.data(), hello_magic.size());
  put_u32(hello.data() + 8, static_cast<std::uint32_t>(rank));
  put_u32(hello.data() + 12, static_cast<std::uint32_t>(world_size));
  std::memcpy(hello.data() + 16, nonce.data(), nonce.size());
  send_all(fd, hello.data(), hello.size(), deadline, stop,
           fmt::format("sending rank {}'s hello to {}", rank, whose));
  std::array<char, accept_magic.size()> answer{};
  std::size_t got = 0;
  while (got < answer.size()) {
    const ssize_t n = ::recv(fd, answer.data() + got, answer.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(fd, POLLIN, deadline, stop,
                    fmt::format("waiting for {}'s acceptance", owner))) {
        throw Error(Errc::timeout,
                    fmt::format("transport tcp: rank {} connected to {}, but {} did not accept "
                                "it within {} ms (another rank may be missing)",
                                rank, whose, owner, timeout.count()));
      }
      continue;
    }
    throw Error(Errc::unavailable,
                fmt::format("transport tcp: {} closed rank {}'s connection without accepting "
                            "it ({}): {} refused it (not this job's {}, or this rank's place is "
                            "taken) or failed",
                            whose, rank, n == 0 ? "end of stream" : errno_text(errno), owner,
                            owner));
  }
  if (std::memcmp(answer.data(), accept_magic.data(), answer.size()) != 0) {
    throw Error(Errc::unavailable,
                fmt::format("transport tcp: {} answered rank {} with something other than a "
                            "weightcast {}'s acceptance",
                            whose, rank, owner));
  }
}

// A leader's relay socket, listening before the leader dials rank 0: its node's ranks dial
// it once rank 0 has accepted them, which is after the leader has dialled rank 0.
UniqueFd relay_listen(const std::string& name) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un address;
  socklen_t length = 0;
  detail::abstract_address(name, address, length);
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0) {
    throw Error(Errc::unavailable, fmt::format("transport tcp: cannot listen on the relay "
                                               "socket @{}: {}",
                                               name, errno_text(errno)));
  }
  return fd;
}

UniqueFd relay_dial(const std::string& name, int leader, Clock::time_point deadline,
                    std::chrono::milliseconds timeout, const std::stop_token& stop) {
  sockaddr_un address;
  socklen_t length = 0;
  detail::abstract_address(name, address, length);
  while (true) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      throw Error(Errc::unavailable,
                  fmt::format("transport tcp: socket(AF_UNIX): {}", errno_text(errno)));
    }
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), length) == 0) return fd;
    // A full backlog: the leader is accepting, try again.
    if (errno != EAGAIN && errno != EINTR) {
      throw Error(Errc::unavailable,
                  fmt::format("transport tcp: cannot connect to rank {}'s relay socket @{} (this "
                              "node's leader): {}; that rank has probably failed",
                              leader, name, errno_text(errno)));
    }
    if (stop.stop_requested()) {
      throw Error(Errc::interrupted, "transport tcp: stopped while dialling this node's leader");
    }
    if (Clock::now() >= deadline) {
      throw Error(Errc::timeout, fmt::format("transport tcp: could not connect to rank {}'s "
                                             "relay socket @{} within {} ms",
                                             leader, name, timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string list_ranks(const std::vector<int>& ranks) {
  std::string out;
  for (const int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(TcpListener listener, int world_size,
                                              const TcpNonce& nonce,
                                              std::chrono::milliseconds timeout,
                                              std::stop_token stop, const TcpNodes& nodes) {
  WEIGHTCAST_EXPECT(world_size >= 2, Errc::internal,
                    fmt::format("transport tcp: a world of {} rank(s)", world_size));
  Relay relay = relay_for(0, world_size, nodes);
  auto connections = std::make_shared<Connections>(0, world_size);
  const auto deadline = Clock::now() + timeout;
  const std::string at = fmt::format("{}:{}", listener.address(), listener.port());
  std::vector<int> everyone;
  for (int r = 1; r < world_size; ++r) everyone.push_back(r);
  accept_ranks(listener.fd(), *connections, everyone, nonce, deadline, timeout, stop, "rank 0",
               "data port", at);
  spdlog::debug("transport tcp: {} rank(s) connected to {}; rank 0 broadcasts to rank(s) {}",
                world_size - 1, at, list_ranks(relay.downstream));
  return std::make_unique<TcpTransport>(std::move(connections), std::move(relay));
}

std::unique_ptr<Transport> make_tcp_transport(int rank, int world_size, std::string_view address,
                                              std::uint16_t port, const TcpNonce& nonce,
                                              std::chrono::milliseconds timeout,
                                              std::stop_token stop, const TcpNodes& nodes) {
  WEIGHTCAST_EXPECT(world_size >= 2 && rank >= 1 && rank < world_size, Errc::internal,
                    fmt::format("transport tcp: rank {} of a world of {} dials rank 0", rank,
                                world_size));
  Relay relay = relay_for(rank, world_size, nodes);
  const auto deadline = Clock::now() + timeout;
  const std::string at = fmt::format("{}:{}", address, port);
  // A leader listens before it dials rank 0 (see relay_listen).
  UniqueFd relay_listener;
  const std::string own_socket = relay_socket_name(nodes.relay_id, rank);
  if (!relay.downstream.empty()) relay_listener = relay_listen(own_socket);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string host(address);
  if (const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      rc != 0) {
    throw Error(Errc::unavailable, fmt::format("transport tcp: rank 0's data port {} does not "
                                               "resolve: {}",
                                               at, ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  UniqueFd fd;
  int error = 0;
  for (addrinfo* a = found; a != nullptr && !fd; a = a->ai_next) {
    UniqueFd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        a->ai_protocol));
    if (!s) {
      error = errno;
      continue;
    }
    tune(s.get());  // before connecting: the receive window is negotiated then
    if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = errno;
      continue;
    }
    if (!wait_for(s.get(), POLLOUT, deadline, stop, fmt::format("connecting to {}", at))) {
      throw Error(Errc::timeout, fmt::format("transport tcp: rank {} could not connect to rank "
                                             "0's data port {} within {} ms",
                                             rank, at, timeout.count()));
    }
    int so_error = 0;
    socklen_t length = sizeof so_error;
    ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &so_error, &length);
    if (so_error != 0) {
      error = so_error;
      continue;
    }
    fd = std::move(s);
  }
  if (!fd) {
    throw Error(Errc::unavailable, fmt::format("transport tcp: rank {} cannot connect to rank "
                                               "0's data port {}: {}",
                                               rank, at, errno_text(error)));
  }
  show_hello(fd.get(), rank, world_size, nonce, deadline, timeout, stop,
             fmt::format("rank 0's data port {}", at), "rank 0");
  auto connections = std::make_shared<Connections>(rank, world_size);
  connections->link(0).fd = std::move(fd);
  if (relay.upstream != 0) {
    // Rank 0 accepted every rank at once, so this node's leader is listening already.
    const std::string socket = relay_socket_name(nodes.relay_id, relay.upstream);
    UniqueFd to_leader = relay_dial(socket, relay.upstream, deadline, timeout, stop);
    tune(to_leader.get());
    show_hello(to_leader.get(), rank, world_size, nonce, deadline, timeout, stop,
               fmt::format("rank {}'s relay socket @{}", relay.upstream, socket),
               fmt::format("rank {}", relay.upstream));
    connections->link(relay.upstream).fd = std::move(to_leader);
    spdlog::debug("transport tcp: rank {} gets its broadcasts through rank {}, its node's leader",
                  rank, relay.upstream);
  }
  if (!relay.downstream.empty()) {
    accept_ranks(relay_listener.get(), *connections, relay.downstream, nonce, deadline, timeout,
                 stop, fmt::format("rank {}", rank), "relay socket", "@" + own_socket);
    spdlog::debug("transport tcp: rank {} leads its node: it forwards broadcasts to rank(s) {}",
                  rank, list_ranks(relay.downstream));
  }
  return std::make_unique<TcpTransport>(std::move(connections), std::move(relay));
}

}  // namespace weightcast
