#include "support/mpirun.hpp"

#include "support/job.hpp"
#include "support/process.hpp"

#include "weightcast/transport/transport_mpi.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

namespace weightcast::test {

std::string mpirun_path() {
  static const std::string path = [] {
    auto r = run_process({"/bin/sh", "-c", "command -v mpirun"}, {}, 30);
    std::string p = r.out.substr(0, r.out.find('\n'));
    return r.exit_status == 0 ? p : std::string();
  }();
  return path;
}

bool have_mpirun() { return mpi_compiled_in() && !mpirun_path().empty(); }

std::vector<std::string> mpirun_options() {
  std::vector<std::string> argv{mpirun_path(), "--oversubscribe"};
  if (::geteuid() == 0) argv.emplace_back("--allow-run-as-root");
  return argv;
}

std::vector<std::string> mpirun_prefix(int ranks) {
  std::vector<std::string> argv = mpirun_options();
  argv.insert(argv.end(), {"-np", std::to_string(ranks)});
  return argv;
}

ProcessResult wait_with_stopped_rank(BackgroundJob& job, pid_t victim, int timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(timeout_s);
  std::optional<Clock::time_point> reported;
  while (job.running() && Clock::now() < deadline) {
    if (!reported && job.output().find("Exit code:") != std::string::npos) {
      reported = Clock::now();
    }
    if (reported && Clock::now() - *reported > std::chrono::seconds(15)) {
      ::kill(victim, SIGKILL);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto r = job.wait(timeout_s);
  ::kill(victim, SIGKILL);  // in case mpirun left it stopped
  return r;
}

}  // namespace weightcast::test
