// weightcast launcher: `run`, `inspect`, `synth`.
#include "commands.hpp"

#include "weightcast/config/config.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/gpu_info.hpp"
#include "weightcast/core/log.hpp"

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <functional>
#include <string>
#include <string_view>
#include <system_error>
#include <unistd.h>

namespace weightcast::cli {
void print_stderr(std::string_view text) noexcept {
  // stderr is unbuffered: one fwrite, its failure ignored (the status says what happened).
  (void)std::fwrite(text.data(), 1, text.size(), stderr);
}
}  // namespace weightcast::cli

namespace {

using weightcast::Errc;
using weightcast::exit_status;
using weightcast::cli::eprint;

// stdout is buffered: a write that fails (a full disk, a closed descriptor) shows as the
// stream's error flag, or as fmt's std::system_error where fmt::print flushes a large text.
bool stdout_failed() { return std::ferror(stdout) != 0; }

int report_stdout_failure(int err) {
  // A flush whose result was ignored took the reason with it; a descriptor that still fails
  // (/dev/full, one not open for writing) gives it again for a write of zero bytes.
  if (err == 0 && ::write(STDOUT_FILENO, "", 0) < 0) err = errno;
  eprint("weightcast: error: cannot write to stdout{}{}\n", err != 0 ? ": " : "",
             err != 0 ? std::strerror(err) : "");
  return exit_status(Errc::io);
}

// Runs the chosen command; its Error becomes the exit status, anything else is a bug (70),
// except a failed write to stdout, which is I/O (74).
int run_command(const std::function<int()>& command) {
  try {
    return command();
  } catch (const weightcast::Error& e) {
    std::fflush(stdout);
    eprint("weightcast: error: {}\n", weightcast::printable(e.what()));
    return exit_status(e.code());
  } catch (const std::system_error& e) {
    if (stdout_failed()) return report_stdout_failure(e.code().value());
    std::fflush(stdout);
    eprint("weightcast: internal error: {}\n", weightcast::printable(e.what()));
    return exit_status(Errc::internal);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    eprint("weightcast: internal error: {}\n", weightcast::printable(e.what()));
    return exit_status(Errc::internal);
  }
}

// Every command ends here: output lost on the way to stdout is a failure, never exit 0. A
// command that failed already keeps its own status (its message said why).
int check_stdout(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !stdout_failed()) return status;
  if (status != 0 && status != exit_status(Errc::internal)) return status;
  return report_stdout_failure(flushed ? 0 : err);
}

// A standard descriptor closed by the caller (`>&-`) is taken by the next open(2): the
// summary would then be written into a report, or a read would meet the config. Hold each
// closed one with /dev/null opened read-only, so writes to it still fail (EBADF), as on the
// closed descriptor, and check_stdout() reports them.
void hold_closed_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int held = ::open("/dev/null", O_RDONLY);
    if (held >= 0 && held != fd) {
      ::dup2(held, fd);
      ::close(held);
    }
  }
}

// A path given on the command line as "" (`--report "$OUT"` with OUT unset) is a mistake, not
// "none": refuse it, rather than run on built-in defaults, write no report, or say
// ": no such file".
CLI::Validator non_empty_path(const std::string& noun) {
  return CLI::Validator(
      [noun](std::string& text) -> std::string {
        return text.empty() ? "the " + noun + " path is empty" : std::string();
      },
      "");
}

