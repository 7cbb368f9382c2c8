// Placement on 3 ranks under mpirun: each rank's --report lists exactly its local shards,
// each bit-exact against slicing the checkpoint's bytes independently; bad rules end every
// rank with one message; a wrong byte on one rank fails the verdict naming it; a rank
// killed or stopped, or a shard cut short, in the middle of the scatter ends every rank
// with one message and status, never a hang.
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include "support/job.hpp"
#include "support/mpirun.hpp"
#include "support/paths.hpp"
#include "support/ports.hpp"
#include "support/process.hpp"
#include "support/report.hpp"
#include "support/typed_checkpoint.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

using namespace weightcast;
using namespace weightcast::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr int job_timeout_s = 120;

const std::vector<TypedTensor> tensors = {
    {"uneven", "BF16", {5, 4}},   // 5 rows on 3 ranks: 2, 2, 1
    {"few", "F32", {2, 3}},       // fewer rows than ranks: 1, 1, 0
    {"bias", "F32", {7}},         // 1-D
    {"scalar", "F32", {}},        // 0-dim: whole everywhere
    {"empty", "F16", {0, 4}},     // zero-size
    {"cols", "BF16", {64, 33}},   // a dim-1 rule: strided
    {"tp", "F32", {6, 10}},       // a TP group of ranks 1 and 2, dim 1
    {"stage", "U8", {300}},       // only rank 2 (a pipeline stage)
    {"gone", "U8", {50}},         // skipped everywhere
    {"big", "U8", {3000, 17}},    // many chunks
};

struct Expected {
  std::vector<std::uint64_t> offset, shape;
};

