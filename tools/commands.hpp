// The launcher's subcommands. Each returns the process exit status and throws
// weightcast::Error for failures (main() prints it and exits with its sysexits status).
#pragma once

#include "weightcast/core/settings.hpp"

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weightcast::cli {

/// Writes @p text to stderr as is. Never throws: with stderr closed or full (`2>&-`,
/// `2>/dev/full`) the message is lost but the exit status it goes with still stands, where
/// `fmt::print(stderr, ...)` threw from the error handler and the process died of SIGABRT.
void print_stderr(std::string_view text) noexcept;

/// `fmt::format(format, args...)` written with print_stderr(); never throws.
template <typename... Args>
void eprint(fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    print_stderr(fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {  // std::bad_alloc: nothing sensible is left to print
  }
}

/// `weightcast run`'s command line.
struct RunArgs {
  std::string config_path;             ///< YAML config; empty for built-in defaults.
  std::vector<std::string> overrides;  ///< --set key=value, in order.
  std::string report_path;             ///< --report PATH; empty for none.
  std::string trace_path;              ///< --trace PATH (wins over `trace:`); empty for none.
  bool quiet = false;                  ///< --quiet: no config, no progress, no notices.
  bool json = false;                   ///< --json: the summary as JSON on stdout.
};
/// `weightcast run` (tools/run.cpp): loads the config's checkpoint on this rank (world size 1
/// here; more ranks go to run_ranks()), prints the summary and writes `--report`.
/// @return 0 on success.
/// @throws Error from the config (78), the checkpoint (64–66, 74), the device (69), the
///         load, the outputs (`check_distinct_outputs`, `check_output_paths`: 78, 74) and an
///         interrupt (130, 143).
int run(const RunArgs& args);
}  // namespace weightcast::cli

namespace weightcast {
struct Config;
struct JobOptions;
struct World;
struct LoadResult;
struct LoadOptions;
struct Catalogue;
class Device;
class Transport;
enum class TransportKind;
}  // namespace weightcast

namespace weightcast::cli {
class InterruptHandler;

/// `run` when the world has more than one rank (tools/run_ranks.cpp): control plane, data
/// plane, final report compared on rank 0. An interrupt (@p interrupts) ends every rank.
int run_ranks(const RunArgs& args, const Config& config, const World& world,
              InterruptHandler& interrupts);

/// Flushes stdout (tools/run.cpp). A flush whose result is ignored loses the reason: the
/// stream keeps only its error flag, and the final check could then say no more than "cannot
/// write to stdout".
/// @throws Error `io` (74): "cannot write to stdout: <strerror>".
void flush_stdout();

/// Checks, before a command starts work whose output goes to stdout, that stdout takes
/// writes (`launch`: mpirun drops its own write errors, so a job's output lost to a full disk
/// would otherwise end with status 0). Flushes stdout, then writes zero bytes to its
/// descriptor, which fails for a descriptor not open for writing and for /dev/full, and
/// writes nothing into the output.
/// @throws Error `io` (74): "cannot write to stdout: <strerror>".
void check_stdout_writable();

/// Refuses, in a world of several ranks, a job token from `$WEIGHTCAST_TOKEN` (used when
/// @p config has no `rendezvous.token`) too long for a rank's hello: the config's own token
/// is checked as it is read, but the environment's only reached the control plane, where rank
/// 0 waited out `timeout` for peers that had each refused it (tools/run.cpp).
/// @throws Error `config` (78) naming the variable, its length and the limit, not the token.
void check_environment_token(const Config& config);

/// `run --json` (tools/run.cpp): prints the summary as one JSON object on stdout; with
/// @p verdict (rank 0 of several) the object also holds rank 0's verdict on the job.
/// @param shards the checkpoint's shard count; @p peak_rss in bytes.
/// @throws Error `io` (74) as flush_stdout() when stdout takes no more.
void print_json_summary(const LoadResult& result, const Config& config, std::size_t shards,
                        int rank, int world_size, std::uint64_t peak_rss,
                        const std::string& verdict = {});

/// Checks, before a load, that @p path can be written: an existing file is opened for
/// writing (not truncated); for a missing one (or the missing target of a symbolic link) an
/// unnamed file is made in its directory (O_TMPFILE), so no name is ever created, even when
/// the process is ended mid-check; where the file system has no O_TMPFILE (NFS), the
/// directory's write and search permission is checked instead (faccessat). So a `--report`
/// or `--trace` path in a missing directory, a read-only place or a directory fails at once
/// rather than after the whole load.
/// @param what names the file in the message ("the report", "the trace file").
/// @throws Error `io` (74): "PATH: cannot create WHAT: <strerror>" (a missing file), "PATH:
///         cannot open WHAT for writing: <strerror>" (an existing one), or "PATH: is a FIFO,
///         not a regular file: ..." (open_output_file).
void check_output_file(const std::filesystem::path& path, std::string_view what);

/// @return the `--report` path @p path of @p rank in a world of @p world_size ranks, "{rank}"
///         replaced by the rank; empty when this rank writes none (no `--report`, or a rank
///         other than 0 of several when @p path has no "{rank}").
std::string report_path_for_rank(const std::string& path, int rank, int world_size);

/// Refuses a `--report` (@p report_path) and trace (@p trace_path: `--trace` or the config's
/// `trace`) that name the same file for @p rank of @p world_size, or one file with another
/// rank's, which would silently leave only one of them, and one named like a checkpoint file
/// (`*.safetensors`, `*.safetensors.index.json`). Rank 0 also compares every rank's existing
/// outputs by inode (hard links). Either path may be empty (none); a character device
/// (/dev/null) may be named by both.
/// @throws Error `config` (78) naming both paths (or the one named like a checkpoint file).
void check_distinct_outputs(const std::string& report_path, const std::string& trace_path,
                            int rank, int world_size);

/// The same refusal across every rank of a job of @p world_size (`launch`): no two ranks'
/// reports or traces may name one file, nor any be named like a checkpoint file.
/// @throws Error `config` (78) naming the two outputs and the file.
void check_distinct_outputs(const std::string& report_path, const std::string& trace_path,
                            int world_size);

/// @return whether @p a and @p b name one file: the same inode (hard links, symlinks), or
///         the same file once each is made absolute and followed through its symbolic links,
///         a dangling last one included (a file not created yet: "./x" and "x", two links to
///         one missing target).
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

/// Refuses a `--report` or trace that is one of the files this run reads, compared by device
/// and inode (symlinks and hard links included). Rank 0, once the checkpoint is open (in
/// @p catalogue), checks every rank's outputs against the checkpoint's files (every shard,
/// the file or index given, an index in the directory given) and its config file; another
/// rank (@p catalogue empty; it never touches the checkpoint) checks its own against its
/// config file.
/// @throws Error `config` (78) naming the option, the path, the rank (world size > 1) and
///         the file it would overwrite.
void check_outputs_spare_checkpoint(const RunArgs& args, const Config& config,
                                    const Catalogue& catalogue, int rank, int world_size);

/// check_output_file for this rank's trace (the config's `trace`) and report (@p args).
/// @throws Error `io` (74) naming the first path that cannot be written.
void check_output_paths(const RunArgs& args, const Config& config, int rank, int world_size);

/// Writes this rank's `--report` JSON to @p path: rank, world size, bytes, seconds, peak RSS
/// (@p peak_rss, bytes) and, per tensor, dtype, shape and the XXH3-64 @p digests (in the
/// catalogue's order; empty @p digests, as with `verify: none`, leaves out every "xxh3").
/// A regular file is replaced whole or not at all (detail::OutputFile): a write that fails,
/// on a full file system say, leaves the previous report as it was.
/// @throws Error `io` (74) naming @p path and the reason when it cannot be created or written;
///         `internal` (70) when @p digests is neither empty nor one per tensor.
void write_report(const std::string& path, const LoadResult& result,
                  const std::vector<std::uint64_t>& digests, int rank, int world_size,
                  std::uint64_t peak_rss);

/**
 * @brief Adds the CLI's part of a load to @p job (tools/run.cpp): the config's `trace` (if
 *        set) recorded and written to its path for @p rank, also when the load fails (a trace
 *        of a failed or stalled load shows which stage stopped); a SIGINT or SIGTERM during
 *        the load (@p interrupts) stops it, and the job then fails with `interrupted_error`
 *        (130, 143: "interrupted by SIGTERM during the load"); the chunk-delay test hook.
 *        Sets `on_load_start`, `on_load_end`, `load.on_stage_event` and `load.stop`, and
 *        wraps `load.on_progress` (set it first).
 * @param end_display called once the load has ended, either way, before the trace is written
 *        (`run` ends its progress bar there); may be empty.
 */
void add_load_hooks(JobOptions& job, const Config& config, int rank, int world_size,
                    InterruptHandler& interrupts, std::function<void()> end_display = {});

/// @return this process's peak resident set size so far, bytes (getrusage; Linux reports KiB).
std::uint64_t peak_rss_bytes();

/**
 * @brief The data plane a world of @p world_size > 1 ranks uses with @p config, on a device
 *        that is host memory (@p host_device) or a GPU (`resolve_transport`, job.hpp): every
 *        rank's `run_job` applies it, and `launch` before it starts any rank.
 * @param mpi_world whether the ranks run in an MPI world (mpirun starts them).
 * @return `mpi`, `tcp` or `nccl` (`auto` resolved: nccl for a GPU; for host memory mpi in an
 *         MPI world with MPI in the build, else tcp).
 * @throws Error `config` (78) for transport local (it moves no bytes between processes),
 *         mpi or tcp with a GPU device, or nccl with host memory; the message names both keys.
 */
TransportKind transport_for_world(const Config& config, bool host_device, int world_size,
                                  bool mpi_world);

/**
 * @brief Refuses a data plane in a world of one rank (tools/run.cpp): `run` applies it when
 *        it finds itself alone, and `launch -n 1` before it starts the rank.
 * @throws Error `config` (78) for transport mpi, nccl or tcp (there is no other rank to
 *         broadcast to); local and auto pass.
 */
void check_world_of_one(const Config& config);

/// `weightcast launch`'s command line.
struct LaunchArgs {
  int ranks = 0;                       ///< -n N: number of ranks to start (≥ 1).
  std::string config_path;             ///< YAML config passed to every rank.
  std::vector<std::string> overrides;  ///< --set key=value, passed to every rank.
  std::string report_path;             ///< --report PATH, passed to every rank.
  std::string trace_path;              ///< --trace PATH, passed to every rank.
  bool quiet = false;                  ///< --quiet, passed to every rank (and quiets launch).
  bool json = false;                   ///< --json, passed to every rank: one JSON line each.
  /// --spawner auto|mpirun|local (setting::launch_spawner).
  std::string spawner{choice_name(setting::launch_spawner, setting::launch_spawner.default_value)};
  /// --grace: SIGTERM → SIGKILL delay, seconds (setting::launch_grace).
  double grace_s = static_cast<double>(setting::launch_grace.default_value) / 1000.0;
};
/// `weightcast launch` (tools/launch.cpp): starts N ranks of `weightcast run` (under mpirun,
/// or as local processes with torchrun's variables), waits for them, and ends the rest once
/// one fails (SIGTERM, then SIGKILL after `grace_s`).
/// @return 0 when every rank succeeded; else the first failing process's exit status (69 for
///         one killed by a signal, 74 for SIGPIPE on the shared stdout), or 128 + signal
///         when launch itself was interrupted.
/// @throws Error before any rank starts: `config` (78) for what every rank would refuse
///         (outputs, world keys in the config, transport and device), `unavailable` (69) when
///         mpirun is not on PATH or a process cannot be started, `io` (74) when stdout takes
///         no writes.
int launch(const LaunchArgs& args);

/// `weightcast inspect`'s command line.
struct InspectArgs {
  std::string path;  ///< Checkpoint file, directory or index.
};
/// `weightcast inspect` (tools/inspect.cpp): validates the checkpoint (`open_checkpoint`)
/// and prints one row per tensor, then a total and "valid".
/// @return 0 for a valid checkpoint.
/// @throws Error as `open_checkpoint` does (64, 65, 66, 74).
int inspect(const InspectArgs& args);

/// `weightcast synth`'s command line.
struct SynthArgs {
  std::string out_dir;               ///< Directory to write into (created if missing).
  std::string params = "1B";         ///< Target parameter count: "125M", "1B", "7B"…
  std::string dtype = "BF16";        ///< A safetensors dtype name, case-sensitive.
  std::string shard_size = "2GiB";   ///< Shard when the checkpoint is larger than this.
  std::string seed = "0";           ///< Decimal, 0 to 2^64 - 1 (parse_seed).
};
/// `weightcast synth` (tools/synth.cpp): writes a synthetic checkpoint
/// (`write_synthetic_checkpoint`) and prints its shape, paths and speed.
/// @return 0 once the checkpoint is in place.
/// @throws Error `usage` (64) for a bad `--params`, `--dtype`, `--shard-size` or `--seed`;
///         as `write_synthetic_checkpoint` (64, 74); `interrupted_error` (130, 143) on SIGINT
///         or SIGTERM.
int synth(const SynthArgs& args);

/// @return @p text as a synth seed: decimal digits only, 0 to 2^64 - 1; nullopt otherwise
///         (CLI11 read "-1" and any larger number as 2^64 - 1, silently).
std::optional<std::uint64_t> parse_seed(std::string_view text);

/// @return @p n as model sizes are written, three significant digits and a suffix: "1.00M"
///         for 1,000,448, "7.24B", "125M", "10.0T"; below 1000 the number itself ("291").
std::string human_count(std::uint64_t n);

}  // namespace weightcast::cli
