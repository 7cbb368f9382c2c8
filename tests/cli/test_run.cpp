// `weightcast run` end to end: the report's digests match the manifest and an independent
// reader, on real files and on a multi-GiB sharded synthetic checkpoint.
#include "weightcast/device/device.hpp"
#include "weightcast/pipeline/digest.hpp"

#include "support/env.hpp"
#include "support/job.hpp"
#include "support/paths.hpp"
#include "support/process.hpp"
#include "support/report.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace weightcast;
using namespace weightcast::test;
namespace fs = std::filesystem;

namespace {

// XXH3 of every tensor of one safetensors file, read with plain pread and a header parsed
// by nlohmann::json: independent of weightcast's parser, plan and pipeline.
std::map<std::string, std::string> independent_digests(const std::filesystem::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  std::uint64_t n = 0;
  REQUIRE(::pread(fd, &n, 8, 0) == 8);
  std::string header(n, '\0');
  REQUIRE(::pread(fd, header.data(), n, 8) == static_cast<ssize_t>(n));
  std::map<std::string, std::string> digests;
  std::vector<char> buffer;
  const auto json = nlohmann::json::parse(header);
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") continue;
    const std::uint64_t begin = entry["data_offsets"][0];
    const std::uint64_t end = entry["data_offsets"][1];
    buffer.resize(end - begin);
    std::uint64_t done = 0;
    while (done < buffer.size()) {
      ssize_t got = ::pread(fd, buffer.data() + done, buffer.size() - done, 8 + n + begin + done);
      REQUIRE(got > 0);
      done += static_cast<std::uint64_t>(got);
    }
    digests[name] = digest_hex(xxh3_64(buffer.data(), buffer.size()));
  }
  ::close(fd);
  return digests;
}

}  // namespace

TEST_CASE("run: every real corpus file, report digests equal the manifest", "[run][corpus]") {
  TempDir dir;
  const auto manifest = corpus_manifest();
  for (const auto& [file, tensors] : manifest.items()) {
    INFO("file " << file);
    const auto report_path = dir / "report.json";
    run_corpus_file(file, report_path);
    const auto report = read_json(report_path);
    REQUIRE(report["rank"] == 0);
    REQUIRE(report["world_size"] == 1);
    check_report_matches_manifest(report, tensors);
  }
}

TEST_CASE("run: prints the effective config and a summary", "[run]") {
  const auto file = weightcast::test::small_checkpoint();
  const auto r = run_cli({"run", std::string(WEIGHTCAST_SOURCE_DIR) + "/configs/default.yaml",
                          "--set", "checkpoint=" + file.string(), "--set", "buffer_depth=2"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains("buffer_depth: 2") && Catch::Contains("4 tensors") &&
                        Catch::Contains("GB/s") && Catch::Contains("peak RSS") &&
                        Catch::Contains("io_uring"));
}

TEST_CASE("run: a malformed checkpoint exits 65 naming file and tensor", "[run][corpus]") {
  const auto file = corpus_dir() / "malformed" / "bad_overlap.safetensors";
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string()});
  CHECK(r.exit_status == 65);
  CHECK_THAT(r.err, Catch::Contains("bad_overlap.safetensors") && Catch::Contains("'w.b'"));
}

TEST_CASE("run: missing checkpoint 66, bad config 78, no checkpoint 78", "[run]") {
  CHECK(run_cli({"run", "--set", "checkpoint=/nonexistent/weights"}).exit_status == 66);
  const auto bad = run_cli({"run", "--set", "chunk_size=lots"});
  CHECK(bad.exit_status == 78);
  CHECK_THAT(bad.err, Catch::Contains("chunk_size") && Catch::Contains("lots"));
  CHECK(run_cli({"run", "--set", "checkpoint="}).exit_status == 78);
}

TEST_CASE("run: chunk_size 1 on a 2 MB checkpoint exits 78 naming the smallest that fits",
          "[run][synth]") {
  // ~1M BF16 params: about 2 million one-byte chunks, over the plan's limit of 2^20 (which
  // once cost ~90 bytes of RSS per checkpoint byte; terabytes on a 100 GB checkpoint).
  TempDir dir;
  const auto ckpt = dir / "ckpt";
  const auto synth = run_cli({"synth", ckpt.string(), "--params", "1M", "--seed", "5"});
  INFO(synth.out << synth.err);
  REQUIRE(synth.exit_status == 0);
  const auto r = run_cli({"run", "--set", "checkpoint=" + ckpt.string(), "--set", "chunk_size=1",
                          "--set", "device=host"});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Catch::Contains("chunk_size 1 (1 B) would split the checkpoint's") &&
                        Catch::Contains("over the limit of 1048576 chunks per plan") &&
                        Catch::Contains("set chunk_size to at least 2 (2 B)"));
  // (chunk_size=2 loads, but its ~1M chunks take seconds; test_plan.cpp covers the boundary.)
}

