// The tcp transport in one process: ranks on threads over real loopback sockets. The
// handshake refuses strangers, broadcasts and exchanges land bit-exact, and a lost peer, a
// missing rank or a plan that differs fail with the rank named and the right status.
#include "weightcast/transport/detail/transport_tcp.hpp"

#include "weightcast/core/error.hpp"

#include "support/tcp_client.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <stop_token>
#include <thread>
#include <vector>

using weightcast::Errc;
using weightcast::Error;
using weightcast::Pending;
using weightcast::TcpNonce;
using weightcast::Transport;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

constexpr auto wait_most = std::chrono::seconds(20);

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(gen() & 0xff);
  return out;
}

// Polls @p pending to completion (bounded); rethrows what test() throws.
void finish(const std::unique_ptr<Pending>& pending) {
  const auto until = std::chrono::steady_clock::now() + wait_most;
  while (pending && !pending->test()) {
    if (std::chrono::steady_clock::now() > until) {
      throw Error(Errc::timeout, "test: a pending did not complete");
    }
    std::this_thread::sleep_for(50us);
  }
}

// A world of @p world_size ranks: rank 0 in this thread's future, the others dialling it.
// @p nodes: where each rank runs, as the job says it (here all on this host: the relay's
// sockets are this host's too).
std::vector<std::unique_ptr<Transport>> connect_world(int world_size,
                                                      const weightcast::TcpNodes& nodes = {}) {
  weightcast::TcpListener listener("127.0.0.1");
  const std::uint16_t port = listener.port();
  const TcpNonce nonce = weightcast::tcp_nonce();
  auto root = std::async(std::launch::async, [&, l = std::move(listener)]() mutable {
    return weightcast::make_tcp_transport(std::move(l), world_size, nonce, 10s, {}, nodes);
  });
  std::vector<std::future<std::unique_ptr<Transport>>> peers;
  for (int r = 1; r < world_size; ++r) {
    peers.push_back(std::async(std::launch::async, [&, r] {
      return weightcast::make_tcp_transport(r, world_size, "127.0.0.1", port, nonce, 10s, {},
                                            nodes);
    }));
  }
  std::vector<std::unique_ptr<Transport>> world;
  world.push_back(root.get());
  for (auto& p : peers) world.push_back(p.get());
  return world;
}

// Every rank of @p world posts a grouped broadcast of two ranges from rank 0 (one past the
// socket buffers, 16 MiB at most, so the sender must wait for its receivers) and a second
// broadcast while the first is in flight: they must complete in posting order, and every
// rank must end with rank 0's bytes. @p seed draws the bytes.
void check_two_broadcasts(const std::vector<std::unique_ptr<Transport>>& world, unsigned seed) {
  const int world_size = static_cast<int>(world.size());
  const std::size_t a_bytes = (24u << 20) + 3;
  const std::size_t b_bytes = 4097;
  const auto a = random_bytes(a_bytes, seed);
  const auto b = random_bytes(b_bytes, seed + 1);
  std::vector<std::vector<std::byte>> got_a(world_size, std::vector<std::byte>(a_bytes));
  std::vector<std::vector<std::byte>> got_b(world_size, std::vector<std::byte>(b_bytes));
  got_a[0] = a;
  got_b[0] = b;
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      const Transport::Range ranges[] = {{got_a[r].data(), a_bytes}, {got_b[r].data(), b_bytes}};
      auto first = world[r]->broadcast_group(ranges, 0, nullptr);
      auto second = world[r]->broadcast(got_b[r].data(), 100, 0);
      finish(second);
      finish(first);
    }));
  }
  for (auto& f : ranks) f.get();
  for (int r = 1; r < world_size; ++r) {
    INFO("rank " << r);
    CHECK(got_a[r] == a);
    CHECK(got_b[r] == b);
  }
}

}  // namespace

