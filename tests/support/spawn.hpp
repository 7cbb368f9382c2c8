// Starts a child process: the one fork/exec behind run_process and BackgroundJob.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace weightcast::test {

/// How spawn_process starts its child.
struct SpawnOptions {
  int stdout_fd = -1;              ///< Becomes the child's stdout (dup2); -1 keeps this one's.
  int stderr_fd = -1;              ///< Becomes the child's stderr (dup2); -1 keeps this one's.
  bool own_process_group = false;  ///< Starts a process group led by the child, so that the
                                   ///< whole group can be signalled (kill(-pid, ...)).
  bool search_path = false;        ///< Looks argv[0] up on PATH (execvpe) instead of taking it
                                   ///< as a path (execve).
};

/// Forks and execs @p argv (argv[0] a path, or a name on PATH with `search_path`) with this
/// process's environment, in which each @p env entry ("K=V") replaces any K already there.
/// Descriptors opened with O_CLOEXEC do not reach the child. A child that cannot exec prints
/// why to its stderr and exits 127. REQUIREs that fork succeeds.
/// @return the child's pid; the caller waits for it (waitpid).
pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                    const SpawnOptions& options);

}  // namespace weightcast::test
