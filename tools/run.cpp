// `weightcast run`: load a checkpoint on this rank as the config says, print a summary.
#include "commands.hpp"

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/config/launch_options.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/distributed/job.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/core/log.hpp"
#include "weightcast/pipeline/trace.hpp"
#include "weightcast/control/world.hpp"

#include "interrupt.hpp"
#include "test_hooks.hpp"
#include "progress.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcast::cli {

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

namespace {

// Paths are bytes, not necessarily UTF-8; JSON strings are UTF-8. Invalid bytes become
// U+FFFD, as in the header's error messages, rather than nlohmann's type_error 316 after a
// load that succeeded. Tensor names are valid UTF-8 already (the header parser checks).
std::string dump_json(const nlohmann::ordered_json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// The file a write to @p path would reach, as one absolute path: every symbolic link
// followed, a dangling last one included, and "." and ".." read as the kernel reads them
// (through the links before them). Two paths that reach one file, existing or not yet,
// give the same result; hard links to an existing file are for fs::equivalent.
std::filesystem::path output_target(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  if (ec) absolute = path;
  const fs::path target = detail::follow_links(absolute);
  fs::path resolved = fs::weakly_canonical(fs::absolute(target, ec), ec);
  return ec ? target.lexically_normal() : resolved;
}

}  // namespace

void check_world_of_one(const Config& config) {
  resolve_transport(config.transport, true, 1);  // a world of one rank (run_ranks handles more)
}

void check_output_file(const std::filesystem::path& path, std::string_view what) {
  namespace fs = std::filesystem;
  // A dangling symbolic link is written through: the file to create is its target's (the
  // probe once created the target and then unlinked the link itself).
  const fs::path target = detail::follow_links(path);
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 || errno != ENOENT) {
    // No truncation: an existing file keeps its contents until the load has something to
    // write. Refuses a FIFO (which would block) or a directory; any other stat error is
    // open(2)'s to report.
    ::close(detail::open_output_file(path, what, false));
    return;
  }
  // A missing file is never created here: an unnamed file in its directory (O_TMPFILE) shows
  // the directory takes a new file, and nothing is left behind when this process is ended
  // mid-check (another rank's ABORT _exits it; a created-then-removed probe could stay).
  const fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
  if (fd >= 0) {
    ::close(fd);
    return;
  }
  const auto cannot_create = [&](int err) {
    return system_error(Errc::io, err, fmt::format("{}: cannot create {}", path.string(), what));
  };
  if (const int err = errno; err != EOPNOTSUPP && err != EISDIR && err != EINVAL) {
    throw cannot_create(err);
  }
  // A file system without O_TMPFILE (NFS): ask whether this process may add a name there,
  // which creates none.
  struct stat dir_st {};
  if (::stat(dir.c_str(), &dir_st) != 0) throw cannot_create(errno);
  if (!S_ISDIR(dir_st.st_mode)) throw cannot_create(ENOTDIR);
  if (::faccessat(AT_FDCWD, dir.c_str(), W_OK | X_OK, AT_EACCESS) != 0) {
    throw cannot_create(errno);
  }
}

std::string report_path_for_rank(const std::string& path, int rank, int world_size) {
  if (path.empty()) return {};
  if (world_size > 1 && rank != 0 && path.find("{rank}") == std::string::npos) return {};
  return with_rank(path, rank);
}

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  namespace fs = std::filesystem;
  // Hard links: the same inode when both exist. Else the file each path would reach:
  // "./x" and "x", symlinks (dangling ones too: both links would create one target), and
  // "dir/../x" read as the kernel reads "link/..", not as the text reads.
  std::error_code ec;
  if (fs::equivalent(a, b, ec) && !ec) return true;
  return output_target(a) == output_target(b);
}