TEST_CASE("tcp: 3 ranks broadcast and exchange over loopback, bit-exact", "[tcp]") {
  auto world = connect_world(3);
  REQUIRE(world.size() == 3);
  for (int r = 0; r < 3; ++r) {
    CHECK(world[r]->name() == "tcp");
    CHECK(world[r]->rank() == r);
    CHECK(world[r]->world_size() == 3);
  }
  check_two_broadcasts(world, 1);

  // Exchange: rank 0 sends each rank its own slices (two messages each), and one to itself.
  const auto source = random_bytes(3000, 3);
  std::vector<std::vector<std::byte>> slices(3, std::vector<std::byte>(1000));
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      std::vector<Transport::Message> sends;
      std::vector<Transport::Message> receives;
      auto* from = const_cast<std::byte*>(source.data());
      if (r == 0) {
        for (int peer = 0; peer < 3; ++peer) {
          sends.push_back({peer, from + peer * 1000, 400});
          sends.push_back({peer, from + peer * 1000 + 400, 600});
        }
        receives.push_back({0, slices[0].data(), 400});
        receives.push_back({0, slices[0].data() + 400, 600});
      } else {
        receives.push_back({0, slices[r].data(), 400});
        receives.push_back({0, slices[r].data() + 400, 600});
      }
      finish(world[r]->exchange(sends, receives, 7));
    }));
  }
  for (auto& f : ranks) f.get();
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(std::memcmp(slices[r].data(), source.data() + r * 1000, 1000) == 0);
  }

  // The star has no connection between ranks 1 and 2.
  std::byte one{};
  const Transport::Message to_two[] = {{2, &one, 1}};
  try {
    world[1]->exchange(to_two, {}, 0);
    FAIL("an exchange between ranks 1 and 2 was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("rank 1 cannot send to rank 2 directly"));
  }
  // Only rank 0 broadcasts.
  try {
    world[1]->broadcast(&one, 1, 1);
    FAIL("a broadcast from rank 1 was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::config);
  }
}

TEST_CASE("tcp: a stranger on the data port is refused, the job's ranks still connect",
          "[tcp]") {
  weightcast::TcpListener listener("127.0.0.1");
  const std::uint16_t port = listener.port();
  const TcpNonce nonce = weightcast::tcp_nonce();
  auto root = std::async(std::launch::async, [&, l = std::move(listener)]() mutable {
    return weightcast::make_tcp_transport(std::move(l), 2, nonce, 10s);
  });
  // Junk of a hello's length, then a peer that knows the protocol but not the secret.
  weightcast::test::TcpClient junk(port);
  REQUIRE(junk.send(std::string(32, 'x')));
  CHECK(junk.closed_within(5s));
  TcpNonce wrong = nonce;
  wrong[0] ^= std::byte{1};
  try {
    weightcast::make_tcp_transport(1, 2, "127.0.0.1", port, wrong, 5s);
    FAIL("a rank with the wrong secret was accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Contains("without accepting it"));
  }
  // A connection that says nothing holds nobody up.
  weightcast::test::TcpClient silent(port);
  auto peer = weightcast::make_tcp_transport(1, 2, "127.0.0.1", port, nonce, 10s);
  auto transport = root.get();
  REQUIRE(transport->world_size() == 2);
  CHECK(silent.closed_within(5s));
  // The pair works.
  auto data = random_bytes(1000, 4);
  std::vector<std::byte> got(1000);
  auto sent = transport->broadcast(data.data(), data.size(), 0);
  finish(peer->broadcast(got.data(), got.size(), 0));
  finish(sent);
  CHECK(got == data);
}

TEST_CASE("tcp: a rank that never connects ends rank 0 with 75 naming it", "[tcp]") {
  weightcast::TcpListener listener("127.0.0.1");
  const std::uint16_t port = listener.port();
  const TcpNonce nonce = weightcast::tcp_nonce();
  auto root = std::async(std::launch::async, [&, l = std::move(listener)]() mutable {
    return weightcast::make_tcp_transport(std::move(l), 3, nonce, 500ms);
  });
  auto peer = std::async(std::launch::async, [&] {
    return weightcast::make_tcp_transport(1, 3, "127.0.0.1", port, nonce, 500ms);
  });
  try {
    root.get();
    FAIL("rank 0 went on without rank 2");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(), Contains("rank(s) 2 did not connect"));
  }
  // Rank 1 was never accepted: rank 0's listener went away, closing its connection.
  try {
    peer.get();
    FAIL("rank 1 was accepted by a rank 0 that failed");
  } catch (const Error& e) {
    CHECK((e.code() == Errc::unavailable || e.code() == Errc::timeout));
  }
}

TEST_CASE("tcp: a lost peer fails with 69 naming it, and plans that differ with 70", "[tcp]") {
  SECTION("lost") {
    auto world = connect_world(2);
    auto data = random_bytes(64u << 20, 5);  // more than the buffers hold
    auto pending = world[0]->broadcast(data.data(), data.size(), 0);
    world[1].reset();  // the peer goes (its process died): its socket closes
    try {
      finish(pending);
      FAIL("a broadcast to a lost rank completed");
    } catch (const weightcast::TcpConnectionLost& e) {
      CHECK(e.code() == Errc::unavailable);
      CHECK(e.peer() == 1);
      CHECK_THAT(e.what(), Contains("connection to rank 1 lost"));
    }
    // Later operations on that connection fail the same way, at once.
    CHECK_THROWS_AS(world[0]->broadcast(data.data(), 10, 0), weightcast::TcpConnectionLost);
  }
  SECTION("plans differ") {
    auto world = connect_world(2);
    auto data = random_bytes(100, 6);
    std::vector<std::byte> got(200);
    auto sent = world[0]->broadcast(data.data(), 100, 0);
    try {
      finish(world[1]->broadcast(got.data(), 200, 0));
      FAIL("a broadcast of another size was taken");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::internal);
      CHECK_THAT(e.what(), Contains("rank 0 sent a broadcast of 100 bytes"));
      CHECK_THAT(e.what(), Contains("posted a broadcast of 200 bytes"));
    }
  }
  SECTION("a pending destroyed unfinished closes its connection") {
    auto world = connect_world(2);
    {
      std::vector<std::byte> got(32u << 20);
      auto receiving = world[1]->broadcast(got.data(), got.size(), 0);
    }  // `got` is freed here: nothing may write it any more
    auto data = random_bytes(32u << 20, 7);
    // Rank 0 sees the closed connection at its first send or at a later poll.
    CHECK_THROWS_AS(finish(world[0]->broadcast(data.data(), data.size(), 0)),
                    weightcast::TcpConnectionLost);
    std::byte one{};
    try {
      world[1]->broadcast(&one, 1, 0);
      FAIL("a connection whose operation was abandoned was used again");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
      CHECK_THAT(e.what(), Contains("abandoned"));
    }
  }
}

