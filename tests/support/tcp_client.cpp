#include "support/tcp_client.hpp"

#include "weightcast/control/detail/control_wire.hpp"

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

namespace weightcast::test {

namespace {

using Clock = std::chrono::steady_clock;

sockaddr_in endpoint(const std::string& address, std::uint16_t port) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  REQUIRE(::inet_pton(AF_INET, address.c_str(), &to.sin_addr) == 1);
  return to;
}

int poll_ms(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

}  // namespace

int connect_errno(const std::string& address, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  const sockaddr_in to = endpoint(address, port);
  const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  const int error = rc == 0 ? 0 : errno;
  ::close(fd);
  return error;
}

TcpClient::TcpClient(std::uint16_t port, std::chrono::milliseconds wait,
                     const std::string& address) {
  const sockaddr_in to = endpoint(address, port);
  const auto deadline = Clock::now() + wait;
  int error = 0;
  do {
    _fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(_fd >= 0);
    if (::connect(_fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) return;
    error = errno;
    ::close(_fd);
    _fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (error == ECONNREFUSED && Clock::now() < deadline);
  FAIL("cannot connect to " << address << ":" << port << ": " << std::strerror(error));
}

TcpClient::~TcpClient() {
  if (_fd >= 0) ::close(_fd);
}

TcpClient::TcpClient(TcpClient&& other) noexcept : _fd(other._fd) { other._fd = -1; }

bool TcpClient::send(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t sent = ::send(_fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    bytes.remove_prefix(static_cast<std::size_t>(sent));
  }
  return true;
}

bool TcpClient::read_exact(char* out, std::size_t bytes, Clock::time_point deadline) {
  while (bytes > 0) {
    pollfd p{_fd, POLLIN, 0};
    if (::poll(&p, 1, poll_ms(deadline)) <= 0) return false;
    const ssize_t got = ::recv(_fd, out, bytes, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

std::optional<RawFrame> TcpClient::read_frame(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  while (true) {
    char header[5];
    if (!read_exact(header, sizeof header, deadline)) return std::nullopt;
    RawFrame frame;
    frame.type = static_cast<std::uint8_t>(header[0]);
    std::uint32_t length = 0;
    std::memcpy(&length, header + 1, 4);
    REQUIRE(length <= (1u << 20));
    frame.payload.resize(length);
    if (!read_exact(frame.payload.data(), length, deadline)) return std::nullopt;
    if (frame.type == static_cast<std::uint8_t>(detail::Frame::progress)) continue;  // rank 0's heartbeat
    return frame;
  }
}

bool TcpClient::closed_within(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  char sink[4096];
  while (true) {
    pollfd p{_fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, poll_ms(deadline)) <= 0) return false;
    const ssize_t got = ::recv(_fd, sink, sizeof sink, MSG_DONTWAIT);
    if (got == 0) return true;
    if (got < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) return true;
  }
}

TcpListener::TcpListener(std::uint16_t port) {
  _fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(_fd >= 0);
  const int one = 1;
  ::setsockopt(_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const sockaddr_in at = endpoint("127.0.0.1", port);
  REQUIRE(::bind(_fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) == 0);
  REQUIRE(::listen(_fd, 16) == 0);
}

TcpListener::~TcpListener() {
  if (_fd >= 0) ::close(_fd);
}

TcpClient TcpListener::accept(std::chrono::milliseconds wait) {
  pollfd p{_fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, static_cast<int>(wait.count())) == 1);
  const int fd = ::accept4(_fd, nullptr, nullptr, SOCK_CLOEXEC);
  REQUIRE(fd >= 0);
  return TcpClient(fd);
}

}  // namespace weightcast::test
