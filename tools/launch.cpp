// `weightcast launch -n N [CONFIG]`: starts N ranks of `weightcast run` — under mpirun for the
// mpi transport, else as local processes with torchrun's environment — and makes sure that
// when one rank fails the others end too and nothing is left behind.
#include "commands.hpp"
#include "test_hooks.hpp"

#include "weightcast/config/config.hpp"
#include "weightcast/core/detail/exec_image.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/core/log.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include <fmt/core.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <string>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace weightcast::cli {
namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_signal(int sig) { g_signal = sig; }

// How long the other ranks get to end on their own once one has failed: they learn of it over
// the control plane within milliseconds and print the job's message; only then SIGTERM.
constexpr std::chrono::milliseconds settle_time{3000};

std::string self_exe() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw system_error(Errc::internal, errno, "readlink(/proc/self/exe)");
  return std::string(path, static_cast<std::size_t>(n));
}

std::string random_token() {
  unsigned char bytes[16];
  if (::getrandom(bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
    throw system_error(Errc::internal, errno, "getrandom (job token)");
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

// Where execvp would find @p name: the first regular, executable file of that name in a
// directory of PATH (unset: glibc's default "/bin:/usr/bin"; an empty entry is the current
// directory); nullopt when there is none.
std::optional<std::string> find_on_path(const std::string& name) {
  const char* env = std::getenv("PATH");
  const std::string path = env != nullptr ? env : "/bin:/usr/bin";
  std::size_t begin = 0;
  while (begin <= path.size()) {
    std::size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = path.substr(begin, end - begin);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    begin = end + 1;
  }
  return std::nullopt;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return fmt::format("was killed by signal {} ({})", sig, ::strsignal(sig));
  }
  return fmt::format("exited with status {}", WEXITSTATUS(status));
}

/// The ranks (or mpirun): one process group; every member is ended and reaped on
/// destruction, whatever happened.
class ChildGroup {
 public:
  ChildGroup() = default;
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    if (_pgid > 0 && running() > 0) {
      signal_all(SIGKILL);
      while (running() > 0) reap(true);
    }
  }

  /// Starts @p argv with @p env added; @p label names it in messages ("rank 2", "mpirun").
  /// @p program is the file to run (default argv[0], searched on PATH).
  /// @throws Error `unavailable` (69) when it cannot be started (fork, or exec: the reason).
  void spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
             std::string label, std::string program = {}) {
    const detail::ExecImage image(argv, env);  // before fork: the child only execs
    if (program.empty()) program = argv.at(0);
    // A failed exec sends its errno back on this pipe; a successful one closes it (O_CLOEXEC),
    // so the launcher says why it could not start the child rather than report a status 127
    // as if the child had run.
    int exec_error[2];
    if (::pipe2(exec_error, O_CLOEXEC) != 0) {
      throw system_error(Errc::unavailable, errno, "pipe (to start " + label + ")");
    }

    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      ::close(exec_error[0]);
      ::close(exec_error[1]);
      throw system_error(Errc::unavailable, err, "fork (to start " + label + ")");
    }
    if (pid == 0) {
      ::close(exec_error[0]);
      ::setpgid(0, _pgid);  // the first child founds the group
      // If the launcher itself is killed, the ranks must not live on.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      ::execvpe(program.c_str(), image.argv(), image.envp());
      const int err = errno;
      [[maybe_unused]] const ssize_t sent = ::write(exec_error[1], &err, sizeof err);
      ::_exit(127);
    }
    ::close(exec_error[1]);
    ::setpgid(pid, _pgid);  // also here: whichever of parent and child runs first
    int err = 0;
    ssize_t got = 0;
    do {
      got = ::read(exec_error[0], &err, sizeof err);
    } while (got < 0 && errno == EINTR);
    ::close(exec_error[0]);
    if (got == static_cast<ssize_t>(sizeof err)) {
      int status = 0;
      ::waitpid(pid, &status, 0);  // not one of the group: it never ran
      throw system_error(Errc::unavailable, err,
                         fmt::format("cannot start {} ({})", label, program));
    }
    if (_pgid == 0) _pgid = pid;
    _children.push_back(Child{pid, std::move(label), std::nullopt});
  }

  /// Reaps what has ended; @p block waits (100 ms at most) for one.
  void reap(bool block) {
    if (block) {
      for (int i = 0; i < 20 && !reap_once(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return;
    }
    while (reap_once()) {
    }
  }

  [[nodiscard]] int running() const {
    int n = 0;
    for (const auto& c : _children) n += c.status ? 0 : 1;
    return n;
  }

  void signal_all(int sig) {
    _signalled = true;
    if (_pgid > 0) ::kill(-_pgid, sig);
  }

  /// The first child that failed, in the order they ended.
  [[nodiscard]] const std::optional<std::pair<std::string, int>>& first_failure() const {
    return _first_failure;
  }
  [[nodiscard]] pid_t pid_of(const std::string& label) const {
    for (const auto& c : _children) {
      if (c.label == label) return c.pid;
    }
    return -1;
  }

 private:
  struct Child {
    pid_t pid;
    std::string label;
    std::optional<int> status;
  };

  bool reap_once() {
    int status = 0;
    const pid_t pid = ::waitpid(-_pgid, &status, WNOHANG);
    if (pid <= 0) return false;
    for (auto& c : _children) {
      if (c.pid != pid) continue;
      c.status = status;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      // The cause is the first failure; but a rank killed by a signal (before we sent any)
      // is the cause of the others' non-zero exits even when wait() reports them first
      // (several zombies come back oldest child first, not in the order they died).
      const bool signal_death = WIFSIGNALED(status) && !_signalled;
      if (failed && (!_first_failure ||
                     (signal_death && !WIFSIGNALED(_first_failure->second)))) {
        _first_failure.emplace(c.label, status);
      }
      spdlog::debug("{} (pid {}) {}", c.label, pid, describe_status(status));
    }
    return true;
  }

  pid_t _pgid = 0;
  bool _signalled = false;  // we have signalled the group: later signal deaths are ours
  std::vector<Child> _children;
  std::optional<std::pair<std::string, int>> _first_failure;
};

// Refuses, before any rank starts, what every rank would refuse or fail at: otherwise N ranks
// each print the same error (or mpi's world-size mismatch) after starting up.
void check_launch(const LaunchArgs& args, const Config& config, bool mpirun) {
  const std::string& trace = args.trace_path.empty() ? config.trace : args.trace_path;
  check_distinct_outputs(args.report_path, trace, args.ranks);
  if (args.ranks == 1) {  // a world of one: only what `run` alone refuses
    check_world_of_one(config);
    return;
  }
  check_environment_token(config);
  check_destination(config.destination, args.ranks);
  WEIGHTCAST_EXPECT(config.world_rank < 0 && config.world_size == 0, Errc::config,
                    fmt::format("world.rank/world.size: set in the config, so all {} ranks "
                                "would take the same place; launch gives each rank its own "
                                "(remove the world keys)",
                                args.ranks));
  // The same for the rank on its host, which picks each rank's GPU: all would take one.
  WEIGHTCAST_EXPECT(config.world_local_rank < 0, Errc::config,
                    fmt::format("world.local_rank: set in the config, so all {} ranks would "
                                "take the same GPU; launch gives each rank its own (remove "
                                "the key)",
                                args.ranks));
  // Whether the ranks' arena is host memory: known for device host and cuda, and for auto
  // when the ranks run on this machine (the local spawner) and see the GPUs this process sees.
  std::optional<bool> host_device;
  if (config.device == DeviceKind::host) host_device = true;
  if (config.device == DeviceKind::cuda) host_device = false;
  if (config.device == DeviceKind::automatic && !mpirun) host_device = cuda_device_count() == 0;
  if (!host_device) {  // device auto on mpirun's hosts: only what fails on any device
    if (config.transport == TransportKind::local) {
      transport_for_world(config, true, args.ranks, mpirun);
    }
    return;
  }
  // Throws for local, mpi or tcp on a GPU, nccl on host memory: what each rank would say.
  // Ranks that mpirun starts are in an MPI world (auto picks mpi there); the local spawner's
  // are not (auto picks tcp).
  const TransportKind kind = transport_for_world(config, *host_device, args.ranks, mpirun);
  if (!mpirun && kind == TransportKind::mpi && !test_hooks::local_spawner_allows_mpi()) {
    throw Error(Errc::config,
                fmt::format("launch --spawner {}: transport {} needs its ranks started by mpirun "
                            "(MPI joins them), but the local spawner starts them as plain "
                            "processes; use --spawner mpirun (or auto), or transport: tcp "
                            "(host memory, no MPI) or nccl",
                            args.spawner, "mpi"));
  }
}

bool use_mpirun(const LaunchArgs& args, const Config& config) {
  if (args.spawner != "auto") return args.spawner == "mpirun";
  switch (config.transport) {
    case TransportKind::mpi: return true;
    case TransportKind::nccl:
    case TransportKind::tcp:
    case TransportKind::shm:
    case TransportKind::local: return false;
    case TransportKind::automatic:
      // On host memory mpirun's ranks pick mpi and plain processes tcp: mpirun where the
      // build has MPI, else the local spawner (tcp needs nothing else). nccl on a GPU.
      if (config.device == DeviceKind::cuda) return false;
      if (!mpi_compiled_in()) return false;
      if (config.device == DeviceKind::host) return true;
      return cuda_device_count() == 0;
  }
  return true;
}

}  // namespace

