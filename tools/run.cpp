// `weightcast run`: load a checkpoint on this rank as the config says, print a summary.
#include "commands.hpp"

#include "weightcast/checkpoint.hpp"
#include "weightcast/config.hpp"
#include "weightcast/detail/file_open.hpp"
#include "weightcast/digest.hpp"
#include "weightcast/error.hpp"
#include "weightcast/loader.hpp"
#include "weightcast/log.hpp"
#include "weightcast/trace.hpp"
#include "weightcast/world.hpp"

#include "progress.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdlib>
#include <fcntl.h>
#include <optional>
#include <string>
#include <string_view>
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

// LOCAL_RANK (torchrun, `weightcast launch`) picks the GPU. TODO(#5): take World::local_rank
// from weightcast/world.hpp once world detection has landed.
int local_rank_from_env() {
  const char* text = std::getenv("LOCAL_RANK");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  WEIGHTCAST_EXPECT(*end == '\0' && value >= 0 && value < 1 << 20, Errc::config,
                    fmt::format("LOCAL_RANK={}: not a rank (a non-negative integer)", text));
  return static_cast<int>(value);
}

std::unique_ptr<Device> choose_device(const Config& config) {
  try {
    return make_device(config.device, local_rank_from_env());
  } catch (const Error& e) {
    if (e.code() != Errc::unavailable) throw;
    throw Error(e.code(), fmt::format("device: {}: {}", to_string(config.device), e.what()));
  }
}

std::unique_ptr<Transport> choose_transport(const Config& config) {
  switch (config.transport) {
    case TransportKind::mpi:
    case TransportKind::nccl:
      throw Error(Errc::unavailable,
                  fmt::format("transport: {}: not available in this build (world size 1 uses "
                              "transport: local or auto)",
                              to_string(config.transport)));
    case TransportKind::automatic:
    case TransportKind::local:
      break;
  }
  return make_local_transport();
}

// Paths are bytes, not necessarily UTF-8; JSON strings are UTF-8. Invalid bytes become
// U+FFFD, as in the header's error messages, rather than nlohmann's type_error 316 after a
// load that succeeded. Tensor names are valid UTF-8 already (the header parser checks).
std::string dump_json(const nlohmann::ordered_json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace

void check_output_file(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  // No truncation: an existing file keeps its contents until the load has something to
  // write. Refuses a FIFO (which would block) or a directory.
  ::close(detail::open_output_file(path, what, false));
  if (!existed) ::unlink(path.c_str());  // a failed load leaves no empty file behind
}

std::string report_path_for_rank(const std::string& path, int rank, int world_size) {
  if (path.empty()) return {};
  if (world_size > 1 && rank != 0 && path.find("{rank}") == std::string::npos) return {};
  return with_rank(path, rank);
}

void check_distinct_outputs(const std::string& report_path, const std::string& trace_path,
                            int rank, int world_size) {
  const std::string report = report_path_for_rank(report_path, rank, world_size);
  if (report.empty() || trace_path.empty()) return;
  const std::filesystem::path trace = trace_path_for_rank(trace_path, rank, world_size);
  if (std::filesystem::absolute(report).lexically_normal() !=
      std::filesystem::absolute(trace).lexically_normal()) {
    return;
  }
  // A device (/dev/null) keeps nothing to overwrite: both may go there.
  struct stat st {};
  if (::stat(report.c_str(), &st) == 0 && S_ISCHR(st.st_mode)) return;
  throw Error(Errc::config,
              fmt::format("--report {} and --trace {} (or the config's trace) are the same file "
                          "for rank {} ({}): one would overwrite the other; give them different "
                          "paths",
                          report_path, trace_path, rank, report));
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
  WEIGHTCAST_EXPECT(!digested || digests.size() == result.catalogue.tensors.size(),
                    Errc::internal,
                    fmt::format("report: {} digests for {} tensors", digests.size(),
                                result.catalogue.tensors.size()));
  // Appended to the ordered map's vector directly: its operator[] searches linearly, which
  // made the report quadratic in the tensor count. Names are unique in a catalogue (the
  // header parser and open_checkpoint refuse a name given twice).
  auto& tensors = report["tensors"].get_ref<nlohmann::ordered_json::object_t&>();
  tensors.reserve(result.catalogue.tensors.size());
  for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
    const TensorInfo& tensor = result.catalogue.tensors[i];
    nlohmann::ordered_json entry = {{"dtype", dtype_name(tensor.dtype)}, {"shape", tensor.shape}};
    if (digested) entry["xxh3"] = digest_hex(digests[i]);
    tensors.emplace_back(tensor.name, std::move(entry));
  }
  const std::string text = dump_json(report, 1) + "\n";
  const int fd = detail::open_output_file(path, "the report", true);
  std::size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      err = wrote < 0 ? errno : ENOSPC;
      break;
    }
    done += static_cast<std::size_t>(wrote);
  }
  if (::close(fd) != 0 && err == 0) err = errno;  // NFS reports ENOSPC/EDQUOT at close
  if (err != 0) {
    throw system_error(Errc::io, err, fmt::format("{}: cannot write the report", path));
  }
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
  std::fflush(stdout);
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

}  // namespace

