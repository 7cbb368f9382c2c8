#include "utils/spawn.hpp"

#include <catch2/catch.hpp>

#include <cstdio>
#include <unistd.h>

extern char** environ;

namespace weightcast::test {

pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                    const SpawnOptions& options) {
  REQUIRE(!argv.empty());
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& kv : env) {
    auto key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env_strings, [&](const std::string& s) { return s.rfind(key, 0) == 0; });
    env_strings.push_back(kv);
  }
  std::vector<char*> c_argv;
  for (const auto& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  std::vector<char*> c_env;
  for (auto& s : env_strings) c_env.push_back(s.data());
  c_env.push_back(nullptr);

  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (options.own_process_group) ::setpgid(0, 0);
    if (options.stdout_fd >= 0) ::dup2(options.stdout_fd, STDOUT_FILENO);
    if (options.stderr_fd >= 0) ::dup2(options.stderr_fd, STDERR_FILENO);
    if (options.search_path) {
      ::execvpe(c_argv[0], c_argv.data(), c_env.data());
    } else {
      ::execve(c_argv[0], c_argv.data(), c_env.data());
    }
    std::perror(c_argv[0]);
    ::_exit(127);
  }
  // Set in both processes, so the group exists before either goes on.
  if (options.own_process_group) ::setpgid(pid, pid);
  return pid;
}

}  // namespace weightcast::test
