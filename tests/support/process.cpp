#include "support/process.hpp"

#include "support/paths.hpp"
#include "support/spawn.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace weightcast::test {

void check_no_sanitizer_report(std::string_view output, std::string_view what) {
  // Each runtime's report line: "==PID==ERROR: AddressSanitizer: ...", "==PID==ERROR:
  // LeakSanitizer: ...", "FILE:LINE:COL: runtime error: ..." (UBSan), "WARNING:
  // ThreadSanitizer: ...".
  for (std::string_view marker : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                  ": runtime error: ", "WARNING: ThreadSanitizer"}) {
    if (output.find(marker) != std::string_view::npos) {
      FAIL("sanitizer report (" << marker << ") from " << what << ":\n" << output);
    }
  }
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env, int timeout_s) {
  int out_pipe[2];
  int err_pipe[2];
  REQUIRE(pipe2(out_pipe, O_CLOEXEC) == 0);
  REQUIRE(pipe2(err_pipe, O_CLOEXEC) == 0);
  const pid_t pid = spawn_process(argv, env,
                                  SpawnOptions{.stdout_fd = out_pipe[1], .stderr_fd = err_pipe[1]});
  close(out_pipe[1]);
  close(err_pipe[1]);

  ProcessResult result;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_fds = 2;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool timed_out = false;
  while (open_fds > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    int n = poll(fds, 2, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP)) != 0) {
        char buf[65536];
        ssize_t got = read(fds[i].fd, buf, sizeof buf);
        if (got > 0) {
          sinks[i]->append(buf, static_cast<std::size_t>(got));
        } else {
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
        }
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) {
    FAIL("command timed out after " << timeout_s << " s: " << argv[0] << "\nstdout:\n"
                                    << result.out << "\nstderr:\n" << result.err);
  }
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  check_no_sanitizer_report(result.err + result.out, argv[0]);
  return result;
}

ProcessResult run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env,
                      int timeout_s) {
  std::vector<std::string> argv{cli_path().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, env, timeout_s);
}

std::filesystem::path synth_sharded(const std::filesystem::path& dir) {
  const auto checkpoint = dir / "ckpt";
  const auto synth = run_cli({"synth", checkpoint.string(), "--params", "10M", "--shard-size",
                              "4MiB"});
  INFO(synth.out << synth.err);
  REQUIRE(synth.exit_status == 0);
  return checkpoint;
}

}  // namespace weightcast::test