namespace {

// A key under which two ranks' outputs collide: the normalised absolute path. Between
// ranks the text decides (up to 2^20 ranks each compute every rank's paths; resolving each
// on the file system would cost millions of calls).
std::string output_key(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::absolute(path, ec).lexically_normal().string();
}

// An output named like a checkpoint file would be taken for one: written into a checkpoint
// directory it makes the next load refuse the directory, or it overwrites a shard.
void check_output_name(std::string_view option, const std::string& path, int rank) {
  const std::string name = std::filesystem::path(path).filename().string();
  if (!name.ends_with(".safetensors") && !name.ends_with(".safetensors.index.json")) return;
  throw Error(Errc::config,
              fmt::format("{} {} (rank {}) is named like a checkpoint file (*.safetensors, "
                          "*.safetensors.index.json): it could overwrite a shard, or be taken "
                          "for one; give the report or trace another name",
                          option, path, rank));
}

// A character device (/dev/null): writing it overwrites nothing.
bool is_device(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// The device and inode of the file @p path reaches (every link followed), if it exists.
std::optional<std::pair<dev_t, ino_t>> file_id(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::pair{st.st_dev, st.st_ino};
}

struct Output {
  std::string what;    // "rank 3's report"
  std::string path;
  std::string option;  // "--report" or "--trace"
};

// Rank `rank`'s outputs: its report (if it writes one) and its trace (if any).
std::vector<Output> outputs_of(const std::string& report_path, const std::string& trace_path,
                               int rank, int world_size) {
  std::vector<Output> out;
  const std::string report = report_path_for_rank(report_path, rank, world_size);
  if (!report.empty()) {
    out.push_back({fmt::format("rank {}'s report", rank), report, "--report"});
  }
  if (!trace_path.empty()) {
    out.push_back({fmt::format("rank {}'s trace", rank),
                   trace_path_for_rank(trace_path, rank, world_size).string(), "--trace"});
  }
  return out;
}

[[noreturn]] void collision(const Output& a, const Output& b) {
  throw Error(Errc::config,
              fmt::format("{} and {} are the same file ({}): one would overwrite the other; "
                          "give --report and --trace paths that differ for every rank "
                          "(\"{{rank}}\" in a path becomes the rank)",
                          a.what, b.what, b.path));
}

// Every rank's outputs that exist now, compared by device and inode: two ranks' paths that
// are one file through hard links, or through links of each's own.
void check_distinct_files(const std::string& report_path, const std::string& trace_path,
                          int world_size) {
  std::map<std::pair<dev_t, ino_t>, Output> seen;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::vector<Output> outputs = outputs_of(report_path, trace_path, rank, world_size);
    for (const Output& output : outputs) {
      if (is_device(output.path)) continue;
      const auto id = file_id(output.path);
      if (!id) continue;
      auto [it, inserted] = seen.try_emplace(*id, output);
      if (!inserted && it->second.path != output.path) collision(it->second, output);
      // The same path twice is a rank's own pair: the lexical checks name it.
    }
  }
}

}  // namespace

void check_distinct_outputs(const std::string& report_path, const std::string& trace_path,
                            int rank, int world_size) {
  const std::vector<Output> mine = outputs_of(report_path, trace_path, rank, world_size);
  for (const Output& output : mine) {
    check_output_name(output.option, output.path, rank);
  }
  // This rank's report and trace: the same file however it is reached (a device such as
  // /dev/null keeps nothing to overwrite: both may go there).
  if (mine.size() == 2 && !is_device(mine[0].path) && same_file(mine[0].path, mine[1].path)) {
    throw Error(Errc::config,
                fmt::format("--report {} and --trace {} (or the config's trace) are the same "
                            "file for rank {} ({}): one would overwrite the other; give them "
                            "different paths",
                            report_path, trace_path, rank, mine[0].path));
  }
  // Against every other rank's (the same options on every rank, as under mpirun or torchrun;
  // ranks on other nodes only collide where they share a file system, which no rank knows).
  // This rank's own paths are also followed through their links (a link of this rank's to
  // another rank's path); another rank that reaches this rank's path through a link of its
  // own finds the collision in its turn.
  std::vector<std::pair<std::string, std::size_t>> keys;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    keys.emplace_back(output_key(mine[i].path), i);
    keys.emplace_back(output_target(mine[i].path).string(), i);
  }
  for (int other = 0; other < world_size; ++other) {
    if (other == rank) continue;
    for (const Output& theirs : outputs_of(report_path, trace_path, other, world_size)) {
      if (is_device(theirs.path)) continue;
      const std::string key = output_key(theirs.path);
      for (const auto& [mine_key, i] : keys) {
        if (mine_key == key) collision(mine[i], theirs);
      }
    }
  }
  // Files that exist already may be one file under two names (hard links, or links on both
  // sides): rank 0 compares every rank's by inode, one stat(2) per output.
  if (rank == 0) check_distinct_files(report_path, trace_path, world_size);
}