TEST_CASE("run: destination discard with several ranks is refused before any rendezvous",
          "[run]") {
  // Without the early check rank 0 would wait `timeout` for a peer that never comes.
  const auto file = weightcast::test::small_checkpoint();
  const auto start = std::chrono::steady_clock::now();
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set",
                          "destination=discard", "--set", "world.size=2", "--set",
                          "world.rank=0", "--set", "timeout=60s"});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Catch::Contains("destination: discard: needs world size 1 (got 2)"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

TEST_CASE("run: {rank} in --report PATH becomes 0 with one rank", "[run]") {
  const auto file = weightcast::test::small_checkpoint();
  test::TempDir dir;
  for (const bool json : {false, true}) {
    std::vector<std::string> args{"run", "--quiet", "--set", "checkpoint=" + file.string(),
                                  "--report", (dir / "r{rank}.json").string()};
    if (json) args.emplace_back("--json");
    const auto r = run_cli(args);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK(fs::exists(dir / "r0.json"));
    CHECK_FALSE(fs::exists(dir / "r{rank}.json"));
    fs::remove(dir / "r0.json");
  }
}

namespace {
std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("run: a --report or --trace that is one of the checkpoint's files is refused (78), "
          "the file untouched", "[run]") {
  test::TempDir dir;
  // A single file (a copy: this test writes near it), and a sharded synthetic checkpoint.
  const auto single = dir / "model.safetensors";
  fs::copy_file(weightcast::test::small_checkpoint(), single);
  const auto sharded = dir / "sharded";
  const auto synth = run_cli({"synth", sharded.string(), "--params", "4M", "--shard-size", "2MiB"});
  REQUIRE(synth.exit_status == 0);
  fs::path shard, index;
  for (const auto& e : fs::directory_iterator(sharded)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".index.json")) index = e.path();
    else if (name.ends_with(".safetensors") && shard.empty()) shard = e.path();
  }
  REQUIRE(!shard.empty());
  REQUIRE(!index.empty());
  fs::create_symlink(shard, dir / "link.json");

  struct Case {
    std::string checkpoint, option, output, says;
  };
  // Named like a checkpoint file: refused on every rank before anything else. Named
  // otherwise but reaching one (a symlink): rank 0 finds it once the checkpoint is open.
  const std::string named = "is named like a checkpoint file";
  const std::string destroy = "writing it would destroy the checkpoint";
  const std::vector<Case> cases = {
      {single.string(), "--report", single.string(), named},
      {single.string(), "--trace", (dir / "." / "model.safetensors").string(), named},
      {sharded.string(), "--trace", shard.string(), named},
      {sharded.string(), "--report", index.string(), named},
      {sharded.string(), "--report", (dir / "link.json").string(),
       "is shard " + shard.filename().string() + " of the checkpoint " + sharded.string() +
           ": " + destroy},
  };
  for (const Case& c : cases) {
    INFO(c.checkpoint << " " << c.option << " " << c.output);
    const fs::path target = fs::canonical(c.output);
    const std::string before = file_bytes(target);
    const auto r = run_cli({"run", "--quiet", "--set", "checkpoint=" + c.checkpoint, c.option,
                            c.output});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 78);
    CHECK_THAT(r.err, Catch::Contains(c.option + " " + c.output) && Catch::Contains(c.says));
    CHECK(file_bytes(target) == before);
  }
}

TEST_CASE("run: a --report or --trace that is the config file is refused (78), the config "
          "untouched",
          "[run]") {
  // The config is read like the checkpoint: `run cfg.yaml --report cfg.yaml` replaced it with
  // the report, exit 0.
  test::TempDir dir;
  const auto file = weightcast::test::small_checkpoint();
  const auto config = dir / "cfg.yaml";
  const std::string text = "checkpoint: " + file.string() + "\ndevice: host\n";
  write_file(config, text);
  fs::create_directory(dir / "sub");
  fs::create_symlink(config, dir / "sub" / "link.json");
  fs::create_hard_link(config, dir / "hard.json");
  for (const auto& [option, output] : std::vector<std::pair<std::string, fs::path>>{
           {"--report", config},
           {"--trace", dir / "." / "cfg.yaml"},
           {"--report", dir / "sub" / "link.json"},
           {"--trace", dir / "hard.json"}}) {
    INFO(option << " " << output);
    const auto r = run_cli({"run", config.string(), "--quiet", option, output.string()});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 78);
    CHECK_THAT(r.err, Catch::Contains(option + " " + output.string() + " is the config file " +
                                      config.string() + ": writing it would destroy the config"));
    CHECK(file_bytes(config) == text);
  }
}

TEST_CASE("run: --report and --trace naming one file through a symlink are refused", "[run]") {
  test::TempDir dir;
  const auto file = weightcast::test::small_checkpoint();
  { std::ofstream(dir / "same.json") << "{}"; }
  fs::create_symlink(dir / "same.json", dir / "same_link.json");
  const auto r = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string(), "--report",
                          (dir / "same.json").string(), "--trace",
                          (dir / "same_link.json").string()});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Catch::Contains("are the same file"));
  CHECK(file_bytes(dir / "same.json") == "{}");
}

TEST_CASE("run: a checkpoint of more shards than the soft open-file limit loads", "[run]") {
  // Rank 0 keeps every shard open; the launcher raises the soft limit to the hard one.
  test::TempDir dir;
  const auto checkpoint = dir / "many";
  const auto synth = run_cli({"synth", checkpoint.string(), "--params", "4M", "--shard-size",
                              "64KiB"});
  REQUIRE(synth.exit_status == 0);
  REQUIRE(std::distance(fs::directory_iterator(checkpoint), fs::directory_iterator()) > 100);
  const auto r = run_process({"/bin/bash", "-c",
                              "ulimit -Sn 32 && exec \"$0\" run --quiet --set checkpoint=\"$1\" "
                              "--set direct_io=off",
                              cli_path().string(), checkpoint.string()});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains("shards"));
}

TEST_CASE("run: transport mpi or nccl in a world of one rank is a config error saying why",
          "[run]") {
  const auto file = weightcast::test::small_checkpoint();
  for (const std::string transport : {"mpi", "nccl"}) {
    const auto r = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string(), "--set",
                            "transport=" + transport});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 78);
    CHECK_THAT(r.err, Catch::Contains("transport: " + transport + ": this is a world of one rank") &&
                          Catch::Contains("weightcast launch -n N"));
  }
}

