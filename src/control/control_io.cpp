// What the control plane's messages say of ranks, addresses, durations and a failed listen.
#include "weightcast/control/detail/control_io.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <cerrno>

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

}  // namespace weightcast::detail
