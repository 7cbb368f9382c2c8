// Runs a command (the weightcast launcher) and captures its exit status and output.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast::test {

struct ProcessResult {
  int exit_status = -1;  ///< Exit status, or 128 + signal number if killed by a signal.
  int term_signal = 0;   ///< The signal that killed it; 0 when it exited by itself.
  std::string out;       ///< Everything written to stdout.
  std::string err;       ///< Everything written to stderr.
};

/// FAILs the running test, showing @p output, if it holds a sanitizer report (AddressSanitizer,
/// LeakSanitizer, UndefinedBehaviorSanitizer, ThreadSanitizer) from @p what. Under
/// scripts/sanitize.sh a child (the launcher, an mpirun rank) that reports exits with the
/// sanitizer's status, but a test expecting a failure status, or a rank whose report mpirun
/// forwards while the job still ends as the test expects, would not notice that alone.
void check_no_sanitizer_report(std::string_view output, std::string_view what);

/// Runs @p argv (argv[0] is the program path) with extra @p env entries ("K=V"), waiting at
/// most @p timeout_s seconds (then SIGKILL and FAIL). FAILs if its output holds a sanitizer
/// report (check_no_sanitizer_report).
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env = {}, int timeout_s = 300);

/// run_process with the built `weightcast` launcher as argv[0].
ProcessResult run_cli(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}, int timeout_s = 300);

/// Writes a synthetic checkpoint of 10M parameters in 4 MiB shards (several shards; some 20
/// chunks at chunk_size 1MiB) to @p dir/ckpt with `weightcast synth`; REQUIREs that synth
/// succeeds. @return its directory.
std::filesystem::path synth_sharded(const std::filesystem::path& dir);

}  // namespace weightcast::test
