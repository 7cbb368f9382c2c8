/**
 * @file distributed/detail/job_failure.hpp
 * @brief The job's failure policy at the end of the process (`FailureReport`) and its
 *        watchdog thread (`Watchdog`), with the bounds both keep: job.cpp's `run_job` uses
 *        them (weightcast/distributed/job.hpp, "The failure model").
 */
#pragma once

#include "weightcast/control/control_plane.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/distributed/job.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace weightcast::detail {

// How long the calling thread has to come back once another rank's failure has stopped its
// load (it normally takes milliseconds) before a thread of the job's own ends the process:
// a thread stuck in a call with no timeout (MPI_Init_thread) or in a caller's hook would
// otherwise hold this rank forever. Under a launcher's SIGTERM the CLI waits 3 s
// (InterruptHandler::ending_grace) for the ending to finish: this stays below.
inline constexpr std::chrono::milliseconds unwind_grace{2'000};

// How long a call with no timeout (Watchdog::Blocking) has to return once another rank's
// failure has arrived, before the watchdog ends the process: enough for a collective that
// every rank had entered to complete, within `unwind_grace` and the launcher's grace.
inline constexpr std::chrono::milliseconds blocking_return_most{1'000};

// How long a thread that ends the process waits for the control plane's reader, once
// stopped, to return (ControlPlane::stop_reader): a handler in progress takes microseconds;
// the bound keeps a reader stuck in one (a caller's hook) from holding the exit.
inline constexpr std::chrono::milliseconds reader_stop_most{500};

/// How long a rank other than 0 that sent its ABORT waits for rank 0 to take it
/// (`ControlPlane::linger`) before it ends.
inline std::chrono::milliseconds linger_most(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(2'000));
}

/// How long a rank other than 0 that times out waits for rank 0's diagnosis of the same
/// stall (`ControlPlane::defer_to_root`) before it sends its own.
inline std::chrono::milliseconds root_grace(std::chrono::milliseconds timeout) {
  return std::min(timeout, std::chrono::milliseconds(5'000));
}

// ---- the failure policy's end of the process: the one place under src/ that ends it -----

/// Reports a failure once (`on_failure`), and ends the process where the policy says so.
/// Shared by the calling thread and the job's watchdog thread.
class FailureReport {
 public:
  explicit FailureReport(const JobOptions& options) : _options(options) {}

  /// Calls `on_failure` with @p error, the first time only.
  void report(const Error& error) noexcept;

  /// The documented default policy: `on_failure` (if not yet), `before_exit`, then
  /// `_exit(exit_status(code))`. Neither destructors nor atexit handlers run: another thread
  /// may be inside MPI, or the calling thread stuck in it.
  [[noreturn]] void end_process(const Error& error) noexcept;

 private:
  const JobOptions& _options;
  std::mutex _mutex;
  bool _reported = false;
};

// ---- the job's watchdog ----------------------------------------------------------------

/// A thread of the job's own that ends the process when the calling thread cannot come back:
/// a blocking call with no timeout (MPI_Init_thread, MPI_Comm_dup, MPI_Finalize) that has
/// not returned within the timeout, or a thread that has not unwound `unwind_grace` after
/// another rank's failure stopped its load.
class Watchdog {
  using Clock = std::chrono::steady_clock;

 public:
  Watchdog(ControlPlane& control, FailureReport& failure, int rank)
      : _control(control), _failure(failure), _rank(rank), _thread([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(_mutex);
      _closing = true;
    }
    _changed.notify_all();
    _thread.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// While it lives, the calling thread is in @p what, which takes no timeout: past
  /// @p timeout of the time this process ran, the job ends (every rank, with this rank's
  /// timeout, or rank 0's diagnosis of the same stall).
  class Blocking {
   public:
    Blocking(Watchdog& watchdog, std::chrono::milliseconds timeout, std::string what)
        : _watchdog(watchdog) {
      std::lock_guard lock(_watchdog._mutex);
      _watchdog._blocking = true;
      _watchdog._blocking_timeout = timeout;
      _watchdog._blocking_what = std::move(what);
      _watchdog._blocking_generation++;
      _watchdog._changed.notify_all();
    }
    ~Blocking() {
      {
        std::lock_guard lock(_watchdog._mutex);
        _watchdog._blocking = false;
      }
      _watchdog._changed.notify_all();
    }
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;

   private:
    Watchdog& _watchdog;
  };

  /// The control plane's ending hook (the control plane's thread): another rank's failure; the calling
  /// thread has `unwind_grace` to come back (`unwinding`).
  void remote_failure() noexcept {
    {
      std::lock_guard lock(_mutex);
      if (_remote_since) return;
      _remote_since = Clock::now();
    }
    _changed.notify_all();
  }

  /// The calling thread has come back with the job's failure: nothing is left to watch.
  void unwinding() noexcept {
    {
      std::lock_guard lock(_mutex);
      _unwinding = true;
    }
    _changed.notify_all();
  }

 private:
  void watch();

  // Waits on `_changed` until @p done() holds, at most @p most of the time this process ran.
  template <class Done>
  bool wait_running(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds most,
                    Done done);

  [[noreturn]] void blocked_past_timeout(const std::string& what,
                                         std::chrono::milliseconds timeout);

  ControlPlane& _control;
  FailureReport& _failure;
  int _rank;
  std::mutex _mutex;
  std::condition_variable _changed;
  bool _closing = false;
  bool _unwinding = false;
  std::optional<Clock::time_point> _remote_since;
  bool _blocking = false;
  std::chrono::milliseconds _blocking_timeout{0};
  std::string _blocking_what;
  std::uint64_t _blocking_generation = 0;
  std::thread _thread;  // last: starts after the members it uses exist
};

}  // namespace weightcast::detail
