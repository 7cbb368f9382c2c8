// Runs a command (the weightcast launcher) and captures its exit status and output.
#pragma once

#include <string>
#include <vector>

namespace weightcast::test {

struct ProcessResult {
  int exit_status = -1;  ///< Exit status, or 128 + signal number if killed by a signal.
  std::string out;       ///< Everything written to stdout.
  std::string err;       ///< Everything written to stderr.
};

/// Runs @p argv (argv[0] is the program path) with extra @p env entries ("K=V"), waiting at
/// most @p timeout_s seconds (then SIGKILL and FAIL).
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env = {}, int timeout_s = 300);

/// run_process with the built `weightcast` launcher as argv[0].
ProcessResult run_cli(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}, int timeout_s = 300);

}  // namespace weightcast::test
