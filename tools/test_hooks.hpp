// The CLI's test hooks: `WEIGHTCAST_TEST_*` variables by which the test suite acts on a run
// at a known point (pause a rank, slow the load, corrupt a digest). They are read here and
// nowhere else, and only in a build with the test suite (`WEIGHTCAST_BUILD_TESTS` defines
// WEIGHTCAST_TEST_HOOKS for the CLI): in any other build (an install, a package) each
// function below does nothing and no hook's name is in the binary. Not user features. The
// library has no environment hooks: they reach it as LoadOptions callbacks and
// JobOptions::test_hooks, as an embedder's would.
#pragma once

#include "weightcast/distributed/job.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/checkpoint/synth.hpp"

namespace weightcast::cli::test_hooks {

/// The job's seams for rank @p rank (tests/distributed/test_multirank.cpp):
///  - `WEIGHTCAST_TEST_PAUSE_AFTER_CATALOGUE_MS`: rank 0 sleeps this many milliseconds
///    after reading the catalogue and before sending it (and before opening the shards for
///    the load), while the other ranks wait for it; so a test can truncate a shard, kill or
///    stop a peer at a known point;
///  - `WEIGHTCAST_TEST_CORRUPT_DIGEST_RANK`: the rank named reports a wrong XXH3-64 for the
///    first tensor, so that rank 0's verdict finds a mismatch;
///  - `WEIGHTCAST_TEST_STOP_AFTER_VERDICT_RANK`: the rank named stops itself (SIGSTOP) once
///    it has the verdict, before MPI_Finalize: a rank stopped after the verdict must not hold
///    the launcher forever.
/// A value that is not a number (or not a positive one, for the pause) is ignored.
JobTestHooks job(int rank);

/// `WEIGHTCAST_TEST_CHUNK_DELAY_MS` (tests/cli/test_run.cpp, tests/distributed/test_multirank.cpp): every
/// rank sleeps this many milliseconds after each chunk lands, on the loader's thread, so that
/// a test can interrupt a load in progress. Wraps @p options' `on_progress`.
void add_chunk_delay(LoadOptions& options);

/// `WEIGHTCAST_TEST_SYNTH_BLOCK_DELAY_MS` (tests/checkpoint/test_synth.cpp): synth sleeps this many
/// milliseconds after each block it writes, so that a test can interrupt a write in progress.
/// Sets @p options' `on_block`.
void add_block_delay(SynthOptions& options);

/// @return whether `WEIGHTCAST_TEST_LOCAL_SPAWNER_ALLOWS_MPI` is set (tests/distributed/test_multirank.cpp):
///         the local spawner then starts ranks whose data plane would be mpi even so, so that
///         a failure test can run it on a machine without a GPU (the ranks fail over the
///         control plane before they reach the data plane).
bool local_spawner_allows_mpi();

}  // namespace weightcast::cli::test_hooks