TEST_CASE("run: a world of one picks its GPU by the world's local rank, as several ranks do",
          "[run]") {
  if (cuda_device_count() > 0) {
    WARN("skipped: this machine has a CUDA device; the [gpu] tests cover it");
    return;
  }
  // Without a usable GPU, device: cuda fails naming the ordinal it was asked for: the local
  // rank that picks the GPU. One rank took it from LOCAL_RANK alone, where several ranks
  // (run_ranks) took the detected world's: world.local_rank, then the launcher's variable.
  ScopedEnv clean(no_launcher_env());
  struct Case {
    std::vector<std::string> sets;
    std::vector<std::string> env;
    int local_rank;
  };
  const std::vector<Case> cases = {
      {{"--set", "world.local_rank=2"}, {}, 2},
      {{"--set", "world.local_rank=6"}, {"LOCAL_RANK=1"}, 6},
      {{}, {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=3"}, 3},
      {{}, {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1", "OMPI_COMM_WORLD_LOCAL_RANK=5"},
       5},
      {{}, {"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=1"}, 1},
      {{}, {"LOCAL_RANK=4"}, 4},  // alone, as before: a world of one whose GPU is 4
      {{}, {"SLURM_LOCALID=7"}, 7},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"run", "--set", "checkpoint=/does/not/matter", "--set",
                                     "device=cuda"};
    args.insert(args.end(), c.sets.begin(), c.sets.end());
    const auto r = run_cli(args, c.env, 60);
    INFO(fmt::format("{} {}", fmt::join(c.sets, " "), fmt::join(c.env, " ")) << "\n"
                                                                            << r.out << r.err);
    CHECK(r.exit_status == 69);
    CHECK_THAT(r.out, Catch::Contains(fmt::format("# world: rank 0 of 1 (local rank {})",
                                                  c.local_rank)));
    CHECK_THAT(r.err, Catch::Contains(fmt::format("cuda:{}:", c.local_rank)));
  }
}

TEST_CASE("run: verify none leaves the digests out of --report, discard's too", "[run]") {
  const auto file = weightcast::test::small_checkpoint();
  test::TempDir dir;
  const auto report = dir / "r.json";
  for (const std::string verify : {"digest", "none"}) {
    for (const std::string destination : {"arena", "discard"}) {
      INFO(verify << " " << destination);
      const auto r = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string(), "--set",
                              "verify=" + verify, "--set", "destination=" + destination,
                              "--report", report.string()});
      INFO(r.out << r.err);
      REQUIRE(r.exit_status == 0);
      const auto got = read_json(report);
      REQUIRE(got["tensors"].size() > 0);
      // discard hashes as the bytes stream past unless verify: none, which leaves the read
      // stage alone (what a read benchmark wants: bench/read_bench.sh).
      const bool expect_digests = verify == "digest";
      for (const auto& [name, tensor] : got["tensors"].items()) {
        INFO(name);
        CHECK(tensor.contains("shape"));
        CHECK(tensor.contains("xxh3") == expect_digests);
      }
    }
  }
}

TEST_CASE("run: a multi-GiB sharded synthetic checkpoint loads bit-exact", "[run][synth][large]") {
  TempDir dir;
  const auto ckpt = dir / "ckpt";
  const auto synth = run_cli({"synth", ckpt.string(), "--params", "1200M", "--shard-size", "1GiB",
                              "--seed", "7"});
  INFO(synth.out << synth.err);
  REQUIRE(synth.exit_status == 0);
  REQUIRE(std::filesystem::exists(ckpt / "model.safetensors.index.json"));

  std::uint64_t total = 0;
  std::map<std::string, std::string> expected;
  for (const auto& entry : std::filesystem::directory_iterator(ckpt)) {
    if (entry.path().extension() != ".safetensors") continue;
    total += std::filesystem::file_size(entry.path());
    expected.merge(independent_digests(entry.path()));
  }
  REQUIRE(total > (2ull << 30));  // multi-GiB

  const auto report_path = dir / "report.json";
  const auto r = run_cli({"run", "--set", "checkpoint=" + ckpt.string(), "--set",
                          "chunk_size=16MiB", "--report", report_path.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  const auto report = read_json(report_path);
  REQUIRE(report["tensors"].size() == expected.size());
  for (const auto& [name, digest] : expected) {
    INFO("tensor " << name);
    CHECK(report["tensors"][name]["xxh3"] == digest);
  }
}

TEST_CASE("run: a --report or --trace path that cannot be written fails before the load",
          "[run]") {
  // Found after the load it cost the whole load and said only "cannot write the report".
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  const std::string missing = (dir / "no-such-dir" / "out.json").string();
  for (const std::string option : {"--report", "--trace"}) {
    const std::string what = option == "--report" ? "the report" : "the trace file";
    INFO(option);
    auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), option, missing});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 74);
    CHECK_THAT(r.err, Catch::Contains(missing + ": cannot create " + what +
                                      ": No such file or directory"));
    CHECK_THAT(r.out, !Catch::Contains("GB/s"));  // no load, so no summary
    // A directory is no file to write.
    r = run_cli({"run", "--set", "checkpoint=" + file.string(), option, dir.path().string()});
    CHECK(r.exit_status == 74);
    CHECK_THAT(r.err, Catch::Contains(": cannot create " + what + ": Is a directory"));
    CHECK_THAT(r.out, !Catch::Contains("GB/s"));
  }
  // An existing file that cannot be written is not "created" (a read-only sysfs attribute:
  // refused even to root).
  if (fs::exists("/sys/kernel/uevent_seqnum")) {
    const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--report",
                            "/sys/kernel/uevent_seqnum"});
    CHECK(r.exit_status == 74);
    CHECK_THAT(r.err, Catch::Contains("/sys/kernel/uevent_seqnum: cannot open the report for "
                                      "writing: "));
    CHECK_THAT(r.out, !Catch::Contains("GB/s"));
  }
  // A write that fails after the load (/dev/full: ENOSPC) says why too.
  if (fs::exists("/dev/full")) {
    const auto r = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string(),
                            "--report", "/dev/full"});
    CHECK(r.exit_status == 74);
    CHECK_THAT(r.err, Catch::Contains("/dev/full: cannot write the report: No space left on "
                                      "device"));
  }
  // The check leaves nothing behind when the load then fails, and keeps an existing report
  // whole until there is a new one to write.
  const auto report = dir / "r.json";
  auto r = run_cli({"run", "--set", "checkpoint=/nonexistent/weights", "--report",
                    report.string()});
  CHECK(r.exit_status == 66);
  CHECK_FALSE(fs::exists(report));
  { std::ofstream(report) << "old"; }
  r = run_cli({"run", "--set", "checkpoint=/nonexistent/weights", "--report", report.string()});
  CHECK(r.exit_status == 66);
  CHECK(read_file(report) == "old");
}

