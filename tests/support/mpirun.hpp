// mpirun for the tests that start ranks under it (test_multirank.cpp, test_job.cpp).
#pragma once

#include <string>
#include <vector>

namespace weightcast::test {

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

}  // namespace weightcast::test

/// Skips (WARN, return) the running test unless have_mpirun().
#define REQUIRE_MPI()                                                                         \
  do {                                                                                        \
    if (!::weightcast::test::have_mpirun()) {                                                 \
      WARN("skipped: this build has no MPI or mpirun is not on PATH (scripts/install-deps.sh)"); \
      return;                                                                                 \
    }                                                                                         \
  } while (0)
