// Progress: the loader's hook, the renderer's bar and log lines, `run --quiet` and `--json`.
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/checkpoint/synth.hpp"

#include "progress.hpp"

#include "support/paths.hpp"
#include "support/process.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>

using namespace weightcast;
using namespace weightcast::test;
using weightcast::cli::ProgressRenderer;
using namespace std::chrono_literals;

namespace {

// A memory FILE* whose text can be read back.
class MemoryFile {
 public:
  MemoryFile() : _file(open_memstream(&_buffer, &_size)) { REQUIRE(_file != nullptr); }
  ~MemoryFile() {
    std::fclose(_file);
    std::free(_buffer);
  }
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  std::FILE* get() const { return _file; }
  std::string text() {
    std::fflush(_file);
    return std::string(_buffer, _size);
  }

 private:
  char* _buffer = nullptr;
  std::size_t _size = 0;
  std::FILE* _file;
};

LoadProgress progress_at(std::uint64_t done, double seconds, std::uint64_t chunks_done = 1) {
  LoadProgress p;
  p.bytes_done = done;
  p.bytes_total = 10'000'000'000;
  p.chunks_done = chunks_done;
  p.chunks_total = 1000;
  p.shard = 1;
  p.shards = 4;
  p.shard_name = "model-00002-of-00004.safetensors";
  p.seconds = seconds;
  return p;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("progress: the loader reports every chunk, in order, up to the total", "[progress]") {
  TempDir dir;
  const auto synth = write_synthetic_checkpoint(dir / "ckpt", SynthOptions{1'000'000});
  LoadOptions options;
  options.chunk_bytes = 32 << 10;
  std::vector<LoadProgress> seen;
  options.on_progress = [&](const LoadProgress& p) { seen.push_back(p); };
  const LoadResult result = load(synth.checkpoint, options);
  REQUIRE(seen.size() == result.stats.chunks);
  std::uint64_t previous = 0;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    INFO("call " << i);
    CHECK(seen[i].chunks_done == i + 1);
    CHECK(seen[i].chunks_total == result.stats.chunks);
    CHECK(seen[i].bytes_total == result.stats.bytes);
    CHECK(seen[i].bytes_done > previous);
    CHECK(seen[i].shards == 1);
    CHECK(seen[i].shard == 0);
    previous = seen[i].bytes_done;
  }
  CHECK(seen.back().bytes_done == result.stats.bytes);
}

TEST_CASE("progress: describe() gives percent, bytes, GB/s, ETA and the shard", "[progress]") {
  const auto line = ProgressRenderer::describe(progress_at(2'500'000'000, 1.25));
  // 2.5e9 B in 1.25 s = 2.00 GB/s; 7.5e9 B left at that rate = 4 s.
  CHECK_THAT(line, Catch::Contains(" 25%") && Catch::Contains("2.33 GiB / 9.31 GiB") &&
                       Catch::Contains("2.00 GB/s") && Catch::Contains("ETA 4s") &&
                       Catch::Contains("shard 2/4 model-00002-of-00004.safetensors"));
  CHECK_THAT(ProgressRenderer::describe(progress_at(0, 0)), Catch::Contains("ETA --"));
}

TEST_CASE("progress: log lines every further 10%, at most one per 2 s", "[progress]") {
  MemoryFile out;
  const auto t0 = ProgressRenderer::Clock::time_point{} + 1000s;
  ProgressRenderer renderer(out.get(), ProgressRenderer::Mode::lines, t0);
  renderer.update(progress_at(3'000'000'000, 1), t0 + 1s);  // before 2 s: nothing
  CHECK(out.text().empty());
  renderer.update(progress_at(3'100'000'000, 2.5), t0 + 2500ms);  // 31%: a line
  CHECK(count(out.text(), "weightcast:  31%") == 1);
  renderer.update(progress_at(4'500'000'000, 3), t0 + 3s);  // within 2 s of the last: nothing
  renderer.update(progress_at(3'900'000'000, 5), t0 + 5s);  // same 10% step: nothing
  CHECK(count(out.text(), "\n") == 1);
  renderer.update(progress_at(4'600'000'000, 5), t0 + 5s);  // next step after 2 s: a line
  CHECK(count(out.text(), "\n") == 2);
  renderer.update(progress_at(4'700'000'000, 40), t0 + 40s);  // stalled 35 s: a heartbeat
  CHECK(count(out.text(), "\n") == 3);
  CHECK(out.text().find('\r') == std::string::npos);  // plain lines for logs
  renderer.finish();
  CHECK(count(out.text(), "\n") == 3);
  // Rank 0 among several labels its lines as its log lines are.
  MemoryFile ranked;
  ProgressRenderer rank0(ranked.get(), ProgressRenderer::Mode::lines, t0, "weightcast[rank 0]");
  rank0.update(progress_at(3'100'000'000, 2.5), t0 + 2500ms);
  CHECK(count(ranked.text(), "weightcast[rank 0]:  31%") == 1);
}

TEST_CASE("progress: a terminal bar redraws in place at most 10 times a second", "[progress]") {
  MemoryFile out;
  const auto t0 = ProgressRenderer::Clock::time_point{} + 1000s;
  ProgressRenderer renderer(out.get(), ProgressRenderer::Mode::bar, t0);
  renderer.update(progress_at(1'000'000'000, 0.5, 1), t0 + 10ms);   // first: drawn
  renderer.update(progress_at(2'000'000'000, 0.55, 2), t0 + 50ms);  // 40 ms later: skipped
  renderer.update(progress_at(3'000'000'000, 0.65, 3), t0 + 150ms); // 140 ms later: drawn
  CHECK(count(out.text(), "\r") == 2);
  CHECK_THAT(out.text(), Catch::Contains("[#######-----------------]  30%"));
  // The last chunk is always drawn, however soon.
  renderer.update(progress_at(10'000'000'000, 2, 1000), t0 + 160ms);
  CHECK(count(out.text(), "\r") == 3);
  CHECK_THAT(out.text(), Catch::Contains("[########################] 100%"));
  CHECK(out.text().find('\n') == std::string::npos);
  renderer.finish();  // ends the line for what follows
  CHECK(out.text().back() == '\n');
}

TEST_CASE("progress: run --json prints one JSON object on stdout, --quiet only the summary",
          "[progress][run]") {
  const auto file =
      weightcast::test::small_checkpoint();
  auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--json"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  const auto summary = nlohmann::json::parse(r.out);  // all of stdout, nothing else
  CHECK(summary["tensors"] == 4);
  CHECK(summary["rank"] == 0);
  CHECK(summary["world_size"] == 1);
  CHECK(summary["bytes"].get<std::uint64_t>() > 0);
  CHECK(summary.contains("gbps"));
  CHECK(summary.contains("peak_rss_bytes"));
  CHECK_THAT(r.err, Catch::Contains("effective config"));  // the config went to stderr

  r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--quiet"});
  REQUIRE(r.exit_status == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, !Catch::Contains("effective config") && Catch::Contains("4 tensors"));

  r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--quiet", "--json"});
  REQUIRE(r.exit_status == 0);
  CHECK(r.err.empty());
  CHECK(nlohmann::json::parse(r.out)["tensors"] == 4);
}
