#include "support/spawn.hpp"

#include "weightcast/core/detail/exec_image.hpp"

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <unistd.h>

namespace weightcast::test {

pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                    const SpawnOptions& options) {
  REQUIRE(!argv.empty());
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  const detail::ExecImage image(argv, env);

  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (options.own_process_group) ::setpgid(0, 0);
    // SIGINT and SIGTERM as a terminal would deliver them, however the test binary was started
    // (a script's background job ignores SIGINT, and that is inherited): the signal tests
    // send them.
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    sigset_t interrupts;
    sigemptyset(&interrupts);
    for (const int sig : {SIGINT, SIGTERM}) {
      ::sigaction(sig, &default_action, nullptr);
      sigaddset(&interrupts, sig);
    }
    ::sigprocmask(SIG_UNBLOCK, &interrupts, nullptr);
    if (options.stdout_fd >= 0) ::dup2(options.stdout_fd, STDOUT_FILENO);
    if (options.stderr_fd >= 0) ::dup2(options.stderr_fd, STDERR_FILENO);
    if (options.search_path) {
      ::execvpe(image.argv()[0], image.argv(), image.envp());
    } else {
      ::execve(image.argv()[0], image.argv(), image.envp());
    }
    std::perror(image.argv()[0]);
    ::_exit(127);
  }
  // Set in both processes, so the group exists before either goes on.
  if (options.own_process_group) ::setpgid(pid, pid);
  return pid;
}

}  // namespace weightcast::test
