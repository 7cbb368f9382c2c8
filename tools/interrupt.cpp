#include "interrupt.hpp"

#include "commands.hpp"

#include "weightcast/control/control_plane.hpp"
#include "weightcast/core/log.hpp"

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <unistd.h>

namespace weightcast::cli {

namespace {
// How long end_process waits for the control plane's reader, once stopped, to return
// (ControlPlane::stop_reader), so that no thread is left unjoined at the exit.
constexpr std::chrono::milliseconds reader_stop_most{500};
}  // namespace

Error interrupted_error(int sig, const char* when) {
  const char* name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : ::strsignal(sig);
  // Only SIGINT and SIGTERM are taken (InterruptHandler).
  const Errc code = sig == SIGINT ? Errc::interrupted : Errc::terminated;
  return Error(code, fmt::format("interrupted by {}{}", name, when));
}

InterruptHandler::InterruptHandler() {
  sigemptyset(&_signals);
  for (const int sig : {SIGTERM, SIGINT}) {
    struct sigaction action {};
    // Ignored from the start (nohup; a non-interactive shell's background job ignores
    // SIGINT): leave it so. Blocked, Linux would queue it for sigwaitinfo all the same.
    if (::sigaction(sig, nullptr, &action) == 0 && action.sa_handler == SIG_IGN) continue;
    sigaddset(&_signals, sig);
    if (_wake_signal == 0) _wake_signal = sig;
  }
  if (_wake_signal == 0) return;
  ::pthread_sigmask(SIG_BLOCK, &_signals, &_old_mask);
  _thread = std::thread([this] { watch(); });
}

InterruptHandler::~InterruptHandler() {
  if (!_thread.joinable()) return;
  {
    std::lock_guard lock(_mutex);
    _closing = true;
    // Still waiting for a first signal, with the signals blocked: wake it with one aimed at
    // it alone. (After a first signal it waits on _changed with them unblocked.)
    if (_signal == 0) ::pthread_kill(_thread.native_handle(), _wake_signal);
  }
  _changed.notify_all();
  _thread.join();
  // A failing rank leaves SIGINT and SIGTERM blocked until it exits: the launcher's SIGTERM
  // (mpirun ends every rank once one fails) may arrive now, as the watcher is gone, and would
  // end the process with 143 instead of the failure's status that its message already gave.
  if (_failing_status >= 0) return;
  ::pthread_sigmask(SIG_SETMASK, &_old_mask, nullptr);
}

void InterruptHandler::set_rank(int rank) {
  std::lock_guard lock(_mutex);
  _rank = rank;
}

void InterruptHandler::stop_load_and_wait(std::chrono::milliseconds most) {
  std::unique_lock lock(_mutex);
  if (!_load_started || _load_finished) return;
  _stop.request_stop();
  _changed.wait_for(lock, most, [this] { return _load_finished; });
}

void InterruptHandler::load_finished() {
  {
    std::lock_guard lock(_mutex);
    _load_finished = true;
  }
  _changed.notify_all();
}

void InterruptHandler::failing(int status) {
  std::lock_guard lock(_mutex);
  _failing_status = status;
}

void InterruptHandler::attach(ControlPlane* control) {
  std::lock_guard lock(_mutex);
  _control = control;
}

InterruptHandler::LoadScope::LoadScope(InterruptHandler& handler, const char* during)
    : _handler(&handler) {
  std::lock_guard lock(_handler->_mutex);
  _handler->_in_load = true;
  _handler->_during = during;
  _handler->_load_started = true;
}

int InterruptHandler::LoadScope::end() {
  if (_handler == nullptr) return 0;
  int sig = 0;
  {
    std::lock_guard lock(_handler->_mutex);
    _handler->_in_load = false;
    sig = _handler->_signal_in_load;
  }
  _handler->_changed.notify_all();
  _handler = nullptr;
  return sig;
}

void InterruptHandler::watch() {
  siginfo_t info{};
  int sig = -1;
  while (sig < 0) sig = ::sigwaitinfo(&_signals, &info);  // < 0: EINTR
  std::unique_lock lock(_mutex);
  if (_closing) return;  // the destructor's wake-up (or a signal just as `run` returns)
  if (_failing_status >= 0) {
    // This rank's own failure is printed: the signal (mpirun tearing the failed job down)
    // says nothing new, and a second line would read as the cause; nor is it this rank's
    // status (`_signal` stays unset). The failure is printed as soon as it is known, which
    // may be before the job's ending has written its trace: that ending is waited for, as
    // below, then the process ends with the failure's status.
    const auto end_failing = [this] {
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(_failing_status);
    };
    if (_control != nullptr && _control->ending()) {
      ::pthread_sigmask(SIG_UNBLOCK, &_signals, nullptr);  // a second signal ends it at once
      if (!_changed.wait_for(lock, ending_grace, [this] { return _closing; })) end_failing();
      return;
    }
    end_failing();
  }
  _signal = sig;
  // From now on this thread takes SIGINT and SIGTERM with their default action (no other
  // thread has them unblocked): a second one ends the process at once.
  ::pthread_sigmask(SIG_UNBLOCK, &_signals, nullptr);
  if (_control != nullptr && _control->ending()) {
    // Another rank's ABORT (or this rank's own failure) is already ending the process, and
    // a launcher ends a failed job's ranks with SIGTERM: no second message, and no exit
    // before that ending's own, which first stops the load to write its trace (ending it
    // here lost the trace of every rank the launcher's SIGTERM reached first). Bounded: past
    // ending_grace the signal takes its default action; a second one does at once.
    if (!_changed.wait_for(lock, ending_grace, [this] { return _closing; })) {
      lock.unlock();
      ::raise(sig);
      ::_exit(128 + sig);
    }
    return;
  }
  if (_in_load) {
    _signal_in_load = sig;
    spdlog::debug("{}: stopping the load", interrupted_error(sig).what());
    _stop.request_stop();
    if (!_changed.wait_for(lock, stop_grace, [this] { return !_in_load || _closing; })) {
      end_process(sig, fmt::format("{}, which did not stop within {} s", _during,
                                   stop_grace.count())
                           .c_str());
    }
    _changed.wait(lock, [this] { return _closing; });
    return;
  }
  // Before this rank's control plane is up, a failure elsewhere reaches it only as mpirun's
  // SIGTERM (mpirun, or its daemon, is the parent of every rank it starts): say so, lest the
  // line read as the cause.
  const bool from_mpirun = info.si_code == SI_USER && info.si_pid == ::getppid() &&
                           std::getenv("OMPI_COMM_WORLD_RANK") != nullptr;
  end_process(sig, from_mpirun ? " from mpirun (it ends every rank this way once one has "
                                 "failed: an earlier error says why, if there is one)"
                               : "");
}

void InterruptHandler::end_process(int sig, const char* when) {
  // Called with _mutex held: attach(nullptr) waits, so the control plane stays alive.
  Error error = interrupted_error(sig, when);
  if (_rank >= 0) error = Error(error.code(), fmt::format("rank {}: {}", _rank, error.what()));
  if (_control != nullptr) _control->abort(error);
  std::fflush(stdout);
  eprint("weightcast: error: {}\n", printable(error.what()));
  std::fflush(stderr);
  // As run_ranks does after its message: mpirun drops output it has not forwarded when it
  // tears the job down on the first non-zero exit.
  if (_control != nullptr) {
    _control->linger(std::chrono::milliseconds(2'000));  // rank 0 takes the ABORT first
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _control->stop_reader(reader_stop_most);
  }
  ::_exit(exit_status(error.code()));
}

}  // namespace weightcast::cli