TEST_CASE("run: checking a missing --report or --trace creates no name in its directory",
          "[run]") {
  // The check made the file and removed it again; a rank ended between the two (another
  // rank's ABORT _exits it) left an empty report behind. inotify sees every name created.
  // Under the seccomp helper O_TMPFILE is refused, as on NFS: the check falls back to the
  // directory's permissions, which creates no name either.
  std::vector<std::vector<std::string>> wrappers = {{}};
#ifdef WEIGHTCAST_SECCOMP_HELPER_PATH
  wrappers.push_back({WEIGHTCAST_SECCOMP_HELPER_PATH, "--deny-o-tmpfile"});
#else
  WARN("built without libseccomp: the file system without O_TMPFILE is not tested");
#endif
  for (const auto& wrapper : wrappers) {
    INFO((wrapper.empty() ? "O_TMPFILE" : "O_TMPFILE refused"));
    TempDir dir;
    { std::ofstream(dir / "file") << "x"; }
    const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    REQUIRE(watch >= 0);
    REQUIRE(::inotify_add_watch(watch, dir.path().c_str(), IN_CREATE | IN_MOVED_TO) >= 0);
    const auto run = [&](const std::vector<std::string>& args) {
      std::vector<std::string> argv = wrapper;
      argv.push_back(cli_path().string());
      argv.insert(argv.end(), args.begin(), args.end());
      return run_process(argv);
    };
    for (const std::string option : {"--report", "--trace"}) {
      const std::string what = option == "--report" ? "the report" : "the trace file";
      INFO(option);
      auto r = run({"run", "--set", "checkpoint=/nonexistent/weights", option,
                    (dir / "out.json").string()});
      INFO(r.out << r.err);
      CHECK(r.exit_status == 66);  // past the check, the checkpoint is missing
      // What cannot be created is still found before the load.
      r = run({"run", "--set", "checkpoint=/nonexistent/weights", option,
               (dir / "no-such-dir" / "out.json").string()});
      CHECK(r.exit_status == 74);
      CHECK_THAT(r.err, Catch::Contains(": cannot create " + what +
                                        ": No such file or directory"));
      r = run({"run", "--set", "checkpoint=/nonexistent/weights", option,
               (dir / "file" / "out.json").string()});
      CHECK(r.exit_status == 74);
      CHECK_THAT(r.err, Catch::Contains(": cannot create " + what + ": Not a directory"));
    }
    alignas(inotify_event) char events[4096];
    const ssize_t n = ::read(watch, events, sizeof events);
    std::vector<std::string> created;
    for (ssize_t at = 0; at < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(events + at);
      created.emplace_back(event->len > 0 ? event->name : "");
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
    ::close(watch);
    CHECK(created.empty());
    CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
  }
}

TEST_CASE("run: a --report or --trace through a dangling symlink writes its target and keeps "
          "the link", "[run]") {
  // The check created the target, then unlinked the path it was given: the link itself.
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  fs::create_directory(dir / "out");
  for (const std::string option : {"--report", "--trace"}) {
    INFO(option);
    const auto link = dir / ("link" + option + ".json");
    const auto target = dir / "out" / ("target" + option + ".json");
    fs::create_symlink(fs::path("out") / target.filename(), link);  // relative, dangling
    // A failed load leaves the link as it was and creates no target.
    auto r = run_cli({"run", "--set", "checkpoint=/nonexistent/weights", option, link.string()});
    CHECK(r.exit_status == 66);
    CHECK(fs::is_symlink(link));
    CHECK_FALSE(fs::exists(target));
    // A load writes through the link.
    r = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string(), option,
                 link.string()});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 0);
    CHECK(fs::is_symlink(link));
    REQUIRE(fs::exists(target));
    CHECK(read_json(target).is_object());
  }
  // A link to a missing directory fails like the missing directory itself.
  fs::create_symlink(dir / "no-such-dir" / "r.json", dir / "to-nowhere.json");
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--report",
                          (dir / "to-nowhere.json").string()});
  CHECK(r.exit_status == 74);
  CHECK_THAT(r.err, Catch::Contains((dir / "to-nowhere.json").string() +
                                    ": cannot create the report: No such file or directory"));
  CHECK(fs::is_symlink(dir / "to-nowhere.json"));
}

