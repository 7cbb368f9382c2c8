// mpirun for the tests that start ranks under it (test_multirank.cpp, test_job.cpp).
#pragma once

#include "support/process.hpp"

#include <sys/types.h>

#include <string>
#include <vector>

namespace weightcast::test {

class BackgroundJob;

/// @return mpirun's absolute path (run_process execs without a PATH search), or "" when it
///         is not on PATH.
std::string mpirun_path();

/// @return whether this build has MPI and mpirun is on PATH.
bool have_mpirun();

/// @return mpirun and its options (--oversubscribe; --allow-run-as-root as root), before the
///         "-np N program args" groups (several, separated by ":", for MPMD).
std::vector<std::string> mpirun_options();

/// @return mpirun_options() followed by "-np @p ranks".
std::vector<std::string> mpirun_prefix(int ranks);

/// Waits for @p job, ranks under mpirun of which @p victim was stopped (SIGSTOP) for good, at
/// most @p timeout_s seconds. Open MPI's teardown of such a job hung once on a loaded machine:
/// every rank had printed its 75 and mpirun its "Exit code: 75", then mpirun waited on the
/// stopped rank until the test's limit. What these tests check is weightcast's ranks, so once
/// mpirun has reported the failure and not ended 15 s later, the stopped rank is killed; a
/// job that never reports still fails at the limit. The victim is killed at the end either way.
ProcessResult wait_with_stopped_rank(BackgroundJob& job, pid_t victim, int timeout_s);

}  // namespace weightcast::test

/// Skips (WARN, return) the running test unless have_mpirun().
#define REQUIRE_MPI()                                                                         \
  do {                                                                                        \
    if (!::weightcast::test::have_mpirun()) {                                                 \
      WARN("skipped: this build has no MPI or mpirun is not on PATH (scripts/install-deps.sh)"); \
      return;                                                                                 \
    }                                                                                         \
  } while (0)