void check_distinct_outputs(const std::string& report_path, const std::string& trace_path,
                            int world_size) {
  check_distinct_files(report_path, trace_path, world_size);
  std::unordered_map<std::string, Output> seen;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::vector<Output> outputs = outputs_of(report_path, trace_path, rank, world_size);
    for (const Output& output : outputs) {
      check_output_name(output.option, output.path, rank);
      if (is_device(output.path)) continue;
      // One process checks every rank here: each path is followed through its links.
      auto [it, inserted] = seen.try_emplace(output_target(output.path).string(), output);
      if (!inserted) collision(it->second, output);
    }
    // A rank's own pair, resolved on the file system (a symlink between them).
    if (outputs.size() == 2 && !is_device(outputs[0].path) &&
        same_file(outputs[0].path, outputs[1].path)) {
      collision(outputs[0], outputs[1]);
    }
  }
}

void check_outputs_spare_checkpoint(const RunArgs& args, const Config& config,
                                    const Catalogue& catalogue, int rank, int world_size) {
  namespace fs = std::filesystem;
  // The files this run reads, by identity (device and inode: a symlink, a hard link or a
  // directory link on the way to one all reach it): every shard, the path given (a file or
  // an index), any index in the directory given, and the config file. An output that is
  // none of them as it exists now cannot become one: they all exist.
  struct Input {
    std::string what;         // "shard X of the checkpoint /c"
    std::string destroyed;    // "the checkpoint"
  };
  std::map<std::pair<dev_t, ino_t>, Input> inputs;
  const auto add = [&](const fs::path& path, Input input) {
    if (const auto id = file_id(path)) inputs.try_emplace(*id, std::move(input));
  };
  // Ranks other than 0 never touch the checkpoint's path: rank 0 checks their outputs.
  for (const ShardInfo& shard : catalogue.shards) {
    add(shard.path, {fmt::format("shard {} of the checkpoint {}", shard.name, config.checkpoint),
                     "the checkpoint"});
  }
  std::error_code ec;
  const fs::path given = config.checkpoint;
  if (rank == 0 && fs::is_directory(given, ec)) {
    for (fs::directory_iterator it(given, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.ends_with(".safetensors.index.json")) {
        add(it->path(), {fmt::format("index {} of the checkpoint {}", name, config.checkpoint),
                         "the checkpoint"});
      }
    }
  } else if (rank == 0) {
    add(given, {fmt::format("the checkpoint {}", config.checkpoint), "the checkpoint"});
  }
  if (!args.config_path.empty()) {
    add(args.config_path, {fmt::format("the config file {}", args.config_path), "the config"});
  }
  // Rank 0 checks every rank's paths, as they are named with the options it was given (the
  // same on every rank under mpirun, torchrun or launch): only rank 0 knows the checkpoint's
  // files. Another rank checks its own, against the config file it reads.
  const int first = rank == 0 ? 0 : rank;
  const int last = rank == 0 ? world_size : rank + 1;
  for (int r = first; r < last; ++r) {
    for (const Output& output : outputs_of(args.report_path, config.trace, r, world_size)) {
      const auto id = file_id(output.path);
      if (!id) continue;
      const auto it = inputs.find(*id);
      if (it == inputs.end()) continue;
      throw Error(Errc::config,
                  fmt::format("{} {}{} is {}: writing it would destroy {}; give another path",
                              output.option, output.path,
                              world_size > 1 ? fmt::format(" ({})", output.what) : "",
                              it->second.what, it->second.destroyed));
    }
  }
}

void check_output_paths(const RunArgs& args, const Config& config, int rank, int world_size) {
  if (!config.trace.empty()) {
    check_output_file(trace_path_for_rank(config.trace, rank, world_size), "the trace file");
  }
  const std::string report = report_path_for_rank(args.report_path, rank, world_size);
  if (!report.empty()) check_output_file(report, "the report");
}