// One app context of mpirun: @p ranks ranks of `weightcast run` with the job's settings and
// then @p sets.
std::vector<std::string> app(int ranks, const fs::path& checkpoint, int port,
                             const std::vector<std::string>& sets, const std::string& report,
                             const std::string& timeout) {
  std::vector<std::string> argv{"-np", std::to_string(ranks), cli_path().string(), "run"};
  for (const std::string& a :
       {"checkpoint=" + checkpoint.string(), std::string("device=host"),
        std::string("transport=mpi"), "rendezvous.port=" + std::to_string(port),
        "timeout=" + timeout}) {
    argv.push_back("--set");
    argv.push_back(a);
  }
  for (const auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  if (!report.empty()) {
    argv.push_back("--report");
    argv.push_back(report);
  }
  return argv;
}

// `mpirun -np 3 weightcast run ...`.
std::vector<std::string> job_argv(const fs::path& checkpoint, int port,
                                  const std::vector<std::string>& sets,
                                  const std::string& report, const std::string& timeout = "60s") {
  std::vector<std::string> argv = mpirun_options();
  for (auto& a : app(3, checkpoint, port, sets, report, timeout)) argv.push_back(std::move(a));
  return argv;
}

ProcessResult run_job(const fs::path& checkpoint, int port, const std::vector<std::string>& sets,
                      const std::string& report, const std::vector<std::string>& env = {}) {
  return run_process(job_argv(checkpoint, port, sets, report), env, job_timeout_s);
}

// `transport: shm` (the node ring): 3 ranks by `weightcast launch --spawner local`, as
// run_job's, with @p sets after the job's own.
ProcessResult run_shm_job(const fs::path& checkpoint, const std::vector<std::string>& sets,
                          const std::string& report) {
  std::vector<std::string> args{"launch", "-n", "3", "--spawner", "local"};
  for (const std::string& a :
       {"checkpoint=" + checkpoint.string(), std::string("device=host"),
        std::string("transport=shm"), "rendezvous.port=" + std::to_string(test::free_port()),
        std::string("timeout=60s")}) {
    args.push_back("--set");
    args.push_back(a);
  }
  for (const auto& s : sets) {
    args.push_back("--set");
    args.push_back(s);
  }
  args.push_back("--report");
  args.push_back(report);
  return run_cli(args, {}, job_timeout_s);
}

// run_job under @p transport: mpi (mpirun) or shm (run_shm_job).
ProcessResult run_job_over(const std::string& transport, const fs::path& checkpoint,
                           const std::vector<std::string>& sets, const std::string& report) {
  if (transport == "shm") return run_shm_job(checkpoint, sets, report);
  return run_job(checkpoint, test::free_port(), sets, report);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

using Clock = std::chrono::steady_clock;

// The scatter under way: every rank sleeps this long after each chunk lands (the CLI's test
// hook), and the tests act once rank @p rank's first chunk has landed. A synthetic sharded
// checkpoint has some 20 chunks of 1 MiB, so some 4 s of scatter remain.
constexpr const char* chunk_delay = "WEIGHTCAST_TEST_CHUNK_DELAY_MS=200";
std::string first_chunk_landed(int rank) {
  return "[rank " + std::to_string(rank) + "]: info: test hook WEIGHTCAST_TEST_CHUNK_DELAY_MS";
}


// Checks rank @p rank's report against @p expected (tensor -> local shard), bit-exact.
void check_report(const nlohmann::json& got, const std::map<std::string, Expected>& expected,
                  const std::vector<std::string>& datas) {
  REQUIRE(got["tensors"].size() == expected.size());
  for (const auto& [name, e] : expected) {
    INFO("tensor " << name);
    REQUIRE(got["tensors"].contains(name));
    const auto& entry = got["tensors"][name];
    std::size_t t = 0;
    while (tensors[t].name != name) ++t;
    CHECK(entry["global_shape"].get<std::vector<std::uint64_t>>() == tensors[t].shape);
    CHECK(entry["shape"].get<std::vector<std::uint64_t>>() == e.shape);
    CHECK(entry["offset"].get<std::vector<std::uint64_t>>() == e.offset);
    CHECK(entry["dtype"] == tensors[t].dtype);
    const std::string bytes = slice_bytes(datas[t], tensors[t].shape,
                                          typed_element_bytes(tensors[t].dtype), e.offset,
                                          e.shape);
    CHECK(entry["xxh3"] == digest_hex(xxh3_64(bytes.data(), bytes.size())));
  }
}

// torch.chunk's rows of n for rank r of 3.
Expected rows(const TypedTensor& t, int r, int parts = 3, int part = -1) {
  if (part < 0) part = r;
  Expected e{std::vector<std::uint64_t>(t.shape.size(), 0), t.shape};
  if (t.shape.empty()) return e;
  const std::uint64_t n = t.shape[0];
  const std::uint64_t c = (n + parts - 1) / parts;
  const std::uint64_t begin = std::min<std::uint64_t>(n, c * part);
  e.offset[0] = begin;
  e.shape[0] = std::min<std::uint64_t>(n, c * (part + 1)) - begin;
  return e;
}

// Every rank's report in @p dir (r{rank}.json) holds exactly its torch.chunk rows of every
// tensor, bit-exact against @p datas.
void check_fsdp_reports(const fs::path& dir, const std::vector<std::string>& datas) {
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    std::map<std::string, Expected> expected;
    for (const auto& t : tensors) expected[t.name] = rows(t, rank);
    check_report(read_json(dir / ("r" + std::to_string(rank) + ".json")), expected, datas);
  }
}

Expected cols(const TypedTensor& t, int parts, int part) {
  Expected e{std::vector<std::uint64_t>(t.shape.size(), 0), t.shape};
  const std::uint64_t n = t.shape[1];
  const std::uint64_t c = (n + parts - 1) / parts;
  const std::uint64_t begin = std::min<std::uint64_t>(n, c * part);
  e.offset[1] = begin;
  e.shape[1] = std::min<std::uint64_t>(n, c * (part + 1)) - begin;
  return e;
}

}  // namespace

TEST_CASE("placement: fsdp on 3 ranks gives each rank exactly its Shard(0) rows - bit-exact",
          "[placement][multirank]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 31);
  // Tiny chunks cut rows and elements; 1 MiB puts the whole file in one chunk. Over shm
  // every rank copies its own rows out of the node ring (buffer_depth 2: slots reused).
  for (const std::string transport : {"mpi", "shm"})
  for (const std::string chunk : {"100B", "1MiB"}) {
    INFO("transport " << transport << ", chunk_size " << chunk);
    const std::string report = (dir / "r{rank}.json").string();
    const auto r = run_job_over(transport, path,
                                {"placement=fsdp", "chunk_size=" + chunk, "buffer_depth=2"},
                                report);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK_THAT(r.out, Contains("local shards bit-exact"));
    check_fsdp_reports(dir.path(), datas);
  }
}

TEST_CASE("placement: fsdp on 3 local ranks over transport tcp - bit-exact, no MPI",
          "[placement][multirank][tcp]") {
  // `weightcast launch --spawner local`: plain processes, rank 0 sends each rank its rows over
  // its own connection (the exchange), and the whole-tensor pieces by broadcast.
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 33);
  for (const std::string chunk : {"100B", "1MiB"}) {
    INFO("chunk_size " << chunk);
    std::vector<std::string> argv{cli_path().string(), "launch", "-n", "3", "--spawner", "local",
                                  "--report", (dir / "r{rank}.json").string()};
    for (const std::string& a :
         {"checkpoint=" + path.string(), std::string("device=host"), std::string("transport=tcp"),
          "rendezvous.port=" + std::to_string(test::free_port()), std::string("timeout=60s"),
          std::string("placement=fsdp"), "chunk_size=" + chunk}) {
      argv.push_back("--set");
      argv.push_back(a);
    }
    const auto r = run_process(argv, {}, job_timeout_s);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK_THAT(r.out, Contains("local shards bit-exact"));
    check_fsdp_reports(dir.path(), datas);
  }
}

