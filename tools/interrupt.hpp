// `weightcast run` on SIGINT (Ctrl-C) and SIGTERM (a scheduler, `kill`): the load stops, the
// trace is written, every rank ends with one message and status 128 + signal. `weightcast
// synth` likewise: the write stops and its temporary files are removed.
#pragma once

#include "weightcast/core/error.hpp"

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <stop_token>
#include <thread>

namespace weightcast {
class ControlPlane;
}

namespace weightcast::cli {

/**
 * @brief SIGINT and SIGTERM for `weightcast run` and `weightcast synth`, taken by a thread
 *        of its own rather than a signal handler: the signals are blocked in every thread and
 *        the waiting thread receives them with `sigwaitinfo`, so what it does next (lock,
 *        print, send an ABORT) need not be async-signal-safe.
 *
 * On the first signal:
 * - during the load (a `LoadScope` lives), it requests a stop on `stop_token()`: the load ends
 *   within milliseconds and its caller reports `interrupted_error` as any failed load (trace
 *   written, ABORT sent, status 128 + signal). If the load has not ended `stop_grace` later,
 *   the thread ends the process as below.
 * - otherwise it ends the process itself: an ABORT over the attached control plane, the line
 *   `weightcast: error: [rank R: ]interrupted by SIGTERM`, status 128 + signal.
 *
 * From then on SIGINT and SIGTERM take their default action, so a second one ends the process
 * at once. A first one while the control plane is already ending the process (an ABORT from
 * another rank, or a launcher tearing a failed job down) prints nothing and lets that ending
 * finish (its load stopped, its trace written, the job's status), for at most
 * `ending_grace`. A signal ignored when the process started (`nohup`, a shell's background
 * job) stays ignored.
 */
class InterruptHandler {
 public:
  /// How long a load may take to stop before the waiting thread ends the process itself.
  static constexpr std::chrono::seconds stop_grace{2};
  /// How long a signal waits for an ending already under way (the control plane's: at most
  /// a second for the trace, then the exit) before it takes its default action.
  static constexpr std::chrono::seconds ending_grace{3};

  /// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread started after
  /// it: construct it before any other thread starts. Starts the waiting thread.
  InterruptHandler();
  /// Stops the waiting thread and restores the signal mask (a signal that arrived since then
  /// takes its default action).
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

  /// Names @p rank ("rank R: ") in the message of an interrupt outside the load.
  void set_rank(int rank);
  /// Sends the ABORT of an interrupt outside the load over @p control; nullptr detaches (do
  /// so before @p control is destroyed: this waits while the thread uses it).
  void attach(ControlPlane* control);

  /// This process has failed and printed why, and is about to exit with @p status (a rank
  /// lingers a moment first, so mpirun forwards its message): from now on a signal (mpirun
  /// ending the failed job) ends the process at once with @p status and no second message.
  void failing(int status);

  /// Another rank is ending the job: stops the load in progress, if any, as an interrupt
  /// does, and waits at most @p most until the load's caller calls `load_finished` (its
  /// trace written). Returns at once when no load is in progress.
  void stop_load_and_wait(std::chrono::milliseconds most);
  /// The load and what follows it at once (the trace) are done: `stop_load_and_wait` returns.
  void load_finished();

  /// @return the token to pass as `LoadOptions::stop` inside a `LoadScope`.
  [[nodiscard]] std::stop_token stop_token() const noexcept { return _stop.get_token(); }

  /// While one lives, an interrupt stops the load (`stop_token()`) instead of ending the
  /// process; the caller then reports it. `synth` puts its write in one the same way.
  class LoadScope {
   public:
    /// @p during names the work in the message of a process ended because it did not stop
    /// within `stop_grace` ("interrupted by SIGTERM" + @p during + ", which did not stop
    /// ..."); a string literal, as it outlives the scope.
    explicit LoadScope(InterruptHandler& handler, const char* during = " during the load");
    ~LoadScope() { end(); }
    LoadScope(const LoadScope&) = delete;
    LoadScope& operator=(const LoadScope&) = delete;
    /// Ends the scope (later calls do nothing). @return the signal that arrived during it, 0
    /// if none.
    int end();

   private:
    InterruptHandler* _handler;
  };

 private:
  void watch();
  [[noreturn]] void end_process(int sig, const char* when);

  sigset_t _signals{};   // those watched: SIGINT and SIGTERM, unless ignored at start
  sigset_t _old_mask{};  // the calling thread's mask before
  int _wake_signal = 0;  // one of _signals: the destructor's wake-up for the thread
  std::stop_source _stop;
  std::mutex _mutex;
  std::condition_variable _changed;
  int _signal = 0;          // the first signal taken, 0 before
  int _signal_in_load = 0;  // the same, when it came during a LoadScope
  bool _in_load = false;
  const char* _during = "";     // the LoadScope's, for the message when it does not stop
  bool _load_started = false;   // a LoadScope was made
  bool _load_finished = false;  // load_finished() was called
  bool _closing = false;
  int _rank = -1;
  int _failing_status = -1;  // set by failing()
  ControlPlane* _control = nullptr;
  std::thread _thread;  // last: starts after the members it uses exist
};

/// @return the error of an interrupt by @p sig (SIGINT or SIGTERM), status 128 + @p sig:
///         "interrupted by SIGTERM" followed by @p when (e.g. " during the load").
[[nodiscard]] Error interrupted_error(int sig, const char* when = "");

}  // namespace weightcast::cli