void write_report(const std::string& path, const LoadResult& result,
                  const std::vector<std::uint64_t>& digests, int rank, int world_size,
                  std::uint64_t peak_rss) {
  nlohmann::ordered_json report;
  report["rank"] = rank;
  report["world_size"] = world_size;
  report["bytes"] = result.stats.bytes;
  report["seconds"] = result.stats.seconds;
  report["peak_rss_bytes"] = peak_rss;
  report["tensors"] = nlohmann::ordered_json::object();
  // No digests at all: `verify: none` (no "xxh3" fields); otherwise one per tensor.
  const bool digested = !digests.empty();
  // A placed load lists this rank's local shards: what it received, not the checkpoint.
  const std::size_t entries =
      result.placed ? result.wants.tensors.size() : result.catalogue.tensors.size();
  WEIGHTCAST_EXPECT(!digested || digests.size() == entries, Errc::internal,
                    fmt::format("report: {} digests for {} tensors", digests.size(), entries));
  // Appended to the ordered map's vector directly: its operator[] searches linearly, which
  // made the report quadratic in the tensor count. Names are unique in a catalogue (the
  // header parser and open_checkpoint refuse a name given twice).
  auto& tensors = report["tensors"].get_ref<nlohmann::ordered_json::object_t&>();
  tensors.reserve(entries);
  for (std::size_t i = 0; i < entries; ++i) {
    const TensorView view = result.placed ? result.local(i) : result.tensor(i);
    const TensorInfo& tensor = *view.info;
    const TensorWant whole{tensor.name, {}, {}, {}};
    const TensorWant& want = view.want != nullptr ? *view.want : whole;
    // shape is the local shape, global_shape the tensor's, offset the local shard's first
    // element per dim (torch DTensor's meaning); a whole tensor has offset zeros.
    nlohmann::ordered_json entry = {
        {"dtype", dtype_name(tensor.dtype)},
        {"shape", local_shape(tensor, want)},
        {"global_shape", tensor.shape},
        {"offset", local_offset(tensor, want)}};
    if (digested) entry["xxh3"] = digest_hex(digests[i]);
    tensors.emplace_back(tensor.name, std::move(entry));
  }
  const std::string text = dump_json(report, 1) + "\n";
  // Written whole or not at all: a full file system leaves the previous report as it was.
  detail::OutputFile file(path, "the report");
  file.write(text);
  file.commit();
}

namespace {

// The loader leaves the reader and the read mode empty on a rank that read nothing: every
// rank but 0, and rank 0 of a checkpoint with no tensor bytes (no chunk, so no reader was
// opened). The summary says "none" there rather than print an empty name.
std::string_view reader_or_none(const LoadStats& stats) {
  return stats.reader.empty() ? std::string_view("none") : std::string_view(stats.reader);
}
std::string_view io_mode_or_none(const LoadStats& stats) {
  return stats.io_mode.empty() ? std::string_view("none") : std::string_view(stats.io_mode);
}

}  // namespace

// `run --json`: the summary as one JSON object on stdout (the effective config went to
// stderr), so `weightcast run --json ... | python3 -m json.tool` works.
void print_json_summary(const LoadResult& result, const Config& config, std::size_t shards,
                        int rank, int world_size, std::uint64_t peak_rss,
                        const std::string& verdict) {
  nlohmann::ordered_json summary;
  summary["rank"] = rank;
  summary["world_size"] = world_size;
  summary["checkpoint"] = config.checkpoint;
  summary["tensors"] = result.catalogue.tensors.size();
  summary["shards"] = shards;
  summary["bytes"] = result.stats.bytes;
  summary["seconds"] = result.stats.seconds;
  summary["gbps"] = result.stats.gbps();
  summary["reader"] = reader_or_none(result.stats);
  summary["io_mode"] = io_mode_or_none(result.stats);
  summary["destination"] = std::string(to_string(config.destination));
  summary["device"] = result.stats.device;
  summary["transport"] = result.stats.transport;
  if (!result.stats.node_reads.empty()) summary["node_reads"] = result.stats.node_reads;
  summary["chunks"] = result.stats.chunks;
  summary["chunk_size_bytes"] = config.chunk_bytes;
  summary["buffer_depth"] = config.buffer_depth;
  summary["io_depth"] = config.io_depth;
  summary["staging_bytes"] = result.stats.staging_bytes;
  summary["peak_rss_bytes"] = peak_rss;
  if (!config.trace.empty()) {
    summary["trace"] = trace_path_for_rank(config.trace, rank, world_size).string();
  }
  if (!verdict.empty()) summary["verdict"] = verdict;
  fmt::print("{}\n", dump_json(summary));
  flush_stdout();
}