TEST_CASE("run: a --report or --trace that cannot be written whole leaves the previous file as "
          "it was", "[run]") {
  // The file was truncated, then written until the file system was full: a good report
  // became a cut-short, invalid JSON (or 0 bytes). RLIMIT_FSIZE (`ulimit -f`, SIGXFSZ
  // ignored) fails the write with EFBIG where a full file system fails it with ENOSPC.
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  for (const std::string option : {"--report", "--trace"}) {
    const std::string what = option == "--report" ? "the report" : "the trace file";
    INFO(option);
    const auto out = dir / ("out" + option + ".json");
    const std::vector<std::string> args = {"run", "--quiet", "--set",
                                           "checkpoint=" + checkpoint.string(), "--set",
                                           "chunk_size=1MiB", option};
    auto with_out = [&](const fs::path& path) {
      auto all = args;
      all.push_back(path.string());
      return all;
    };
    auto r = run_cli(with_out(out));
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    const std::string good = read_file(out);
    REQUIRE(good.size() > 4096);  // past the limit below, whichever unit `ulimit -f` counts
    fs::permissions(out, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);

    // SIGXFSZ ignored by the caller, or left at its default (which killed weightcast with
    // no word, 153, and left the temporary file): EFBIG either way.
    for (const std::string trap : {"trap '' XFSZ; ", ""}) {
      INFO("trap: " << trap);
      std::vector<std::string> limited = {"/bin/bash", "-c",
                                          trap + "ulimit -f 4 && exec \"$@\"", "bash",
                                          cli_path().string()};
      for (const auto& arg : with_out(out)) limited.push_back(arg);
      r = run_process(limited);
      INFO(r.out << r.err);
      CHECK(r.exit_status == 74);
      CHECK_THAT(r.err, Catch::Contains(out.string() + ": cannot write " + what +
                                        ": File too large"));
      CHECK(read_file(out) == good);  // byte for byte
    }
    CHECK(fs::status(out).permissions() ==
          (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
    // No temporary file is left beside it.
    for (const auto& entry : fs::directory_iterator(dir.path())) {
      CHECK_THAT(entry.path().filename().string(), !Catch::Contains(".partial-"));
    }

    // Written through a symbolic link: the link stays, its target is replaced and keeps its
    // mode; a new file gets 0666 less the umask.
    const auto link = dir / ("link" + option + ".json");
    fs::create_symlink(out.filename(), link);
    r = run_cli(with_out(link));
    REQUIRE(r.exit_status == 0);
    CHECK(fs::is_symlink(link));
    CHECK(read_json(out).is_object());
    CHECK(fs::status(out).permissions() ==
          (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
    const auto fresh = dir / ("fresh" + option + ".json");
    const mode_t mask = ::umask(0);
    ::umask(mask);
    r = run_cli(with_out(fresh));
    REQUIRE(r.exit_status == 0);
    CHECK(static_cast<mode_t>(fs::status(fresh).permissions()) == (0666 & ~mask));

    // /dev/stdout redirected to a file names the open file, not a place in a directory: it
    // is written in place, never renamed over (stdout would go on to an unnamed file).
    const auto redirected = dir / ("stdout" + option + ".txt");
    { std::ofstream(redirected) << "x"; }
    // ... through stdout's own descriptor: `>> log` kept what the log held, and the summary
    // no longer overwrites the start of the report (both wrote at offset 0 of their own).
    {
      std::vector<std::string> append = {"/bin/bash", "-c", "exec \"$@\" >> \"$0\"",
                                         redirected.string(), cli_path().string(), "run",
                                         "--set", "checkpoint=" + checkpoint.string(), option,
                                         "/dev/stdout"};
      r = run_process(append);
      CHECK(r.exit_status == 0);
      const std::string text = read_file(redirected);
      CHECK_THAT(text, Catch::StartsWith("x"));
      CHECK_THAT(text, Catch::Contains("# rank 0 of 1"));
      const auto open = text.find("\n{");
      REQUIRE(open != std::string::npos);
      CHECK(nlohmann::json::parse(text.substr(open, text.rfind('}') + 1 - open),
                                  nullptr, false)
                .is_object());
    }
    const auto inode = [](const fs::path& path) {
      struct stat st {};
      REQUIRE(::stat(path.c_str(), &st) == 0);
      return st.st_ino;
    };
    const auto before = inode(redirected);
    std::vector<std::string> to_stdout = {"/bin/bash", "-c", "exec \"$@\" > \"$0\"",
                                          redirected.string(), cli_path().string()};
    for (const auto& arg : with_out("/dev/stdout")) to_stdout.push_back(arg);
    r = run_process(to_stdout);
    CHECK(r.exit_status == 0);
    CHECK(inode(redirected) == before);
  }
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    CHECK_THAT(entry.path().filename().string(), !Catch::Contains(".partial-"));
  }
}

TEST_CASE("run: --quiet prints the summary but not where the report went", "[run]") {
  // README: --quiet prints only errors and the summary; "# report written to" is a notice,
  // like the trace's "written to" (a log line that --quiet silences).
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  const auto report = dir / "r.json";
  auto r = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string(), "--report",
                    report.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK(fs::exists(report));
  CHECK_THAT(r.out, Catch::Contains("4 tensors") && !Catch::Contains("report written"));
  CHECK(r.err.empty());
  r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--report", report.string()});
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains("# report written to " + report.string()));
}

TEST_CASE("run: --report and --trace naming the same file are refused before the load",
          "[run]") {
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  const auto path = (dir / "out.json").string();
  const auto same = (dir / "." / "out{rank}.json").string();  // r0: the same file, spelled apart
  for (const auto& [report, trace] :
       {std::pair{path, path}, std::pair{same, (dir / "out0.json").string()}}) {
    const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--report", report,
                            "--trace", trace});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 78);
    CHECK_THAT(r.err, Catch::Contains("--report " + report) &&
                          Catch::Contains("--trace " + trace) &&
                          Catch::Contains("same file"));
    CHECK_THAT(r.out, !Catch::Contains("GB/s"));
  }
  // launch refuses it before it starts any rank; here only rank 1's paths collide (its trace
  // is t.rank1.json).
  const auto r = run_cli({"launch", "-n", "2", "--spawner", "local", "--set",
                          "checkpoint=" + file.string(), "--report",
                          (dir / "t.rank{rank}.json").string(), "--trace",
                          (dir / "t.json").string()});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Catch::Contains("rank 1's report and rank 1's trace are the same file"));
  CHECK_THAT(r.out + r.err, !Catch::Contains("local ranks"));
  // Across ranks too: rank 1's trace (t.rank1.json) is rank 0's report.
  const auto across = run_cli({"launch", "-n", "2", "--spawner", "local", "--set",
                               "checkpoint=" + file.string(), "--report",
                               (dir / "t.rank1.json").string(), "--trace",
                               (dir / "t.json").string()});
  INFO(across.out << across.err);
  CHECK(across.exit_status == 78);
  CHECK_THAT(across.err, Catch::Contains("rank 0's report and rank 1's trace are the same file"));
}

