// The coroutine form of run_job (weightcast/distributed/asio.hpp): the job on a thread of its own, its
// result delivered on the awaiting coroutine's executor.
#include "weightcast/distributed/asio.hpp"

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <exception>
#include <thread>
#include <utility>

namespace weightcast {

namespace asio = boost::asio;

asio::awaitable<JobResult> async_run_job(JobOptions options) {
  auto initiate = [](auto handler, JobOptions job) {
    // The work guard keeps the executor's io_context running until the result is posted, so
    // the thread never posts to a context that has returned (or been destroyed).
    auto work = asio::make_work_guard(asio::get_associated_executor(handler));
    std::thread([handler = std::move(handler), work = std::move(work),
                 job = std::move(job)]() mutable {
      std::exception_ptr failure;
      JobResult result;
      try {
        result = run_job(job);
      } catch (...) {
        failure = std::current_exception();
      }
      auto executor = work.get_executor();
      asio::post(executor, [handler = std::move(handler), failure,
                            result = std::move(result)]() mutable {
        std::move(handler)(failure, std::move(result));
      });
      work.reset();
    }).detach();
  };
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable),
                                          void(std::exception_ptr, JobResult)>(
      initiate, asio::use_awaitable, std::move(options));
}

}  // namespace weightcast