TEST_CASE("placement: a cached checkpoint is sent from the page cache - a cold one is read",
          "[placement][multirank]") {
  // Rank 0 maps a shard it finds in the page cache and sends from the mapping (the summary's
  // io_mode "mapped"), else reads it into the staging ring; the bytes are the same either way.
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 32);
  auto io_mode_of_rank0 = [&](const std::vector<std::string>& sets) {
    std::vector<std::string> argv = job_argv(path, test::free_port(), sets, "");
    argv.push_back("--json");
    argv.push_back("-q");
    const auto r = run_process(argv, {}, job_timeout_s);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    std::string mode = "(no summary from rank 0)";
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("{\"rank\":0,", 0) != 0) continue;
      const auto summary = nlohmann::json::parse(line);
      CHECK_THAT(summary.value("verdict", std::string()), Contains("local shards bit-exact"));
      mode = summary.value("io_mode", std::string("(none)"));
    }
    return mode;
  };
  {
    // Out of the page cache: written back, then dropped (clean pages go).
    const int fd = ::open(path.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::fsync(fd) == 0);
    REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    ::close(fd);
  }
  const std::string cold = io_mode_of_rank0({"placement=fsdp", "chunk_size=1KiB"});
  CHECK(cold != "mapped");
  CHECK((cold == "direct" || cold == "buffered"));
  {
    std::ifstream in(path, std::ios::binary);  // back into the page cache
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(all.size() == fs::file_size(path));
  }
  CHECK(io_mode_of_rank0({"placement=fsdp", "chunk_size=1KiB"}) == "mapped");
  CHECK(io_mode_of_rank0({"placement=fsdp", "chunk_size=1KiB", "direct_io=off"}) == "mapped");
  // Bypassing the page cache is what direct_io: on asks for: never mapped.
  const std::string direct = io_mode_of_rank0({"placement=fsdp", "direct_io=on"});
  CHECK(direct == "direct");
  // Every rank's local shards, from the mapping, against the file's bytes.
  const std::string report = (dir / "r{rank}.json").string();
  const auto r = run_job(path, test::free_port(), {"placement=fsdp", "chunk_size=100B"}, report);
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  check_fsdp_reports(dir.path(), datas);
}

TEST_CASE("placement: rules on 3 ranks: dim-1 slices - a TP group of 2 - a stage - skip",
          "[placement][multirank]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 32);
  const std::string rules =
      "placement_rules=[{match: cols, shard: {dim: 1}}, {match: tp, shard: {dim: 1, ranks: "
      "[1, 2]}}, {match: stage, ranks: [2]}, {match: gone, skip: true}, {match: 'b*', "
      "replicate: true}]";
  for (const std::string transport : {"mpi", "shm"})
  for (const std::string chunk : {"64B", "4KiB"}) {
    INFO("transport " << transport << ", chunk_size " << chunk);
    const std::string report = (dir / "r{rank}.json").string();
    const auto r =
        run_job_over(transport, path, {"placement=fsdp", "chunk_size=" + chunk, rules}, report);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK_THAT(r.out, Contains("local shards bit-exact"));
    for (int rank = 0; rank < 3; ++rank) {
      std::map<std::string, Expected> expected;
      for (const auto& t : tensors) {
        if (t.name == "gone") continue;
        if (t.name == "stage" && rank != 2) continue;
        if (t.name == "tp" && rank == 0) continue;
        if (t.name == "cols") {
          expected[t.name] = cols(t, 3, rank);
        } else if (t.name == "tp") {
          expected[t.name] = cols(t, 2, rank - 1);
        } else if (t.name == "stage" || t.name == "bias" || t.name == "big") {
          expected[t.name] = Expected{std::vector<std::uint64_t>(t.shape.size(), 0), t.shape};
        } else {
          expected[t.name] = rows(t, rank);
        }
      }
      check_report(read_json(dir / ("r" + std::to_string(rank) + ".json")), expected, datas);
    }
  }
}