// `weightcast inspect big | head -c1`: SIGPIPE killed the process silently (141), where a
// failed write to stdout is 74 with its reason. A handler that does nothing turns the signal
// into EPIPE for the write; unlike SIG_IGN it is not inherited across exec (mpirun, the
// ranks launch starts keep the default). A SIGPIPE the process was started ignoring stays so.
// SIGXFSZ likewise: a write past RLIMIT_FSIZE (`ulimit -f`) killed the process with no word
// (153) and left the report's temporary file; it now fails with EFBIG, 74 and the reason.
void catch_broken_pipe() noexcept {
  for (const int sig : {SIGPIPE, SIGXFSZ}) {
    struct sigaction current {};
    if (::sigaction(sig, nullptr, &current) != 0 || current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = [](int) {};
    ::sigemptyset(&action.sa_mask);
    ::sigaction(sig, &action, nullptr);
  }
}

// Rank 0 keeps every shard open for the whole load (twice where it reads with O_DIRECT), so a
// checkpoint of a few hundred shards passes the common soft limit of 1024 descriptors. Raise
// the soft limit to the hard one, as Go's runtime does for every program; the hard limit is
// the administrator's, and stays.
void raise_open_file_limit() noexcept {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

}  // namespace

int main(int argc, char** argv) {
  hold_closed_standard_descriptors();
  using namespace weightcast;
  raise_open_file_limit();
  catch_broken_pipe();
  CLI::App app{"weightcast: stream a safetensors checkpoint from rank 0 to every rank"};
  app.require_subcommand(1);
  // --version also says what GPU support is compiled in and what this machine offers.
  app.set_version_flag("--version", std::function<std::string()>([] {
    std::string text = "weightcast " WEIGHTCAST_VERSION "\n" + gpu_support_report();
    text.pop_back();  // CLI11 adds the final newline
    return text;
  }));

  cli::RunArgs run_args;
  auto* run = app.add_subcommand("run", "load a checkpoint on this rank, as the config says");
  run->add_option("config", run_args.config_path, "YAML config (default: built-in defaults)")
      ->check(non_empty_path("config"));
  // Each --set takes one value: a vector option would otherwise also take the words after it,
  // the positional config among them (`--set device=host c.yaml`).
  run->add_option("--set", run_args.overrides, "override a config key: key=value (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  run->add_option("--report", run_args.report_path,
                  "write a JSON report (per-tensor XXH3-64 of the delivered bytes)")
      ->check(non_empty_path("report"));
  run->add_option("--trace", run_args.trace_path,
                  "write a Chrome trace-event JSON of the pipeline (open in ui.perfetto.dev)")
      ->check(non_empty_path("trace"));
  run->add_flag("-q,--quiet", run_args.quiet,
                "print only errors and the summary (no config, no progress, no notices)");
  run->add_flag("--json", run_args.json,
                "print the summary as one JSON object on stdout (the config goes to stderr)");

  cli::LaunchArgs launch_args;
  auto* launch = app.add_subcommand(
      "launch", "start N ranks of `weightcast run` (mpirun for mpi, else local processes)");
  launch->add_option("-n,--ranks", launch_args.ranks, "number of ranks")
      ->required()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            // CLI11 alone reads `0x2` as 2 and calls `1.5` out of range: a rank count is a
            // whole decimal number, as world.size is in a config.
            int ranks = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ranks);
            const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
              return c >= '0' && c <= '9';
            });
            if (!digits || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
              return fmt::format("'{}' is not a whole number of ranks (1 to 4096)", text);
            }
            if (ec != std::errc() || ranks < 1 || ranks > 4096) {
              return fmt::format("'{}' is out of range (1 to 4096 ranks)", text);
            }
            return {};
          },
          "N in [1, 4096]"));
  launch->add_option("config", launch_args.config_path, "YAML config for every rank")
      ->check(non_empty_path("config"));
  launch->add_option("--set", launch_args.overrides, "override a config key on every rank")
      ->take_all()
      ->allow_extra_args(false);
  launch->add_option("--report", launch_args.report_path,
                     "JSON report; {rank} in PATH gives one per rank (else rank 0 alone "
                     "writes it)")
      ->check(non_empty_path("report"));
  launch->add_option("--trace", launch_args.trace_path,
                     "per-rank pipeline trace; {rank} in PATH becomes the rank, else rank "
                     "R > 0 inserts .rankR before the extension (t.json: t.rank1.json)")
      ->check(non_empty_path("trace"));
  launch->add_flag("-q,--quiet", launch_args.quiet,
                   "every rank prints only errors and its summary (and launch only errors)");
  launch->add_flag("--json", launch_args.json,
                   "every rank prints its summary as one JSON line on stdout (rank 0's has the "
                   "verdict)");
  std::vector<std::string> spawners;
  for (const Spelling& s : setting::launch_spawner.spellings) spawners.emplace_back(s.name);
  launch->add_option(std::string(setting::launch_spawner.name), launch_args.spawner,
                     std::string(setting::launch_spawner.doc))
      ->check(CLI::IsMember(spawners))
      ->capture_default_str();
  launch->add_option(std::string(setting::launch_grace.name), launch_args.grace_s,
                     std::string(setting::launch_grace.doc))
      ->transform(CLI::Validator(
          [](std::string& text) -> std::string {
            // The config's duration parser: the same spellings as `timeout`, and no hex,
            // exponent, inf or NaN (std::stod took `0x10` as 16 s). A transform, not a check:
            // CLI11 then reads the seconds written back into the text.
            std::chrono::milliseconds grace{};
            try {
              grace = parse_duration(text, "--grace");
            } catch (const Error& e) {
              std::string_view why = e.what();
              if (why.starts_with("--grace: ")) why.remove_prefix(9);  // CLI11 names the option
              // A negative one (-1, -0) is out of --grace's range, not only a duration's.
              if (why.find("out of range") == std::string_view::npos) return std::string(why);
              grace = std::chrono::milliseconds::max();
            }
            if (grace.count() > setting::launch_grace.max) {
              return fmt::format("'{}' is out of range ({} to {} seconds)", text,
                                 setting::launch_grace.min / 1000,
                                 setting::launch_grace.max / 1000);
            }
            text = fmt::format("{}", static_cast<double>(grace.count()) / 1000.0);
            return {};
          },
          fmt::format("{} to {} min", setting::launch_grace.min / 60'000,
                      setting::launch_grace.max / 60'000)))
      ->type_name("DURATION")
      ->capture_default_str();

  cli::InspectArgs inspect_args;
  auto* inspect = app.add_subcommand("inspect", "list and validate a checkpoint's tensors");
  inspect->add_option("path", inspect_args.path, "checkpoint file, directory or index")
      ->required()
      ->check(non_empty_path("checkpoint"));

  cli::SynthArgs synth_args;
  auto* synth = app.add_subcommand("synth", "write a Llama-shaped synthetic checkpoint");
  synth->add_option("out_dir", synth_args.out_dir, "output directory (created)")
      ->required()
      ->check(non_empty_path("output directory"));
  synth->add_option("--params", synth_args.params, "target parameter count, e.g. 125M, 1B, 7B")
      ->capture_default_str();
  synth->add_option("--dtype", synth_args.dtype, "element dtype")->capture_default_str();
  synth->add_option("--shard-size", synth_args.shard_size,
                    "largest shard; larger checkpoints are sharded with an index")
      ->capture_default_str();
  synth->add_option("--seed", synth_args.seed, "seed of the pseudo-random tensor bytes")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return cli::parse_seed(text) ? std::string()
                                         : fmt::format("'{}' is not a whole number from 0 to {}",
                                                       text, UINT64_MAX);
          },
          ""));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForVersion& e) {
    // CLI11 acts on --version as soon as it meets it, so whatever else is on the command
    // line would be ignored without a word: refuse it instead.
    for (int i = 1; i < argc; ++i) {
      if (std::string_view(argv[i]) == "--version") continue;
      eprint(
                 "weightcast: error: --version takes no other arguments, got '{}'; see "
                 "'weightcast --help'\n",
                 printable(argv[i]));
      return exit_status(Errc::usage);
    }
    return check_stdout(app.exit(e));
  } catch (const CLI::ParseError& e) {
    // --help: CLI11 prints it and the status is 0.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      return check_stdout(app.exit(e));
    }
    // Everything else is a usage error, in weightcast's own one-line form (the text quotes
    // the command line: untrusted, so printable).
    const auto chosen = app.get_subcommands();
    const std::string command =
        chosen.empty() ? "weightcast" : "weightcast " + chosen.front()->get_name();
    std::string what = e.what();
    if (chosen.empty()) {
      // CLI11 says only "A subcommand is required", also for `weightcast lod` or `--bogus`.
      constexpr const char* subcommands = "run, launch, inspect or synth";
      const std::string first = argc > 1 ? argv[1] : "";
      what = first.empty()       ? fmt::format("a subcommand is required: {}", subcommands)
             : first[0] == '-' ? fmt::format("unknown option '{}' (before the subcommand: "
                                             "--help, --version)",
                                             first)
                               : fmt::format("'{}' is not a subcommand: {}", first, subcommands);
    }
    eprint("weightcast: error: {}{}; see '{} --help'\n",
               chosen.empty() ? "" : chosen.front()->get_name() + ": ", printable(what),
               command);
    return exit_status(Errc::usage);
  }

  return check_stdout(run_command([&] {
    if (*run) return cli::run(run_args);
    if (*launch) return cli::launch(launch_args);
    if (*inspect) return cli::inspect(inspect_args);
    if (*synth) return cli::synth(synth_args);
    return exit_status(Errc::usage);
  }));
}