LoadResult load_traced(Catalogue catalogue, Device& device, Transport& transport,
                       LoadOptions options, const Config& config, int rank, int world_size,
                       const std::function<void()>& end_display) {
  std::optional<TraceRecorder> trace;
  if (!config.trace.empty()) {
    trace.emplace(rank);
    options.on_stage_event = trace->hook();
  }
  LoadResult result;
  try {
    result = load(std::move(catalogue), device, transport, options);
  } catch (...) {
    if (end_display) end_display();
    write_trace(trace, config, rank, world_size, true);
    throw;
  }
  if (end_display) end_display();
  write_trace(trace, config, rank, world_size, false);
  return result;
}

int run(const RunArgs& args) {
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
  if (world.world_size > 1) return run_ranks(args, config, world);
  WEIGHTCAST_EXPECT(!config.checkpoint.empty(), Errc::config,
                    "checkpoint: not set (give it in the config or with --set checkpoint=PATH)");

  // Before the load: a report or trace that cannot be written fails now, not after it.
  check_output_paths(args, config, 0, 1);
  auto device = choose_device(config);
  auto transport = choose_transport(config);
  LoadOptions options = LoadOptions::from_config(config);
  // 256 B: cudaMalloc's own alignment, so every tensor view suits vectorised kernels.
  if (device->name() != "host") options.tensor_alignment = 256;

  Catalogue catalogue = open_checkpoint(config.checkpoint);
  const std::size_t shards = catalogue.shards.size();
  std::optional<ProgressRenderer> progress;
  if (!args.quiet && transport->rank() == 0) {
    progress.emplace(stderr, ProgressRenderer::mode_for(stderr));
    options.on_progress = [&progress](const LoadProgress& p) { progress->update(p); };
  }
  const LoadResult result =
      load_traced(std::move(catalogue), *device, *transport, std::move(options), config,
                  transport->rank(), transport->world_size(), [&progress] {
                    if (progress) progress->finish();
                  });
  const std::uint64_t peak_rss = peak_rss_bytes();
  // "{rank}" in --report PATH becomes the rank, as with several ranks (here 0).
  const std::string report_path =
      report_path_for_rank(args.report_path, transport->rank(), transport->world_size());
  // `verify: none` skips hashing the arena; `destination: discard` hashed as it streamed.
  std::vector<std::uint64_t> digests;
  if (!report_path.empty() &&
      (config.verify == Verify::digest || config.destination == Destination::discard)) {
    digests = tensor_digests(result);
  }

  if (args.json) {
    print_json_summary(result, config, shards, transport->rank(), transport->world_size(),
                       peak_rss);
    if (!report_path.empty()) {
      write_report(report_path, result, digests, transport->rank(), transport->world_size(),
                   peak_rss);
    }
    return 0;
  }

  fmt::print("# rank {} of {}: {} tensors, {} shard{}, {} ({} B) in {:.3f} s: {:.2f} GB/s\n",
             transport->rank(), transport->world_size(), result.catalogue.tensors.size(), shards,
             shards == 1 ? "" : "s", format_bytes(result.stats.bytes), result.stats.bytes,
             result.stats.seconds, result.stats.gbps());
  const std::string how_read =
      result.stats.reader.empty()
          ? std::string("none (nothing to read)")
          : fmt::format("{} ({} reads)", result.stats.reader, result.stats.io_mode);
  fmt::print("# reader {}, destination {}, device {}, transport {}, {} chunks of <= "
             "{}, staging ring {} (buffer_depth {})\n",
             how_read, to_string(config.destination),
             result.stats.device, result.stats.transport, result.stats.chunks,
             format_bytes(config.chunk_bytes), format_bytes(result.stats.staging_bytes),
             config.buffer_depth);
  fmt::print("# peak RSS {} ({} B)\n", format_bytes(peak_rss), peak_rss);
  if (!report_path.empty()) {
    write_report(report_path, result, digests, transport->rank(), transport->world_size(),
                   peak_rss);
    if (!args.quiet) fmt::print("# report written to {}\n", report_path);
  }
  return 0;
}

}  // namespace weightcast::cli
