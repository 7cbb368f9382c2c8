// Rendezvous ports for tests: each test asks the kernel for a free one, so that two suites
// (a developer's run and CI, two build trees under ctest -j) never meet on a fixed port.
#pragma once

#include <cstdint>

namespace weightcast::test {

/// @return a TCP port free on every IPv4 address a moment ago, at random below the kernel's
///         ephemeral range (where no connection's local port can take it before the test's
///         rank 0 binds it). Never the same port twice in one test process. REQUIREs a
///         socket, and an ephemeral range that starts above 11000.
std::uint16_t free_port();

}  // namespace weightcast::test
