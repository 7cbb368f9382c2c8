#include "support/job.hpp"

#include "support/paths.hpp"

#include "support/spawn.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace weightcast::test {

BackgroundJob::BackgroundJob(const std::vector<std::string>& argv,
                             const std::vector<std::string>& env) {
  const std::string out = (_dir / "output").string();
  const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  _pid = spawn_process(argv, env,
                       SpawnOptions{.stdout_fd = fd,
                                    .stderr_fd = fd,
                                    .own_process_group = true,
                                    .search_path = true});
  ::close(fd);
}

BackgroundJob::~BackgroundJob() {
  if (_reaped) return;
  ::kill(-_pid, SIGKILL);
  int status = 0;
  ::waitpid(_pid, &status, 0);
}

std::string BackgroundJob::output() const { return read_file(_dir / "output"); }

bool BackgroundJob::wait_for_output(const std::string& text, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (output().find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

bool BackgroundJob::running() {
  if (_reaped) return false;
  if (::waitpid(_pid, &_status, WNOHANG) != _pid) return true;
  _reaped = true;
  return false;
}

ProcessResult BackgroundJob::wait(int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = _status;
  while (!_reaped) {
    const pid_t done = ::waitpid(_pid, &status, WNOHANG);
    if (done == _pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(-_pid, SIGKILL);
      ::waitpid(_pid, &status, 0);
      _reaped = true;
      FAIL("job did not end within " << timeout_s << " s; output:\n" << output());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  _reaped = true;
  // Whatever the job left in its group (it should leave nothing) goes now.
  ::kill(-_pid, SIGKILL);
  ProcessResult result;
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  result.out = output();
  check_no_sanitizer_report(result.out, "the background job");
  return result;
}

pid_t BackgroundJob::find_descendant_with_env(const std::string& entry) const {
  namespace fs = std::filesystem;
  for (const auto& proc : fs::directory_iterator("/proc")) {
    const std::string name = proc.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = std::stoi(name);
    // Walk up the parents to see whether this process descends from the job.
    pid_t at = pid;
    bool ours = false;
    for (int depth = 0; depth < 8 && at > 1; ++depth) {
      std::ifstream stat(fs::path("/proc") / std::to_string(at) / "stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');
      if (close == std::string::npos) break;
      std::istringstream rest(line.substr(close + 2));
      char state = 0;
      pid_t parent = 0;
      rest >> state >> parent;
      if (parent == _pid) {
        ours = true;
        break;
      }
      at = parent;
    }
    if (!ours) continue;
    const std::string environ_text = read_file(proc.path() / "environ");
    std::size_t begin = 0;
    while (begin < environ_text.size()) {
      const auto end = environ_text.find('\0', begin);
      if (environ_text.compare(begin, (end == std::string::npos ? environ_text.size() : end) - begin,
                               entry) == 0) {
        return pid;
      }
      if (end == std::string::npos) break;
      begin = end + 1;
    }
  }
  return -1;
}

}  // namespace weightcast::test