TEST_CASE("run and launch: --report and --trace that reach one file not yet created are "
          "refused", "[run]") {
  // Compared only where the file existed, or spelled alike: "./x" and "x", or two dangling
  // links to one target, loaded and the report silently replaced the trace.
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  fs::create_directory(dir / "sub");
  fs::create_symlink("target.json", dir / "a.json");  // dangling, both to one target
  fs::create_symlink("target.json", dir / "b.json");
  fs::create_symlink("a.json", dir / "chain.json");   // a link to a link
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"./x.json", "x.json"},
      {"sub/../x.json", "x.json"},
      {"a.json", "b.json"},
      {"target.json", "a.json"},
      {"chain.json", "b.json"},
  };
  for (const auto& [report, trace] : pairs) {
    INFO("--report " << report << " --trace " << trace);
    // Relative paths, as typed: run from the directory.
    const auto r = run_process({"/bin/sh", "-c",
                                "cd \"$1\" && exec \"$0\" run --set checkpoint=\"$2\" "
                                "--report \"$3\" --trace \"$4\"",
                                cli_path().string(), dir.path().string(), file.string(), report,
                                trace});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 78);
    CHECK_THAT(r.err, Catch::Contains("same file"));
    CHECK_THAT(r.out, !Catch::Contains("GB/s"));
  }
  CHECK_FALSE(fs::exists(dir / "x.json"));
  CHECK_FALSE(fs::exists(dir / "target.json"));
  // Across ranks: rank 1's report is a link to the file that is rank 0's trace (and rank
  // 1's is m.rank1.json). launch checks every rank; a rank under another launcher checks
  // its own paths against every other rank's.
  fs::create_symlink("m.json", dir / "lnk_r1.json");
  const std::vector<std::string> sets = {"--set", "checkpoint=" + file.string(), "--report",
                                         (dir / "lnk_r{rank}.json").string(), "--trace",
                                         (dir / "m.json").string()};
  const auto with_sets = [&](std::vector<std::string> argv) {
    argv.insert(argv.end(), sets.begin(), sets.end());
    return argv;
  };
  const auto launched = run_cli(with_sets({"launch", "-n", "2", "--spawner", "local"}));
  INFO(launched.out << launched.err);
  CHECK(launched.exit_status == 78);
  CHECK_THAT(launched.err, Catch::Contains("rank 0's trace and rank 1's report are the same "
                                           "file"));
  CHECK_THAT(launched.out + launched.err, !Catch::Contains("local ranks"));
  const auto rank1 = run_cli(with_sets({"run"}), {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1",
                                                  "MASTER_ADDR=127.0.0.1",
                                                  "MASTER_PORT=29500"});
  INFO(rank1.out << rank1.err);
  CHECK(rank1.exit_status == 78);
  CHECK_THAT(rank1.err, Catch::Contains("rank 1's report and rank 0's trace are the same file"));
  CHECK_FALSE(fs::exists(dir / "m.json"));
}

TEST_CASE("run: an empty checkpoint's summary names no reader rather than an empty one",
          "[run][corpus]") {
  const auto file = corpus_dir() / "malformed" / "ok_empty_checkpoint.safetensors";
  const auto text = run_cli({"run", "--quiet", "--set", "checkpoint=" + file.string()});
  INFO(text.out << text.err);
  REQUIRE(text.exit_status == 0);
  CHECK_THAT(text.out, Catch::Contains("0 tensors") &&
                           Catch::Contains("# reader none (nothing to read), destination"));
  CHECK_THAT(text.out, !Catch::Contains("reader  ") && !Catch::Contains("( reads)"));
  // --json says the same: "none", never "".
  const auto json = run_cli({"run", "--quiet", "--json", "--set", "checkpoint=" + file.string()});
  INFO(json.out << json.err);
  REQUIRE(json.exit_status == 0);
  const auto summary = nlohmann::json::parse(json.out);
  CHECK(summary["tensors"] == 0);
  CHECK(summary["chunks"] == 0);
  CHECK(summary["reader"] == "none");
  CHECK(summary["io_mode"] == "none");
}