void check_environment_token(const Config& config) {
  if (!config.rendezvous_token.empty()) return;
  const char* token = std::getenv("WEIGHTCAST_TOKEN");
  if (token == nullptr) return;
  const std::size_t bytes = std::strlen(token);
  const std::size_t limit = detail::max_token_bytes;
  WEIGHTCAST_EXPECT(bytes <= limit, Errc::config,
                    fmt::format("WEIGHTCAST_TOKEN (the job token, as rendezvous.token is not "
                                "set): {} bytes, over the {} a rank's hello to rank 0 carries",
                                bytes, limit));
}

void flush_stdout() {
  if (std::fflush(stdout) != 0) throw system_error(Errc::io, errno, "cannot write to stdout");
}

void check_stdout_writable() {
  flush_stdout();
  if (::write(STDOUT_FILENO, "", 0) < 0) {
    throw system_error(Errc::io, errno, "cannot write to stdout");
  }
}

namespace {

// Writes the trace if one was asked for. @p failing: only warn if the trace cannot be
// written, so the load's own error is the one reported.
void write_trace(const std::optional<TraceRecorder>& trace, const Config& config, int rank,
                 int world_size, bool failing) {
  if (!trace) return;
  const auto path = trace_path_for_rank(config.trace, rank, world_size);
  try {
    trace->write(path);
    spdlog::info("trace ({} events) written to {}", trace->size(), path.string());
  } catch (const Error& e) {
    if (!failing) throw;
    spdlog::warn("{}", e.what());
  }
}

// Whether @p failure is the load's answer to LoadOptions::stop.
bool is_stop(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const Error& e) {
    return e.code() == Errc::interrupted;
  } catch (...) {
    return false;
  }
}

}  // namespace

void add_load_hooks(JobOptions& job, const Config& config, int rank, int world_size,
                    InterruptHandler& interrupts, std::function<void()> end_display) {
  struct State {
    std::optional<TraceRecorder> trace;
    std::optional<InterruptHandler::LoadScope> scope;
  };
  auto state = std::make_shared<State>();
  if (!config.trace.empty()) {
    state->trace.emplace(rank);
    job.load.on_stage_event = state->trace->hook();
  }
  test_hooks::add_chunk_delay(job.load);
  // A SIGINT or SIGTERM during the load stops it (InterruptHandler::LoadScope).
  job.load.stop = interrupts.stop_token();
  job.on_load_start = [state, &interrupts] { state->scope.emplace(interrupts); };
  job.on_load_end = [state, &interrupts, &config, rank, world_size,
                     end_display = std::move(end_display)](std::exception_ptr failure) {
    // A signal during the load (even one that came as it ended) is this load's end; but a
    // failure of its own that beat the stop is the cause.
    const int sig = state->scope ? state->scope->end() : 0;
    if (end_display) end_display();
    write_trace(state->trace, config, rank, world_size, failure || sig != 0);
    interrupts.load_finished();
    if (sig != 0 && (!failure || is_stop(failure))) throw interrupted_error(sig, " during the load");
  };
}

