// A process running in the background (a launcher, mpirun), for tests that act on it while
// it runs: kill or stop one of its ranks, truncate a file it reads.
#pragma once

#include "support/paths.hpp"
#include "support/process.hpp"

#include <sys/types.h>

#include <string>
#include <vector>

namespace weightcast::test {

class BackgroundJob {
 public:
  /// Starts @p argv (argv[0] a path or a name on PATH) with extra @p env ("K=V"), in a
  /// process group of its own; stdout and stderr go to one file.
  BackgroundJob(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  /// Kills the whole process group (SIGKILL) and reaps, if still running.
  ~BackgroundJob();
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  [[nodiscard]] pid_t pid() const noexcept { return _pid; }
  /// @return everything written so far.
  [[nodiscard]] std::string output() const;
  /// Waits until the output contains @p text; false after @p timeout_s seconds.
  bool wait_for_output(const std::string& text, int timeout_s);
  /// Waits for the exit (FAILs after @p timeout_s, killing the group, and FAILs if the
  /// output holds a sanitizer report: check_no_sanitizer_report).
  /// @return exit status, or 128 + signal; `out` holds the output.
  ProcessResult wait(int timeout_s);
  /// @return whether the job is still running (false once it has ended; `wait` then returns
  ///         at once).
  [[nodiscard]] bool running();
  /// @return the pid of a descendant whose environment has @p entry ("RANK=1"), or -1.
  [[nodiscard]] pid_t find_descendant_with_env(const std::string& entry) const;

 private:
  TempDir _dir{"weightcast-job"};
  pid_t _pid = -1;
  bool _reaped = false;
  int _status = 0;  // once _reaped
};

}  // namespace weightcast::test