TEST_CASE("placement: replicate reports shape = global_shape and offset zeros",
          "[placement][multirank]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 33);
  const auto r = run_job(path, test::free_port(), {"chunk_size=1KiB"}, (dir / "r{rank}.json").string());
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.out, Contains("tensors bit-exact"));  // today's verdict
  for (int rank = 0; rank < 3; ++rank) {
    std::map<std::string, Expected> expected;
    for (const auto& t : tensors) {
      expected[t.name] = Expected{std::vector<std::uint64_t>(t.shape.size(), 0), t.shape};
    }
    check_report(read_json(dir / ("r" + std::to_string(rank) + ".json")), expected, datas);
  }
}

TEST_CASE("placement: a rule that cannot apply ends every rank with 78 naming rule and tensor",
          "[placement][multirank]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  write_typed_checkpoint(path, tensors, 34);
  const auto r = run_job(path, test::free_port(), {"placement_rules=[{match: bias, shard: {dim: 1}}]"}, "");
  INFO(r.out << r.err);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Contains("placement rule 1 (pattern 'bias'): shard: dim 1 is out of range "
                             "for tensor 'bias'"));
  const auto g = run_job(path, test::free_port(), {"placement_rules=[{match: '*', shard: {dim: 0, group: 2}}]"},
                         "");
  INFO(g.out << g.err);
  CHECK(g.exit_status == 78);
  CHECK_THAT(g.err, Contains("group 2 does not divide the world size 3"));
}

TEST_CASE("placement: a wrong local shard on one rank fails the verdict naming rank and tensor",
          "[placement][multirank]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  write_typed_checkpoint(path, tensors, 35);
  const auto r = run_job(path, test::free_port(), {"placement=fsdp", "chunk_size=256B"}, "",
                         {"WEIGHTCAST_TEST_CORRUPT_DIGEST_RANK=2"});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 70);
  CHECK_THAT(r.out + r.err, Contains("rank 2: tensor 'uneven' (local shard) xxh3"));
}

// ---- failures in the middle of the scatter ----------------------------------------------

TEST_CASE("placement: a rank SIGKILLed mid-scatter ends the others with 69 naming it - no hang",
          "[placement][multirank][failure]") {
  // Rank 0's MPI_Isend to rank 2, and rank 2's MPI_Irecv, may be in flight: neither can be
  // cancelled. Rank 2's control connection closes as it dies; rank 0 says so to rank 1, and
  // both end with 69 naming rank 2, long before the 60 s timeout would.
  REQUIRE_MPI();
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  BackgroundJob job(job_argv(checkpoint, test::free_port(), {"placement=fsdp", "chunk_size=1MiB"}, ""),
                    {chunk_delay});
  REQUIRE(job.wait_for_output(first_chunk_landed(2), 60));
  const pid_t victim = job.find_descendant_with_env("OMPI_COMM_WORLD_RANK=2");
  REQUIRE(victim > 0);
  const auto start = Clock::now();
  REQUIRE(::kill(victim, SIGKILL) == 0);
  const auto r = job.wait(job_timeout_s);
  INFO(r.out);
  CHECK(Clock::now() - start < std::chrono::seconds(20));  // the timeout is 60 s
  CHECK(r.exit_status != 0);
  CHECK_THAT(r.out, !Contains("bit-exact"));
  // mpirun may end ranks 0 and 1 itself (SIGTERM) once it has reaped rank 2: then it exits
  // with rank 2's 137 and says which rank was killed; otherwise the ranks' 69 is its status,
  // and the ranks name rank 2.
  if (r.exit_status == 69) {
    CHECK(count(r.out, "weightcast: error: rank 2 is gone: its control connection closed") >=
          1);
  } else {
    CHECK(r.exit_status == 137);
    CHECK_THAT(r.out, Contains("signal 9") || Contains("rank 2 is gone"));
  }
  CHECK_THAT(r.out, !Contains("no progress for"));  // not the watchdog: the death itself
}

TEST_CASE("placement: a rank stopped mid-scatter ends the job with 75 naming it",
          "[placement][multirank][failure]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  BackgroundJob job(
      job_argv(checkpoint, test::free_port(), {"placement=fsdp", "chunk_size=1MiB"}, "", "3s"),
      {chunk_delay});
  REQUIRE(job.wait_for_output(first_chunk_landed(1), 60));
  const pid_t victim = job.find_descendant_with_env("OMPI_COMM_WORLD_RANK=1");
  REQUIRE(victim > 0);
  REQUIRE(::kill(victim, SIGSTOP) == 0);
  const auto r = wait_with_stopped_rank(job, victim, job_timeout_s);
  INFO(r.out);
  CHECK(r.exit_status == 75);
  CHECK_THAT(r.out, Contains("weightcast: error: rank 0: no progress for 3000 ms") &&
                        Contains("rank(s) 1 sent nothing over the control plane for "));
}