int run(const RunArgs& args) {
  // First, before any thread starts: they all inherit SIGINT and SIGTERM blocked.
  InterruptHandler interrupts;
  Config config = load_config(args.config_path, args.overrides);
  if (!args.trace_path.empty()) config.trace = args.trace_path;  // --trace wins
  // --quiet: errors only, then the summary; --json keeps stdout for the JSON summary alone.
  const World world = detect_world(config);
  configure_log(args.quiet ? LogLevel::error : config.log_level,
                world.world_size > 1 ? world.rank : -1);
  // Every rank runs the same config, so rank 0 alone prints it, as it alone prints the
  // verdict; a rank that finds itself alone (a world misdetected) is rank 0 and prints too.
  if (!args.quiet && world.rank == 0) {
    fmt::print(args.json ? stderr : stdout, "# weightcast {} effective config\n{}# world: {}\n",
               WEIGHTCAST_VERSION, config.to_yaml(), world.describe());
  }
  // Before any rendezvous: the other ranks would otherwise wait for `timeout`.
  check_destination(config.destination, world.world_size);
  check_distinct_outputs(args.report_path, config.trace, world.rank, world.world_size);
  if (world.world_size > 1) {
    check_environment_token(config);
    return run_ranks(args, config, world, interrupts);
  }
  WEIGHTCAST_EXPECT(!config.checkpoint.empty(), Errc::config,
                    "checkpoint: not set (give it in the config or with --set checkpoint=PATH)");

  // The job of one rank (run_job): the device (its GPU: the world's local rank, as with
  // several ranks), the local transport, the checkpoint, the load.
  JobOptions job = JobOptions::from_config(config, world);
  job.on_failure = [](const Error&) {};  // main() prints the error it throws
  // Before the load: a report or trace that cannot be written fails now, not after it.
  job.on_control_plane = [&](ControlPlane* control) {
    if (control != nullptr) check_output_paths(args, config, 0, 1);
  };
  std::size_t shards = 0;
  job.on_catalogue = [&](const Catalogue& catalogue) {
    check_outputs_spare_checkpoint(args, config, catalogue, 0, 1);
    shards = catalogue.shards.size();
  };
  std::optional<ProgressRenderer> progress;
  if (!args.quiet) {
    progress.emplace(stderr, ProgressRenderer::mode_for(stderr));
    job.load.on_progress = [&progress](const LoadProgress& p) { progress->update(p); };
  }
  add_load_hooks(job, config, 0, 1, interrupts, [&progress] {
    if (progress) progress->finish();
  });
  const JobResult outcome = run_job(job);
  const LoadResult& result = outcome.load;
  const std::uint64_t peak_rss = peak_rss_bytes();
  // "{rank}" in --report PATH becomes the rank, as with several ranks (here 0).
  const std::string report_path = report_path_for_rank(args.report_path, 0, 1);
  // `verify: none` skips hashing (the arena, or with `destination: discard` the stream).
  std::vector<std::uint64_t> digests;
  if (!report_path.empty() && config.verify == Verify::digest) {
    digests = result.placed ? local_digests(result) : tensor_digests(result);
  }

  if (args.json) {
    print_json_summary(result, config, shards, 0, 1, peak_rss);
    if (!report_path.empty()) write_report(report_path, result, digests, 0, 1, peak_rss);
    return 0;
  }

  const std::size_t tensors = result.catalogue.tensors.size();
  fmt::print("# rank 0 of 1: {} tensor{}, {} shard{}, {} ({} B) in {:.3f} s: {:.2f} GB/s\n",
             tensors, tensors == 1 ? "" : "s", shards, shards == 1 ? "" : "s",
             format_bytes(result.stats.bytes), result.stats.bytes, result.stats.seconds,
             result.stats.gbps());
  const std::string how_read =
      result.stats.reader.empty()
          ? std::string("none (nothing to read)")
          : fmt::format("{} ({} reads)", result.stats.reader, result.stats.io_mode);
  fmt::print("# reader {}, destination {}, device {}, transport {}, {} chunk{} of <= "
             "{}, staging ring {} (buffer_depth {})\n",
             how_read, to_string(config.destination),
             result.stats.device, result.stats.transport, result.stats.chunks,
             result.stats.chunks == 1 ? "" : "s",
             format_bytes(config.chunk_bytes), format_bytes(result.stats.staging_bytes),
             config.buffer_depth);
  fmt::print("# peak RSS {} ({} B)\n", format_bytes(peak_rss), peak_rss);
  if (!report_path.empty()) {
    write_report(report_path, result, digests, 0, 1, peak_rss);
    if (!args.quiet) fmt::print("# report written to {}\n", report_path);
  }
  return 0;
}

}  // namespace weightcast::cli