TEST_CASE("tcp: a stop ends rank 0's wait for the ranks with 130", "[tcp]") {
  weightcast::TcpListener listener("127.0.0.1");
  std::stop_source stop;
  const auto begin = std::chrono::steady_clock::now();
  auto root = std::async(std::launch::async, [&, l = std::move(listener)]() mutable {
    return weightcast::make_tcp_transport(std::move(l), 2, weightcast::tcp_nonce(), 30s,
                                          stop.get_token());
  });
  std::this_thread::sleep_for(100ms);
  stop.request_stop();
  try {
    root.get();
    FAIL("rank 0 went on without its rank");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::interrupted);
    CHECK_THAT(e.what(), Contains("stopped while rank 0 waited for the ranks"));
  }
  CHECK(std::chrono::steady_clock::now() - begin < 5s);  // not the 30 s timeout
}

// Three simulated nodes, the ranks interleaved as a round-robin launcher places them: ranks
// 0 and 2 on rank 0's node, 1, 3 and 5 on a second (rank 1 leads it), 4 alone on a third.
weightcast::TcpNodes three_nodes() {
  weightcast::TcpNodes nodes;
  nodes.node = {7, 3, 7, 3, 9, 3};
  const TcpNonce id = weightcast::tcp_nonce();
  std::memcpy(&nodes.relay_id, id.data(), sizeof nodes.relay_id);
  return nodes;
}

TEST_CASE("tcp relay: a node's leader forwards broadcasts to its ranks, bit-exact", "[tcp]") {
  constexpr int world_size = 6;
  auto world = connect_world(world_size, three_nodes());
  REQUIRE(world.size() == world_size);
  // Through the leaders: rank 0, each leader and its ranks all wait on each other.
  check_two_broadcasts(world, 11);
  // Exchange still goes between rank 0 and each rank directly, the leader's ranks included.
  const auto source = random_bytes(6000, 13);
  std::vector<std::vector<std::byte>> slices(world_size, std::vector<std::byte>(1000));
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < world_size; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      std::vector<Transport::Message> sends;
      auto* from = const_cast<std::byte*>(source.data());
      if (r == 0) {
        for (int peer = 0; peer < world_size; ++peer) {
          sends.push_back({peer, from + peer * 1000, 1000});
        }
      }
      const Transport::Message receives[] = {{0, slices[r].data(), 1000}};
      finish(world[r]->exchange(sends, receives, 3));
    }));
  }
  for (auto& f : ranks) f.get();
  for (int r = 0; r < world_size; ++r) {
    INFO("rank " << r);
    CHECK(std::memcmp(slices[r].data(), source.data() + r * 1000, 1000) == 0);
  }
}

TEST_CASE("tcp relay: a lost leader is named by its ranks, a plan that differs fails with 70",
          "[tcp]") {
  constexpr int world_size = 6;
  SECTION("the leader goes") {
    auto world = connect_world(world_size, three_nodes());
    std::vector<std::byte> got(32u << 20);
    auto receiving = world[3]->broadcast(got.data(), got.size(), 0);
    world[1].reset();  // the leader's process died: its sockets close
    try {
      finish(receiving);
      FAIL("a broadcast through a lost leader completed");
    } catch (const weightcast::TcpConnectionLost& e) {
      CHECK(e.code() == Errc::unavailable);
      CHECK(e.peer() == 1);  // its broadcasts come from the leader, not from rank 0
      CHECK_THAT(e.what(), Contains("connection to rank 1 lost"));
    }
  }
  SECTION("a leader's rank posts another size") {
    auto world = connect_world(world_size, three_nodes());
    auto data = random_bytes(100, 14);
    std::vector<std::vector<std::byte>> got(world_size, std::vector<std::byte>(200));
    auto sent = world[0]->broadcast(data.data(), 100, 0);
    auto relayed = world[1]->broadcast(got[1].data(), 100, 0);
    try {
      finish(world[5]->broadcast(got[5].data(), 200, 0));
      FAIL("a broadcast of another size was taken");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::internal);
      CHECK_THAT(e.what(), Contains("rank 1 sent a broadcast of 100 bytes"));
      CHECK_THAT(e.what(), Contains("posted a broadcast of 200 bytes"));
    }
    CHECK(std::all_of(got[5].begin(), got[5].end(), [](std::byte x) { return x == std::byte{0}; }));
  }
}
