/**
 * @file asio.hpp
 * @brief The coroutine forms of `load` (`async_load`, from weightcast/pipeline/async_load.hpp)
 *        and `run_job` for trainers that already run a Boost.Asio loop.
 *
 * Include only where you use it: Boost.Asio is heavy to compile.
 */
#pragma once

#include "weightcast/distributed/job.hpp"
#include "weightcast/pipeline/async_load.hpp"  // async_load, re-exported for embedders

#include <boost/asio/awaitable.hpp>

namespace weightcast {

/**
 * @brief `run_job(options)` on a thread of its own, awaited without blocking the calling
 *        coroutine's executor: other work on that `io_context` keeps running during the job.
 *
 * The job's steps block (the rendezvous, MPI, the control plane's waits), so they cannot run
 * on the executor's threads; the result (or the error) is delivered on the executor. The job
 * holds work on the executor until it ends: `io_context::run` does not return meanwhile.
 * `options`' hooks run on the job's thread, not the executor's. With MPI initialised by the
 * caller below `MPI_THREAD_SERIALIZED`, use the blocking `run_job` on the thread that
 * initialised MPI instead (the job throws `unavailable` otherwise).
 * @throws Error as `run_job` does (which may end the process instead: `FailurePolicy`).
 */
boost::asio::awaitable<JobResult> async_run_job(JobOptions options);

}  // namespace weightcast