TEST_CASE("run and launch: a count of one reads in the singular", "[run]") {
  // "1 tensors", "1 chunks", "launch: 1 local ranks".
  TempDir dir;
  const auto file = dir / "one.safetensors";
  write_file(file, make_safetensors(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                                    zeros(4)));
  const auto r = run_cli({"run", "--set", "checkpoint=" + file.string(), "--set", "device=host"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  CHECK_THAT(r.out, Catch::Contains("# rank 0 of 1: 1 tensor, 1 shard, ") &&
                        Catch::Contains(", 1 chunk of <= "));
  const auto launch = run_cli({"launch", "-n", "1", "--spawner", "local", "--set",
                               "checkpoint=" + file.string(), "--set", "device=host", "--set",
                               "transport=local"});
  INFO(launch.out << launch.err);
  REQUIRE(launch.exit_status == 0);
  CHECK_THAT(launch.err, Catch::Contains("launch: 1 local rank\n"));
}

namespace {

// `weightcast run` of @p checkpoint in the background, sleeping @p delay_ms after each chunk
// (test hook), so that a test can signal it mid-load; REQUIREs that the first chunk lands.
std::unique_ptr<BackgroundJob> start_slow_run(const fs::path& checkpoint, int delay_ms,
                                              const fs::path& trace) {
  auto job = std::make_unique<BackgroundJob>(
      std::vector<std::string>{cli_path().string(), "run", "--set",
                               "checkpoint=" + checkpoint.string(), "--set", "device=host",
                               "--set", "chunk_size=1MiB", "--trace", trace.string()},
      std::vector<std::string>{"WEIGHTCAST_TEST_CHUNK_DELAY_MS=" + std::to_string(delay_ms)});
  REQUIRE(job->wait_for_output("the first chunk landed", 60));
  return job;
}

}  // namespace

TEST_CASE("run: SIGTERM or SIGINT during the load stops it at once, writes the trace and exits "
          "128 + signal", "[run][signal]") {
  using Catch::Matchers::Contains;
  using Catch::Matchers::EndsWith;
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  for (const auto& [sig, name, status] :
       {std::tuple{SIGTERM, "SIGTERM", 143}, std::tuple{SIGINT, "SIGINT", 130}}) {
    INFO(name);
    const auto trace = dir / (std::string(name) + ".json");
    // 100 ms after each chunk: unstopped, the load would take some 2 s more.
    const auto job = start_slow_run(checkpoint, 100, trace);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(::kill(job->pid(), sig) == 0);
    const auto r = job->wait(60);
    const auto took = std::chrono::steady_clock::now() - start;
    INFO(r.out);
    CHECK(r.term_signal == 0);  // it ended itself, not by the signal's default action
    CHECK(r.exit_status == status);
    CHECK_THAT(r.out, EndsWith("weightcast: error: interrupted by " + std::string(name) +
                               " during the load\n"));
    CHECK_THAT(r.out, !Contains("GB/s"));  // no summary
    CHECK(took < std::chrono::seconds(1));
    // The trace of the stopped load, as for any failed load: the chunks before the signal.
    REQUIRE(fs::exists(trace));
    CHECK(read_json(trace)["traceEvents"].size() > 1);
  }
}

TEST_CASE("run: a second SIGTERM while the load stops ends the process at once",
          "[run][signal]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  // 3 s after each chunk: the first SIGTERM's stop waits for the hook's sleep to end.
  const auto job = start_slow_run(checkpoint, 3000, dir / "trace.json");
  REQUIRE(::kill(job->pid(), SIGTERM) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(job->running());  // stopping, not killed by the first
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(::kill(job->pid(), SIGTERM) == 0);
  const auto r = job->wait(60);
  INFO(r.out);
  CHECK(r.term_signal == SIGTERM);  // the default action, at once
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

TEST_CASE("run and inspect: a FIFO or a device is refused at once, never waited on",
          "[run][fifo]") {
  // open(2) of a FIFO blocks until a writer (or reader) comes, and before `timeout` applies:
  // these hung until killed. Each run below has 20 s before run_cli kills it and fails.
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  auto make_fifo = [&](const fs::path& path) {
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    return path.string();
  };
  constexpr int limit_s = 20;

  SECTION("a FIFO checkpoint, index or shard: 66, or 65 where an index names it") {
    const std::string fifo = make_fifo(dir / "f.safetensors");
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"run", "-q", "--set", "checkpoint=" + fifo, "--set",
                                   "timeout=2s"},
          std::vector<std::string>{"inspect", fifo}}) {
      INFO(args.front());
      const auto r = run_cli(args, {}, limit_s);
      CHECK(r.exit_status == 66);
      CHECK_THAT(r.err, Catch::Contains(fifo + ": is a FIFO, expected a .safetensors file"));
    }
    const std::string index = make_fifo(dir / "model.safetensors.index.json");
    auto r = run_cli({"inspect", index}, {}, limit_s);
    CHECK(r.exit_status == 66);
    CHECK_THAT(r.err, Catch::Contains(index + ": is a FIFO, expected a .safetensors.index.json "
                                              "index file"));
    // A directory whose index names a FIFO shard.
    const fs::path sharded = dir / "sharded";
    fs::create_directory(sharded);
    write_file(sharded / "model.safetensors.index.json",
               R"({"weight_map": {"w": "model-00001-of-00001.safetensors"}})");
    make_fifo(sharded / "model-00001-of-00001.safetensors");
    r = run_cli({"inspect", sharded.string()}, {}, limit_s);
    CHECK(r.exit_status == 65);
    CHECK_THAT(r.err, Catch::Contains("is not a regular file"));
  }
  SECTION("a FIFO or a device as the config file: 78") {
    const std::string fifo = make_fifo(dir / "fifo.yaml");
    auto r = run_cli({"run", fifo}, {}, limit_s);
    CHECK(r.exit_status == 78);
    CHECK_THAT(r.err, Catch::Contains(fifo + ": is a FIFO, not a YAML config file"));
    if (fs::exists("/dev/zero")) {  // endless: it was read until memory ran out
      r = run_cli({"run", "/dev/zero"}, {}, limit_s);
      CHECK(r.exit_status == 78);
      CHECK_THAT(r.err, Catch::Contains("/dev/zero: is a character device, not a YAML config"));
    }
  }
  SECTION("a FIFO as --report or --trace: 74 before the load; /dev/null still works") {
    const std::string fifo = make_fifo(dir / "out.json");
    for (const std::string option : {"--report", "--trace"}) {
      INFO(option);
      auto r = run_cli({"run", "-q", "--set", "checkpoint=" + file.string(), option, fifo}, {},
                       limit_s);
      CHECK(r.exit_status == 74);
      CHECK_THAT(r.err, Catch::Contains(fifo + ": is a FIFO, not a regular file"));
      CHECK_THAT(r.out, !Catch::Contains("GB/s"));
      r = run_cli({"run", "-q", "--set", "checkpoint=" + file.string(), option, "/dev/null"}, {},
                  limit_s);
      CHECK(r.exit_status == 0);
      CHECK_THAT(r.out, Catch::Contains("GB/s"));
    }
    // Both to /dev/null is no clash: a device keeps nothing one could overwrite.
    const auto r = run_cli({"run", "-q", "--set", "checkpoint=" + file.string(), "--report",
                            "/dev/null", "--trace", "/dev/null"},
                           {}, limit_s);
    CHECK(r.exit_status == 0);
  }
}

TEST_CASE("run: the checkpoint named as the config file is refused with a hint", "[run]") {
  // It was read whole as YAML: a 4 GiB checkpoint ran out of memory (exit 70).
  const auto file = weightcast::test::small_checkpoint();
  const auto r = run_cli({"run", file.string()}, {}, 30);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Catch::Contains(file.string() + ": this looks like a checkpoint") &&
                        Catch::Contains("use --set checkpoint=" + file.string()));
}

