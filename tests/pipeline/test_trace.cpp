// The pipeline trace: stage events from the loader, Chrome trace-event JSON, `run --trace`.
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/checkpoint/synth.hpp"
#include "weightcast/pipeline/trace.hpp"

#include "support/host_load.hpp"
#include "support/paths.hpp"
#include "support/process.hpp"
#include "support/report.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <map>

using namespace weightcast;
using namespace weightcast::test;

namespace {

struct Slice {
  double begin_us;
  double end_us;
};

// The complete ("X") slices of one stage track, by chunk.
std::map<std::uint64_t, Slice> slices_of(const nlohmann::json& trace, int tid) {
  std::map<std::uint64_t, Slice> out;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["tid"] != tid) continue;
    const double ts = e["ts"];
    const double dur = e["dur"];
    REQUIRE(dur >= 0);
    const bool inserted = out.emplace(e["args"]["chunk"].get<std::uint64_t>(), Slice{ts, ts + dur})
                              .second;
    CHECK(inserted);  // one slice per chunk per stage
  }
  return out;
}

}  // namespace

TEST_CASE("trace: a multi-chunk load gives one slice per chunk per stage, and reads overlap "
          "uploads and broadcasts",
          "[trace]") {
  TempDir dir;
  const auto synth = write_synthetic_checkpoint(dir / "ckpt", SynthOptions{10'000'000});
  LoadOptions options;
  options.chunk_bytes = 64 << 10;
  options.buffer_depth = 4;
  options.io_depth = 4;
  TraceRecorder recorder(0);
  options.on_stage_event = recorder.hook();
  const LoadResult result = load(synth.checkpoint, options);
  const std::uint64_t chunks = result.stats.chunks;
  REQUIRE(chunks > 100);
  CHECK(recorder.size() == 3 * chunks);
  CHECK(recorder.dropped() == 0);

  const auto trace_path = dir / "trace.json";
  recorder.write(trace_path);
  const auto trace = read_json(trace_path);

  // Track names: one thread_name metadata event per stage, on pid 0.
  std::map<int, std::string> names;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
    CHECK(e["pid"] == 0);
  }
  CHECK(names == std::map<int, std::string>{{1, "read"}, {2, "upload"}, {3, "broadcast"}});

  const auto reads = slices_of(trace, 1);
  const auto uploads = slices_of(trace, 2);
  const auto broadcasts = slices_of(trace, 3);
  REQUIRE(reads.size() == chunks);
  REQUIRE(uploads.size() == chunks);
  REQUIRE(broadcasts.size() == chunks);

  // Causality per chunk: read, then upload, then broadcast. The JSON keeps 3 decimals of a
  // microsecond, so allow that rounding.
  for (std::uint64_t c = 0; c < chunks; ++c) {
    INFO("chunk " << c);
    CHECK(reads.at(c).end_us <= uploads.at(c).begin_us + 0.002);
    CHECK(uploads.at(c).end_us <= broadcasts.at(c).begin_us + 0.002);
  }

  // The pipeline overlaps: the ring lets reads of later chunks be in flight while an earlier
  // chunk is uploaded or broadcast, so some read slice of chunk k+1.. must strictly overlap
  // the upload or broadcast slice of some chunk k.
  std::uint64_t overlaps = 0;
  for (const auto& [k, read] : reads) {
    for (std::uint64_t j = (k >= 4 ? k - 4 : 0); j < k; ++j) {
      for (const Slice& other : {uploads.at(j), broadcasts.at(j)}) {
        if (read.begin_us < other.end_us && other.begin_us < read.end_us) ++overlaps;
      }
    }
  }
  INFO(overlaps << " overlapping read / upload-or-broadcast slice pairs");
  CHECK(overlaps > 0);

  // Every slice carries its chunk's shard and bytes; bytes add up to the checkpoint.
  std::uint64_t read_bytes = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == 1) read_bytes += e["args"]["bytes"].get<std::uint64_t>();
  }
  CHECK(read_bytes == result.stats.bytes);
  CHECK(trace["otherData"]["dropped_events"] == 0);
}

TEST_CASE("trace: memory is bounded, events past the bound are counted", "[trace]") {
  TraceRecorder recorder(3, 5);
  const auto t = std::chrono::steady_clock::now();
  for (std::uint64_t c = 0; c < 8; ++c) recorder.record(StageEvent{Stage::read, c, 0, 10, t, t});
  CHECK(recorder.size() == 5);
  CHECK(recorder.dropped() == 3);
  const auto trace = nlohmann::json::parse(recorder.to_json());
  CHECK(trace["otherData"]["dropped_events"] == 3);
  int slices = 0;
  for (const auto& e : trace["traceEvents"]) {
    CHECK(e["pid"] == 3);
    if (e["ph"] == "X") ++slices;
    if (e["name"] == "process_name") CHECK(e["args"]["name"] == "rank 3");
  }
  CHECK(slices == 5);
}

TEST_CASE("trace: per-rank file names", "[trace]") {
  CHECK(trace_path_for_rank("/t/load.json", 0, 1) == "/t/load.json");
  CHECK(trace_path_for_rank("/t/load.json", 0, 4) == "/t/load.json");
  CHECK(trace_path_for_rank("/t/load.json", 3, 4) == "/t/load.rank3.json");
  CHECK(trace_path_for_rank("/t/load", 2, 4) == "/t/load.rank2");
  CHECK(trace_path_for_rank("/t/{rank}/load-{rank}.json", 5, 8) == "/t/5/load-5.json");
}

TEST_CASE("trace: run --trace and the trace key write a parseable trace", "[trace][run]") {
  TempDir dir;
  const auto file =
      weightcast::test::small_checkpoint();
  const auto path = dir / "run.trace.json";
  auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set", "chunk_size=4KiB",
                    "--trace", path.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  auto trace = read_json(path);
  int slices = 0;
  for (const auto& e : trace["traceEvents"]) slices += e["ph"] == "X" ? 1 : 0;
  CHECK(slices > 0);
  CHECK(slices % 3 == 0);

  // The config key, shown in the effective config.
  const auto keyed = dir / "keyed.json";
  r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set", "trace=" + keyed.string()});
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains("trace: " + keyed.string()));
  CHECK(read_json(keyed)["traceEvents"].size() > 0);
}

TEST_CASE("trace: a load that fails midway has traced the chunks before the failure",
          "[trace]") {
  TempDir dir;
  const auto synth = write_synthetic_checkpoint(dir / "ckpt", SynthOptions{1'000'000});
  Catalogue catalogue = open_checkpoint(synth.checkpoint);
  REQUIRE(catalogue.shards.size() == 1);
  // Cut the shard in half and make the catalogue agree, so the reader meets the end of file.
  const std::uint64_t cut = catalogue.shards[0].file_bytes / 2;
  truncate_shard(catalogue, cut);
  LoadOptions options;
  options.chunk_bytes = 16 << 10;
  TraceRecorder recorder(0);
  options.on_stage_event = recorder.hook();
  expect_host_load_error(catalogue, options);
  CHECK(recorder.size() > 0);
  const auto trace = nlohmann::json::parse(recorder.to_json());
  std::uint64_t reads = 0;
  for (const auto& e : trace["traceEvents"]) reads += e["ph"] == "X" && e["tid"] == 1 ? 1 : 0;
  CHECK(reads > 0);
  CHECK(reads < catalogue.total_bytes() / options.chunk_bytes);
}
