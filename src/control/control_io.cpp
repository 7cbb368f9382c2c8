// Whole frames sent and received on a control-plane socket within a deadline of running time,
// and what the control plane's messages say of ranks, addresses, durations and a failed listen.
#include "weightcast/control/detail/control_io.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <array>
#include <cerrno>
#include <poll.h>
#include <sys/socket.h>

namespace weightcast::detail {

using Clock = ControlClock;

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

std::string milliseconds(std::chrono::milliseconds d) { return fmt::format("{} ms", d.count()); }

std::string host_port(std::string_view host, unsigned port) {
  return host.find(':') != std::string_view::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
}

std::string listen_hint(int error) {
  switch (error) {
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
  const auto [type, length] = decode_frame_header(header, FrameReader::joining, what);
  std::string payload(length, '\0');
  if (!read_exact(payload.data(), length)) return std::nullopt;
  return std::make_pair(type, std::move(payload));
}

}  // namespace weightcast::detail