TEST_CASE("run --json and --report: a path that is not UTF-8 is written with U+FFFD",
          "[run]") {
  // JSON strings are UTF-8; nlohmann threw type_error 316 after a successful load (exit 70).
  const auto source = weightcast::test::small_checkpoint();
  TempDir dir;
  const fs::path file = dir / "ok\xfe.safetensors";
  fs::copy_file(source, file);
  const fs::path report = dir / "r\xfe.json";
  const fs::path trace = dir / "t\xfe.json";
  const auto r = run_cli({"run", "-q", "--json", "--set", "checkpoint=" + file.string(),
                          "--report", report.string(), "--trace", trace.string()},
                         {}, 60);
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  const auto summary = nlohmann::json::parse(r.out);
  CHECK(summary["checkpoint"] == (dir / "ok\xef\xbf\xbd.safetensors").string());
  CHECK(summary["trace"] == (dir / "t\xef\xbf\xbd.json").string());
  CHECK(read_json(report)["tensors"].size() > 0);
  CHECK(nlohmann::json::parse(read_file(trace))["traceEvents"].size() > 0);
}

TEST_CASE("run --report: every tensor of a 20,000-tensor checkpoint, in catalogue order",
          "[run][report]") {
  // The report was built with ordered_json's operator[], a linear search per tensor (100k
  // tensors took 35 s); its time against the tensor count is bench/header_bench.sh's, not a
  // test's. Here: the same document as before, whole and in order.
  constexpr int tensors = 20'000;
  std::string header = "{";
  std::vector<std::string> names;
  names.reserve(tensors);
  for (int i = 0; i < tensors; ++i) {
    names.push_back(fmt::format("layer.{:07}.w", i));
    header += fmt::format(R"({}"{}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})",
                          i == 0 ? "" : ",", names.back(), i, i + 1);
  }
  header += "}";
  TempDir dir;
  const auto file = dir / "many.safetensors";
  write_file(file, make_safetensors(header, zeros(tensors)));
  const auto report = dir / "r.json";
  const auto r = run_cli({"run", "-q", "--set", "checkpoint=" + file.string(), "--set",
                          "device=host", "--report", report.string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  // Each tensor with dtype, shape, global_shape, offset and xxh3, in catalogue order
  // (checked on the text: ordered_json's parser is itself quadratic).
  const std::string text = read_file(report);
  const auto parsed = nlohmann::json::parse(text);
  REQUIRE(parsed["tensors"].size() == tensors);
  std::size_t at = 0;
  for (int i = 0; i < tensors; ++i) {
    const auto& entry = parsed["tensors"][names[i]];
    if (entry.size() != 5 || entry["dtype"] != "U8") FAIL("entry " << names[i] << ": " << entry);
    at = text.find("\"" + names[i] + "\": {", at);
    if (at == std::string::npos) FAIL("tensor " << names[i] << " is out of order");
  }
}
