#include "support/ports.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <mutex>
#include <netinet/in.h>
#include <set>
#include <sys/socket.h>
#include <unistd.h>

namespace weightcast::test {

std::uint16_t free_port() {
  static std::mutex mutex;
  static std::set<std::uint16_t> given;
  std::lock_guard lock(mutex);
  // The kernel picks the port of a socket bound to 0 from the ephemeral range, at a random
  // place: other processes' choices do not collide with it while it is bound, and it is
  // closed (not listened on, so no TIME_WAIT) before the test's rank 0 binds it.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof address;
    const bool bound =
        ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
    ::close(fd);
    REQUIRE(bound);
    const std::uint16_t port = ntohs(address.sin_port);
    if (given.insert(port).second) return port;
  }
  FAIL("free_port: the kernel kept handing out ports this test already used");
  return 0;
}

}  // namespace weightcast::test