TEST_CASE("placement: a shard cut short mid-scatter ends every rank with 74 naming the shard "
          "and the tensor", "[placement][multirank][failure]") {
  // verify: digest (the default) cannot help here: rank 0 reads the file once. The read
  // itself finds the file ended, names where, and every rank ends with rank 0's message.
  REQUIRE_MPI();
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  fs::path last;
  for (const auto& e : fs::directory_iterator(checkpoint)) {
    if (e.path().extension() == ".safetensors" && (last.empty() || e.path() > last)) {
      last = e.path();
    }
  }
  REQUIRE(!last.empty());
  BackgroundJob job(job_argv(checkpoint, test::free_port(),
                             {"placement=fsdp", "chunk_size=1MiB", "verify=digest"}, ""),
                    {chunk_delay});
  REQUIRE(job.wait_for_output(first_chunk_landed(0), 60));
  // The last shard is chunks away from rank 0's reads (its ring holds a few chunks).
  fs::resize_file(last, fs::file_size(last) / 2);
  const auto r = job.wait(job_timeout_s);
  INFO(r.out);
  CHECK(r.exit_status == 74);
  const std::string message =
      "weightcast: error: rank 0: " + last.filename().string() + ": file ended at offset ";
  CHECK(count(r.out, message) == 3);  // the same line from every rank
  CHECK_THAT(r.out, Contains(" inside tensor '") &&
                        Contains("the shard shrank after its header was read"));
}

TEST_CASE("placement: a shard whose header is corrupt ends every rank with 65 naming the file",
          "[placement][multirank][failure]") {
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  write_typed_checkpoint(path, tensors, 36);
  {
    // The header's JSON, flipped into something that is not JSON: its first '{'.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.put('!');
  }
  const auto r = run_job(path, test::free_port(), {"placement=fsdp", "verify=digest"}, "");
  INFO(r.out << r.err);
  CHECK(r.exit_status == 65);
  CHECK(count(r.out + r.err, "weightcast: error: rank 0: " + path.string()) +
            count(r.out + r.err, "weightcast: error: rank 0: model.safetensors") ==
        3);
}

TEST_CASE("placement: MPMD ranks with their own placements each get their own - a bad rule on "
          "one rank ends every rank with 78 naming it", "[placement][multirank]") {
  // Ranks may resolve different wants (MPMD); rank 0 checks them all. Rank 1 takes Shard(0)
  // while ranks 0 and 2 replicate: each gets exactly what it asked for.
  REQUIRE_MPI();
  TempDir dir;
  const auto path = dir / "model.safetensors";
  const auto datas = write_typed_checkpoint(path, tensors, 37);
  const std::string report = (dir / "r{rank}.json").string();
  {
    const int port = test::free_port();
    std::vector<std::string> argv = mpirun_options();
    auto add = [&](std::vector<std::string> part) {
      argv.insert(argv.end(), part.begin(), part.end());
    };
    add(app(1, path, port, {"chunk_size=256B"}, report, "60s"));
    argv.emplace_back(":");
    add(app(1, path, port, {"chunk_size=256B", "placement=fsdp"}, report, "60s"));
    argv.emplace_back(":");
    add(app(1, path, port, {"chunk_size=256B"}, report, "60s"));
    const auto r = run_process(argv, {}, job_timeout_s);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK_THAT(r.out, Contains("local shards bit-exact"));
    for (int rank = 0; rank < 3; ++rank) {
      std::map<std::string, Expected> expected;
      for (const auto& t : tensors) {
        expected[t.name] = rank == 1 ? rows(t, 1)
                                     : Expected{std::vector<std::uint64_t>(t.shape.size(), 0),
                                                t.shape};
      }
      INFO("rank " << rank);
      check_report(read_json(dir / ("r" + std::to_string(rank) + ".json")), expected, datas);
    }
  }
  {
    const int port = test::free_port();
    std::vector<std::string> argv = mpirun_options();
    auto add = [&](std::vector<std::string> part) {
      argv.insert(argv.end(), part.begin(), part.end());
    };
    add(app(2, path, port, {"placement=fsdp"}, "", "60s"));
    argv.emplace_back(":");
    add(app(1, path, port, {"placement=fsdp", "placement_rules=[{match: bias, shard: {dim: 1}}]"},
            "", "60s"));
    const auto r = run_process(argv, {}, job_timeout_s);
    INFO(r.out << r.err);
    CHECK(r.exit_status == 78);
    CHECK(count(r.out + r.err, "rank 2: placement rule 1 (pattern 'bias'): shard: dim 1 is out "
                               "of range for tensor 'bias'") == 3);
  }
}
