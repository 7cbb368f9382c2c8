// A plain TCP client for tests that play a stranger against rank 0's real listener: connect
// and say nothing, trickle bytes, send a hostile frame header, read what rank 0 answers.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weightcast::test {

/// One control-plane frame as read off the wire.
struct RawFrame {
  std::uint8_t type = 0;
  std::string payload;
};

class TcpClient {
 public:
  /// Connects to @p address:@p port, retrying while refused until @p wait has passed (rank 0
  /// may still be starting its listener). FAILs the test when it cannot connect.
  TcpClient(std::uint16_t port, std::chrono::milliseconds wait = std::chrono::seconds(5),
            const std::string& address = "127.0.0.1");
  /// Wraps a connected socket (e.g. one a test's listener accepted).
  explicit TcpClient(int fd) noexcept : _fd(fd) {}
  ~TcpClient();
  TcpClient(TcpClient&& other) noexcept;
  TcpClient(const TcpClient&) = delete;
  TcpClient& operator=(const TcpClient&) = delete;
  TcpClient& operator=(TcpClient&&) = delete;

  [[nodiscard]] int fd() const noexcept { return _fd; }
  /// Sends all of @p bytes. @return false when the peer has closed the connection.
  bool send(std::string_view bytes);
  /// Reads one frame (5-byte header, payload of up to 1 MiB) within @p wait, skipping the
  /// heartbeats (`detail::Frame::progress`) an accepted peer gets from rank 0.
  /// @return nothing when the connection closed or @p wait passed first.
  std::optional<RawFrame> read_frame(std::chrono::milliseconds wait);
  /// @return whether the other side closed the connection (EOF or reset) within @p wait;
  ///         bytes that arrive meanwhile are read and dropped.
  bool closed_within(std::chrono::milliseconds wait);

 private:
  bool read_exact(char* out, std::size_t bytes, std::chrono::steady_clock::time_point deadline);
  int _fd = -1;
};

/// @return the errno of a single connect to @p address:@p port (0 when it connected).
int connect_errno(const std::string& address, std::uint16_t port);

/// A listening socket on 127.0.0.1:@p port, for tests that play rank 0 against a real peer.
class TcpListener {
 public:
  explicit TcpListener(std::uint16_t port);
  ~TcpListener();
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  /// @return the next connection within @p wait; FAILs the test when none comes.
  TcpClient accept(std::chrono::milliseconds wait);

 private:
  int _fd = -1;
};

}  // namespace weightcast::test
