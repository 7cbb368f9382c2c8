// Rendezvous ports for tests: each test asks the kernel for a free one, so that two suites
// (a developer's run and CI, two build trees under ctest -j) never meet on a fixed port.
#pragma once

#include <cstdint>

namespace weightcast::test {

/// @return a TCP port on 127.0.0.1 that nothing listened on a moment ago: the kernel's
///         choice for a socket bound to port 0, then closed (the test's rank 0 binds it
///         next). Never the same port twice in one test process. REQUIREs a socket.
std::uint16_t free_port();

}  // namespace weightcast::test
