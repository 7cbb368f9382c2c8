// The job thread: the one thread of the module's own that every job on several ranks (and
// MPI) runs on, and run_interruptible, which runs a load off the calling thread so that
// Ctrl-C reaches it.
//
// Why a load runs on a thread of its own: the calling thread then waits with the GIL
// released and wakes every 50 ms to run Python's signal handlers (PyErr_CheckSignals), so
// Ctrl-C requests LoadOptions::stop and the load ends within moments; a blocking call in the
// main thread would not see SIGINT until it returned. Jobs all run on one such thread
// (JobThread), the one MPI is initialised on.
#pragma once

#include "weightcast/core/error.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include <nanobind/nanobind.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>

namespace weightcast::python {

namespace nb = nanobind;

// Every job (run_job) runs on this one thread of the module's own, for the life of the
// process. MPI, once weightcast initialises it, stays initialised until the interpreter
// exits (a process may initialise MPI once only, MPI 4.0 §11.2.1, so a job of its own that
// finalised it would leave a second load unable to start); it is initialised at
// MPI_THREAD_FUNNELED (MpiSession), so every later MPI call must come from the thread that
// initialised it: this one. `shutdown` (atexit) finalises MPI here and joins the thread.
class JobThread {
 public:
  static JobThread& get() {
    static JobThread* thread = new JobThread;  // never destroyed: shutdown() joins it
    return *thread;
  }

  template <class Work>
  auto submit(Work work) -> std::future<decltype(work())> {
    using Result = decltype(work());
    auto task = std::make_shared<std::packaged_task<Result()>>(std::move(work));
    std::future<Result> done = task->get_future();
    {
      std::lock_guard lock(_mutex);
      if (_closed) throw Error(Errc::unavailable, "weightcast: the interpreter is exiting");
      if (!_thread.joinable()) _thread = std::thread([this] { serve(); });
      _queue.emplace_back([task] { (*task)(); });
    }
    _changed.notify_one();
    return done;
  }

  /// Finalises MPI if weightcast initialised it (on this thread), then ends the thread.
  void shutdown() {
    {
      std::lock_guard lock(_mutex);
      if (_closed) return;
      if (_thread.joinable()) {
        _queue.emplace_back([this] {
          // A broadcast left in flight by a failed job: MPI_Finalize would wait for it
          // forever; make no MPI call (the process is ending anyway).
          if (mpi && mpi_suspect) mpi->abandon();
          mpi.reset();
        });
      }
      _closed = true;
    }
    _changed.notify_one();
    if (_thread.joinable()) _thread.join();
  }

  /// In a child made by fork(): the thread was not copied, and the parent's MPI is not the
  /// child's to use (MPI 4.0 leaves fork undefined). The state is forgotten, not destroyed:
  /// joining or finalising what the parent owns would hang the child.
  void after_fork_in_child() noexcept {
    new (&_mutex) std::mutex;
    new (&_changed) std::condition_variable;
    if (_thread.joinable()) new (&_thread) std::thread;  // the parent's; leaked, not joined
    _queue.clear();
    (void)mpi.release();
    forked = true;
  }

  // Used on the job thread only.
  std::unique_ptr<MpiSession> mpi;
  bool mpi_suspect = false;  // a job failed after its broadcasts may have started
  bool forked = false;       // this process is a fork of one that may have used MPI

 private:
  void serve() {
    for (;;) {
      std::function<void()> next;
      {
        std::unique_lock lock(_mutex);
        _changed.wait(lock, [this] { return !_queue.empty() || _closed; });
        if (_queue.empty()) return;
        next = std::move(_queue.front());
        _queue.pop_front();
      }
      next();
    }
  }

  std::mutex _mutex;
  std::condition_variable _changed;
  std::deque<std::function<void()>> _queue;
  bool _closed = false;
  std::thread _thread;
};

/// Runs @p work on a thread of its own while this thread waits with the GIL released,
/// running Python's signal handlers every 50 ms. A handler that raises (Ctrl-C's
/// KeyboardInterrupt) requests a stop and re-raises here once the load has ended.
/// With @p on_job_thread, the work runs on the JobThread instead of a thread of its own.
/// @p keyboard_interrupt, when given, is set before the stop when the handler raised
/// KeyboardInterrupt (SIGINT's), for the work's message. @p cancel, when given, is read at
/// the same 50 ms beat: once set (LoadHandle.cancel(), from any thread) the stop is
/// requested too. A load started off the main thread (`load_async`'s) needs it: Python runs
/// signal handlers on the main thread only, so PyErr_CheckSignals never raises there.
template <class Work>
auto run_interruptible(Work work, bool on_job_thread = false,
                       std::atomic<bool>* keyboard_interrupt = nullptr,
                       const std::atomic<bool>* cancel = nullptr) {
  std::stop_source stop;
  std::optional<nb::python_error> raised;
  using Result = decltype(work(stop.get_token()));
  std::future<Result> done;
  {
    nb::gil_scoped_release release;
    auto run = [&work, token = stop.get_token()] { return work(token); };
    done = on_job_thread ? JobThread::get().submit(run) : std::async(std::launch::async, run);
    while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      nb::gil_scoped_acquire acquire;
      if (!raised && PyErr_CheckSignals() != 0) {
        raised.emplace();  // fetches the handler's exception
        if (keyboard_interrupt != nullptr && raised->matches(PyExc_KeyboardInterrupt)) {
          keyboard_interrupt->store(true);
        }
        stop.request_stop();
      }
      if (cancel != nullptr && cancel->load() && !stop.stop_requested()) stop.request_stop();
    }
  }
  if (raised) throw std::move(*raised);
  return done.get();
}

}  // namespace weightcast::python