int launch(const LaunchArgs& args) {
  const Config config = load_config(args.config_path, args.overrides);
  configure_log(args.quiet ? LogLevel::error : config.log_level);
  const bool mpirun = use_mpirun(args, config);
  check_launch(args, config, mpirun);
  // The ranks' output goes to this stdout; mpirun drops its own write errors, so output lost
  // to a full disk would end the job with status 0.
  check_stdout_writable();
  // Before anything starts: without mpirun, the child's failed exec would otherwise be
  // reported as "mpirun exited with status 127" once the job had ended.
  std::optional<std::string> mpirun_exe;
  if (mpirun) {
    mpirun_exe = find_on_path("mpirun");
    if (!mpirun_exe) {
      throw Error(Errc::unavailable,
                  "mpirun not found on PATH (install Open MPI: scripts/install-deps.sh, or use "
                  "--spawner local with transport nccl)");
    }
  }

  // One job token for all ranks, unless the user chose one: a stray rank of another job on
  // the same port is then refused rather than mixed in.
  std::vector<std::string> env;
  if (config.rendezvous_token.empty()) {
    const char* token = std::getenv("WEIGHTCAST_TOKEN");
    env.push_back("WEIGHTCAST_TOKEN=" + (token != nullptr ? std::string(token) : random_token()));
  }

  std::vector<std::string> run_argv{self_exe(), "run"};
  if (!args.config_path.empty()) run_argv.push_back(args.config_path);
  for (const auto& o : args.overrides) {
    run_argv.push_back("--set");
    run_argv.push_back(o);
  }
  if (!args.report_path.empty()) {
    run_argv.push_back("--report");
    run_argv.push_back(args.report_path);
  }
  if (!args.trace_path.empty()) {
    run_argv.push_back("--trace");
    run_argv.push_back(args.trace_path);
  }
  if (args.quiet) run_argv.emplace_back("--quiet");
  if (args.json) run_argv.emplace_back("--json");

  // The ranks' world is launch's to give. Variables a surrounding launcher left in this
  // environment (an sbatch step's SLURM_PROCID and SLURM_NTASKS, a torchrun job's RANK) would
  // reach every rank and give it another world (world.cpp reads them before Open MPI's).
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                           "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS",
                           "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK"}) {
    if (const char* value = std::getenv(name)) {
      spdlog::info("launch: not passing {}={} to the ranks: launch gives them their world", name,
                   value);
      ::unsetenv(name);
    }
  }

  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  ChildGroup group;
  if (mpirun) {
    // argv[0] stays "mpirun": Open MPI reads an absolute one as --prefix.
    std::vector<std::string> argv{"mpirun", "-np", std::to_string(args.ranks), "--oversubscribe"};
    if (::geteuid() == 0) argv.push_back("--allow-run-as-root");
    argv.insert(argv.end(), {"-x", "WEIGHTCAST_TOKEN"});
    argv.insert(argv.end(), run_argv.begin(), run_argv.end());
    if (config.rendezvous_token.empty()) ::setenv("WEIGHTCAST_TOKEN", env[0].c_str() + 17, 1);
    spdlog::info("launch: {} rank{} under mpirun", args.ranks, args.ranks == 1 ? "" : "s");
    group.spawn(argv, env, "mpirun", *mpirun_exe);
  } else {
    const char* port = std::getenv("MASTER_PORT");
    spdlog::info("launch: {} local rank{}", args.ranks, args.ranks == 1 ? "" : "s");
    for (int r = 0; r < args.ranks; ++r) {
      auto rank_env = env;
      rank_env.insert(rank_env.end(),
                      {fmt::format("RANK={}", r), fmt::format("WORLD_SIZE={}", args.ranks),
                       fmt::format("LOCAL_RANK={}", r),
                       fmt::format("LOCAL_WORLD_SIZE={}", args.ranks), "MASTER_ADDR=127.0.0.1",
                       fmt::format("MASTER_PORT={}", port != nullptr ? port : "29500")});
      group.spawn(run_argv, rank_env, fmt::format("rank {}", r));
    }
  }

  // Wait; once one process fails (or we are told to stop), give the rest a moment to end on
  // their own, then SIGTERM (and SIGCONT, so a stopped one acts on it), then SIGKILL.
  std::optional<Clock::time_point> failed_at;
  std::optional<Clock::time_point> terminated_at;
  bool failed_before_signal = false;  // a rank's own failure, not one our SIGTERM caused
  while (group.running() > 0) {
    group.reap(true);
    const auto now = Clock::now();
    if (!failed_at && (group.first_failure() || g_signal != 0)) {
      failed_at = now;
      failed_before_signal = group.first_failure().has_value() && g_signal == 0;
    }
    if (failed_at && !terminated_at && (g_signal != 0 || now - *failed_at >= settle_time)) {
      if (group.running() > 0) {
        spdlog::debug("launch: ending {} remaining process(es) with SIGTERM", group.running());
      }
      group.signal_all(SIGTERM);
      group.signal_all(SIGCONT);
      terminated_at = now;
    }
    if (terminated_at && now - *terminated_at >= std::chrono::duration<double>(args.grace_s)) {
      group.signal_all(SIGKILL);
    }
  }

  // Interrupted (Ctrl-C, a scheduler's SIGTERM): the ranks' non-zero exits are our SIGTERM's
  // doing, so the status is the shell's 128 + signal, as if launch itself had been killed.
  if (g_signal != 0 && !failed_before_signal) {
    const int sig = g_signal;
    std::fflush(stdout);
    eprint("weightcast launch: interrupted by {}: ranks ended\n",
               sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : ::strsignal(sig));
    return 128 + sig;
  }
  if (const auto& failure = group.first_failure()) {
    const auto& [label, status] = *failure;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : exit_status(Errc::unavailable);
    std::string how = describe_status(status);
    // SIGPIPE: the output the ranks share (launch's stdout) lost its reader, as `run` reports
    // a failed write to stdout: 74, rather than a rank that died (69) with no message above.
    const bool lost_stdout = WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE;
    if (lost_stdout) {
      code = exit_status(Errc::io);
      how += ": stdout was closed by its reader, so the ranks' output was lost";
    }
    // mpirun exits 128 + N when it ended the job because a rank was killed by signal N: a
    // signal death is 69, as with the local spawner, and the line says so. But 130 and 143
    // are also what every rank exits with when one was interrupted by SIGINT or SIGTERM
    // (tools/interrupt.hpp): the job's status stays that, as with the local spawner.
    if (mpirun && WIFEXITED(status) && code > 128 && code < 128 + NSIG) {
      const int sig = code - 128;
      if (sig == SIGINT || sig == SIGTERM) {
        how += fmt::format(": a rank was interrupted by {}", sig == SIGINT ? "SIGINT" : "SIGTERM");
      } else {
        how += fmt::format(": a rank was killed by signal {} ({})", sig, ::strsignal(sig));
        code = exit_status(Errc::unavailable);
      }
    }
    // The local ranks: the first to exit need not be the one that failed (rank 0 ends as
    // soon as it has passed on another rank's ABORT); the ranks' messages name that one.
    if (!mpirun && WIFEXITED(status)) {
      how = fmt::format("exited first, with status {} (the ranks' messages above say which "
                        "failed and why)",
                        code);
    }
    std::fflush(stdout);
    eprint("weightcast launch: {} {}{}\n", label, how,
           lost_stdout ? "" : mpirun ? " (see the ranks' messages above)" : "; ended the other ranks");
    return code;
  }
  return 0;
}

}  // namespace weightcast::cli
