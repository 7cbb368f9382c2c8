#include "support/ports.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fstream>
#include <mutex>
#include <netinet/in.h>
#include <random>
#include <set>
#include <sys/socket.h>
#include <unistd.h>

namespace weightcast::test {

namespace {

// The kernel's ephemeral port range (ip_local_port_range): where it takes the local port of
// every outgoing connection and of every bind to port 0.
std::pair<int, int> ephemeral_range() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  int high = 60999;
  if (!(in >> low >> high) || low < 1 || high < low) return {32768, 60999};
  return {low, high};
}

// Whether @p port is free on every IPv4 address now: bound without SO_REUSEADDR (so a
// connection's or a TIME_WAIT's use of it counts), then closed unlistened (no TIME_WAIT).
bool bindable(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(port);
  const bool bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return bound;
}

}  // namespace

// Below the ephemeral range: a port taken from it, free a moment ago, may be the local port of
// some other process's connection (a parallel test's, MPI's) by the time the test's rank 0
// binds it, and rank 0 then fails with "Address already in use". Below it, only a process that
// asks for that very port can take it; each candidate is checked free first, and a random
// place in some 20,000 ports keeps two test processes apart.
std::uint16_t free_port() {
  static std::mutex mutex;
  static std::set<std::uint16_t> given;
  static std::mt19937 random{std::random_device{}()};
  std::lock_guard lock(mutex);
  constexpr int lowest = 10000;
  const int highest = ephemeral_range().first - 1;
  REQUIRE(highest - lowest >= 1000);  // the default range starts at 32768
  std::uniform_int_distribution<int> pick(lowest, highest);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const auto port = static_cast<std::uint16_t>(pick(random));
    if (given.count(port) == 0 && bindable(port)) {
      given.insert(port);
      return port;
    }
  }
  FAIL("free_port: no free port found below the ephemeral range in 1000 tries");
  return 0;
}

}  // namespace weightcast::test
