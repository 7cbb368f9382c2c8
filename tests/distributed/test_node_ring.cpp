// `transport: shm`: the node's ranks share rank 0's staging ring (a memfd handed over a Unix
// socket) and copy every chunk out of it themselves. The ring's own protocol in one process,
// then 3 real ranks: bit-exact, refused where it cannot work, and a rank killed mid-load.
#include "weightcast/core/error.hpp"
#include "weightcast/io/detail/shard_files.hpp"
#include "weightcast/transport/detail/node_ring.hpp"

#include "support/gpu.hpp"
#include "support/job.hpp"
#include "support/paths.hpp"
#include "support/ports.hpp"
#include "support/process.hpp"
#include "support/report.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace weightcast;
using namespace weightcast::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr int job_timeout_s = 120;

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> shm_sets(const std::string& timeout = "60s",
                                  const std::string& device = "host") {
  // Small chunks and two slots: every slot is reused many times.
  return {"--set", "device=" + device, "--set", "transport=shm", "--set",
          "rendezvous.port=" + std::to_string(free_port()), "--set", "timeout=" + timeout,
          "--set", "chunk_size=256KiB", "--set", "buffer_depth=2"};
}

std::set<std::string> dev_shm() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ec)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Entries of /dev/shm now that were not in @p before: other jobs on the machine (an MPI
// test's segments) may come and go meanwhile, so only what is new counts.
// What appeared in /dev/shm since @p before, less the segments Open MPI's shared-memory
// transport makes for its own jobs (`vader_segment.*`, `sm_segment.*`): ctest runs MPI tests
// beside this one, and the ring (a memfd) makes no name at all.
std::set<std::string> new_in_dev_shm(const std::set<std::string>& before) {
  std::set<std::string> added;
  for (const std::string& name : dev_shm()) {
    const bool open_mpi = name.rfind("vader_segment", 0) == 0 || name.rfind("sm_segment", 0) == 0;
    if (before.count(name) == 0 && !open_mpi) added.insert(name);
  }
  return added;
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// One rank's load of @p checkpoint, its --report written under @p dir: the tensors' digests
// every multi-rank load here must equal.
nlohmann::json one_rank_report(const TempDir& dir, const fs::path& checkpoint) {
  const auto single = run_cli({"run", "--set", "checkpoint=" + checkpoint.string(), "--set",
                               "device=host", "--report", (dir / "one.json").string()},
                              {}, job_timeout_s);
  INFO(single.out << single.err);
  REQUIRE(single.exit_status == 0);
  return read_json(dir / "one.json");
}

}  // namespace

TEST_CASE("node ring: a published chunk is found, copied and released across mappings",
          "[node_ring]") {
  auto root = detail::NodeRing::create(2, 5000, 1);
  CHECK(root.slots() == 2);
  CHECK(root.slot_bytes() % static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) == 0);
  CHECK(root.slot_bytes() >= 5000);
  // The header page holds at most 168 slots' state: more is the config's to fix.
  try {
    static_cast<void>(detail::NodeRing::create(169, 4096, 1));
    FAIL("a ring of 169 slots was created");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("buffer_depth 169 is more slots than the node ring holds "
                                  "(168 at most)"));
  }
  // A second mapping of the same memfd, as another rank has it.
  auto peer = detail::NodeRing::map(detail::UniqueFd(::dup(root.fd())));
  REQUIRE(peer.slots() == 2);
  CHECK(peer.consumers() == 1);

  // Nothing published: the wait ends at its timeout, not before and not much after.
  const auto begin = std::chrono::steady_clock::now();
  CHECK_FALSE(peer.find(0, std::chrono::milliseconds(50)).has_value());
  const auto waited = std::chrono::steady_clock::now() - begin;
  CHECK(waited >= std::chrono::milliseconds(45));
  CHECK(waited < std::chrono::milliseconds(1000));

  std::memset(root.slot_data(1) + 16, 0x5a, 100);
  root.publish(1, 0, 16, 100);
  CHECK(root.readers(1) == 1);
  const auto found = peer.find(0, std::chrono::milliseconds(0));
  REQUIRE(found.has_value());
  CHECK(found->slot == 1);
  CHECK(found->bytes == 100);
  CHECK(found->data[0] == std::byte{0x5a});
  CHECK(found->data[99] == std::byte{0x5a});
  CHECK_FALSE(peer.find(1, std::chrono::milliseconds(0)).has_value());
  peer.release(1);
  CHECK(root.readers(1) == 0);

  // A waiting consumer wakes on the publish (a futex), well before its timeout.
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    root.publish(0, 1, 0, 10);
  });
  const auto wait_begin = std::chrono::steady_clock::now();
  const auto next = peer.find(1, std::chrono::seconds(10));
  publisher.join();
  REQUIRE(next.has_value());
  CHECK(next->slot == 0);
  CHECK(std::chrono::steady_clock::now() - wait_begin < std::chrono::seconds(5));
}

TEST_CASE("node ring: the memfd travels over the abstract socket to a process of this user",
          "[node_ring]") {
  auto root = detail::NodeRing::create(1, 4096, 1);
  std::memcpy(root.slot_data(0), "ring", 4);
  detail::NodeRingServer server;
  CHECK(server.name().find('/') == std::string::npos);
  std::thread serving([&] {
    server.serve(root.fd(), 1, std::chrono::seconds(10), std::stop_token{});
  });
  auto peer = detail::NodeRing::map(
      detail::receive_node_ring(server.name(), std::chrono::seconds(10), std::stop_token{}));
  serving.join();
  CHECK(std::memcmp(peer.slot_data(0), "ring", 4) == 0);

  // Nobody comes: the hand-over ends at its timeout, saying how many came.
  detail::NodeRingServer lonely;
  try {
    lonely.serve(root.fd(), 2, std::chrono::milliseconds(200), std::stop_token{});
    FAIL("serve returned without its peers");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(), Contains("0 of 2 local ranks took the node ring"));
  }
  // A name nobody listens on: this rank is not on rank 0's node.
  try {
    static_cast<void>(detail::receive_node_ring("weightcast-ring-nobody", std::chrono::seconds(1),
                                                std::stop_token{}));
    FAIL("connected to nobody");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Contains("rank 0's node ring socket"));
  }
}

TEST_CASE("node ring: 3 ranks with transport shm are bit-exact with one rank's load",
          "[node_ring][multirank]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  const auto alone = one_rank_report(dir, checkpoint);
  REQUIRE(alone["tensors"].size() > 10);

  for (const std::string direct_io : {"off", "on"}) {
    INFO("direct_io " << direct_io);
    const auto before = dev_shm();
    const std::string report = (dir / ("r{rank}-" + direct_io + ".json")).string();
    const auto r = run_cli(cat({"launch", "-n", "3", "--set", "checkpoint=" + checkpoint.string(),
                                "--set", "direct_io=" + direct_io, "--report", report},
                               shm_sets()),
                           {}, job_timeout_s);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    CHECK(count(r.out, "bit-exact") == 1);
    for (int rank = 0; rank < 3; ++rank) {
      const auto got =
          read_json(dir / ("r" + std::to_string(rank) + "-" + direct_io + ".json"));
      CHECK(got["rank"] == rank);
      CHECK(got["world_size"] == 3);
      CHECK(got["tensors"] == alone["tensors"]);
    }
    CHECK(new_in_dev_shm(before).empty());  // the ring was a memfd: nothing named is left
  }
}

TEST_CASE("node ring: transport shm refuses a one-rank world", "[node_ring]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  const auto alone = run_cli({"run", "--set", "checkpoint=" + checkpoint.string(), "--set",
                              "device=host", "--set", "transport=shm"},
                             {}, job_timeout_s);
  CHECK(alone.exit_status == 78);
  CHECK_THAT(alone.out + alone.err, Contains("transport: shm: this is a world of one rank"));
}

TEST_CASE("node ring: a rank killed mid-load ends every rank with one message, and leaves "
          "no shared memory",
          "[node_ring][multirank]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  const std::string placement = GENERATE(as<std::string>{}, "replicate", "fsdp");
  // synth leaves the checkpoint cached, so by default every rank reads its own boxes;
  // O_DIRECT keeps the load on the ring, where rank 1 dies holding a slot.
  const std::string direct_io = GENERATE(as<std::string>{}, "auto", "on");
  INFO("placement " << placement << ", direct_io " << direct_io);
  const auto before = dev_shm();
  // 200 ms after each chunk lands on every rank: the load is still running when rank 1 dies.
  BackgroundJob job(cat({cli_path().string(), "launch", "-n", "3", "--spawner", "local",
                         "--set", "checkpoint=" + checkpoint.string(), "--set",
                         "placement=" + placement, "--set", "direct_io=" + direct_io},
                        shm_sets("20s")),
                    {"WEIGHTCAST_TEST_CHUNK_DELAY_MS=200"});
  REQUIRE(job.wait_for_output("[rank 1]: info: test hook WEIGHTCAST_TEST_CHUNK_DELAY_MS", 60));
  const pid_t rank0 = job.find_descendant_with_env("RANK=0");
  const pid_t rank1 = job.find_descendant_with_env("RANK=1");
  const pid_t rank2 = job.find_descendant_with_env("RANK=2");
  REQUIRE(rank0 > 0);
  REQUIRE(rank1 > 0);
  REQUIRE(rank2 > 0);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE(::kill(rank1, SIGKILL) == 0);
  const auto r = job.wait(job_timeout_s);
  INFO(r.out);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // < timeout
  CHECK(r.exit_status == 69);
  CHECK_THAT(r.out, Contains("weightcast launch: rank 1 was killed by signal 9"));
  // Ranks 0 and 2 each print the one line naming rank 1, and nothing else went wrong.
  CHECK(count(r.out, "weightcast: error: rank 1 is gone") == 2);
  CHECK(count(r.out, "weightcast: error:") == 2);
  for (const pid_t pid : {rank0, rank2}) {
    CHECK((::kill(pid, 0) != 0 && errno == ESRCH));
  }
  CHECK(new_in_dev_shm(before).empty());
}

TEST_CASE("node ring: a rank stopped mid-load ends the others after the timeout",
          "[node_ring][multirank]") {
  // Rank 1 holds its slot while stopped: rank 0 cannot reuse it, rank 2 waits for chunks rank
  // 0 cannot read. Neither waits forever: the watchdog (or the heartbeat) ends them. O_DIRECT
  // keeps the load on the ring: with local reads nobody waits on rank 1 until the verdict.
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  BackgroundJob job(cat({cli_path().string(), "launch", "-n", "3", "--spawner", "local",
                         "--set", "checkpoint=" + checkpoint.string(), "--set", "direct_io=on"},
                        shm_sets("3s")),
                    {"WEIGHTCAST_TEST_CHUNK_DELAY_MS=200"});
  REQUIRE(job.wait_for_output("[rank 1]: info: test hook WEIGHTCAST_TEST_CHUNK_DELAY_MS", 60));
  const pid_t rank0 = job.find_descendant_with_env("RANK=0");
  const pid_t rank1 = job.find_descendant_with_env("RANK=1");
  const pid_t rank2 = job.find_descendant_with_env("RANK=2");
  REQUIRE(rank0 > 0);
  REQUIRE(rank1 > 0);
  REQUIRE(rank2 > 0);
  REQUIRE(::kill(rank1, SIGSTOP) == 0);
  const auto start = std::chrono::steady_clock::now();
  const auto gone = [](pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; };
  while (!(gone(rank0) && gone(rank2)) &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto ended = std::chrono::steady_clock::now() - start;
  ::kill(rank1, SIGKILL);
  const auto r = job.wait(job_timeout_s);
  INFO(r.out);
  // Ranks 0 and 2 ended on their own (with 75); launch's status is then that of rank 1,
  // which the test killed while stopped.
  CHECK(ended < std::chrono::seconds(20));
  CHECK(r.exit_status != 0);
  // One message, rank 0's diagnosis naming rank 1, printed by ranks 0 and 2.
  CHECK(count(r.out, "weightcast: error: rank 0: no progress for 3000 ms (timeout)") == 2);
  CHECK(count(r.out, "weightcast: error:") == 2);
  CHECK_THAT(r.out, Contains("rank(s) 1 sent nothing over the control plane"));
}

namespace {

// Every shard of @p checkpoint out of the page cache (written back, then dropped: clean
// pages go), or back in it (read through). @return the least resident fraction of a shard,
// as the probe that decides local reads measures it.
double set_cached(const fs::path& checkpoint, bool cached) {
  double least = 1.0;
  for (const auto& entry : fs::directory_iterator(checkpoint)) {
    if (entry.path().extension() != ".safetensors") continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    if (cached) {
      std::vector<char> buffer(1 << 20);
      while (::read(fd, buffer.data(), buffer.size()) > 0) {
      }
    } else {
      REQUIRE(::fsync(fd) == 0);
      REQUIRE(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
    }
    least = std::min(least, detail::page_cache_fraction(fd, fs::file_size(entry.path())));
    ::close(fd);
  }
  return least;
}

// Each rank's `--json` summary line of a job's output, by rank.
std::map<int, nlohmann::json> summaries(const std::string& out) {
  std::map<int, nlohmann::json> by_rank;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"rank\":", 0) != 0) continue;
    const auto summary = nlohmann::json::parse(line);
    by_rank[summary["rank"].get<int>()] = summary;
  }
  return by_rank;
}

}  // namespace

TEST_CASE("node ring: a cached checkpoint is read locally by every rank, a cold one through "
          "the ring - bit-exact either way",
          "[node_ring][multirank][local_reads]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  const auto alone = one_rank_report(dir, checkpoint);
  const std::string placement = GENERATE(as<std::string>{}, "replicate", "fsdp");
  for (const bool cached : {true, false}) {
    INFO("placement " << placement << (cached ? ", page cache warm" : ", page cache dropped"));
    const double resident = set_cached(checkpoint, cached);
    if (!cached && resident > 0.5) {
      WARN("posix_fadvise(DONTNEED) left " << resident * 100 << "% cached; cold case skipped");
      continue;
    }
    const std::string tag = placement + (cached ? "-warm" : "-cold");
    const std::string report = (dir / ("r{rank}-" + tag + ".json")).string();
    const auto r = run_cli(cat({"launch", "-n", "3", "--set", "checkpoint=" + checkpoint.string(),
                                "--set", "placement=" + placement, "--set", "verify=digest",
                                "--report", report, "--json", "-q"},
                               shm_sets()),
                           {}, job_timeout_s);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    const auto by_rank = summaries(r.out);
    REQUIRE(by_rank.size() == 3);
    for (const auto& [rank, summary] : by_rank) {
      INFO("rank " << rank);
      // The path is rank 0's decision, the same on every rank, and said in every summary.
      CHECK(summary.value("node_reads", std::string()) == (cached ? "local" : "ring"));
    }
    // Rank 0 hashed what each rank should have out of the file; each rank what landed.
    CHECK_THAT(by_rank.at(0).value("verdict", std::string()), Contains("bit-exact"));
    // Warm, rank 0 copies its own boxes out of the page cache's mapping and reads nothing.
    CHECK(by_rank.at(0).value("io_mode", std::string()) ==
          (cached ? std::string("mapped") : by_rank.at(0).value("io_mode", std::string())));
    if (placement == "replicate") {
      for (int rank = 0; rank < 3; ++rank) {
        const auto got = read_json(dir / ("r" + std::to_string(rank) + "-" + tag + ".json"));
        CHECK(got["tensors"] == alone["tensors"]);
      }
    }
  }
}

TEST_CASE("node ring: direct_io on never reads locally", "[node_ring][multirank][local_reads]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  REQUIRE(set_cached(checkpoint, true) > 0.95);
  const auto r = run_cli(cat({"launch", "-n", "2", "--set", "checkpoint=" + checkpoint.string(),
                              "--set", "direct_io=on", "--json", "-q"},
                             shm_sets()),
                         {}, job_timeout_s);
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  const auto by_rank = summaries(r.out);
  REQUIRE(by_rank.size() == 2);
  for (const auto& [rank, summary] : by_rank) CHECK(summary["node_reads"] == "ring");
}

TEST_CASE("node ring: a shard rewritten in place during local reads fails every rank with 74",
          "[node_ring][multirank][local_reads][failure]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  const std::string placement = GENERATE(as<std::string>{}, "replicate", "fsdp");
  INFO("placement " << placement);
  REQUIRE(set_cached(checkpoint, true) > 0.95);
  fs::path last;
  for (const auto& e : fs::directory_iterator(checkpoint)) {
    if (e.path().extension() == ".safetensors" && (last.empty() || e.path() > last)) {
      last = e.path();
    }
  }
  REQUIRE(!last.empty());
  BackgroundJob job(cat({cli_path().string(), "launch", "-n", "3", "--spawner", "local",
                         "--set", "checkpoint=" + checkpoint.string(), "--set",
                         "placement=" + placement},
                        shm_sets("20s")),
                    {"WEIGHTCAST_TEST_CHUNK_DELAY_MS=100"});
  REQUIRE(job.wait_for_output("[rank 1]: info: test hook WEIGHTCAST_TEST_CHUNK_DELAY_MS", 60));
  {
    // Same size, other bytes: only the modification time tells (as a writer in place would).
    const int fd = ::open(last.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    const std::vector<char> junk(4096, '\x5a');
    REQUIRE(::pwrite(fd, junk.data(), junk.size(),
                     static_cast<off_t>(fs::file_size(last) - junk.size())) ==
            static_cast<ssize_t>(junk.size()));
    ::close(fd);
  }
  const auto r = job.wait(job_timeout_s);
  INFO(r.out);
  CHECK(r.exit_status == 74);
  CHECK_THAT(r.out, Contains(last.filename().string()) && Contains("changed"));
  CHECK(count(r.out, "bit-exact") == 0);  // no verdict: the load failed
}

TEST_CASE("node ring: with local reads each rank hashes the files' bytes it should have, and "
          "rank 0 finds a rank's wrong bytes",
          "[node_ring][multirank][local_reads]") {
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  REQUIRE(set_cached(checkpoint, true) > 0.95);
  const auto job = [&](const std::string& direct_io, std::vector<std::string> env) {
    return run_cli(cat({"launch", "-n", "3", "--set", "checkpoint=" + checkpoint.string(),
                        "--set", "placement=fsdp", "--set", "verify=digest", "--set",
                        "direct_io=" + direct_io, "--json", "-q"},
                       shm_sets()),
                   std::move(env), job_timeout_s);
  };
  // Warm: every rank read its own boxes and hashed them as it read; through the ring
  // (direct_io on) rank 0 hashed every rank's.
  for (const auto& [direct_io, source] :
       {std::pair<std::string, std::string>{"auto", "the bytes it read from the files"},
        {"on", "the bytes rank 0 sent it"}}) {
    INFO("direct_io " << direct_io);
    const auto r = job(direct_io, {});
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    const auto verdict = summaries(r.out).at(0).value("verdict", std::string());
    CHECK_THAT(verdict, Contains("bit-exact") && Contains(source));
  }
  // Rank 2 reports a wrong digest of its first local shard: rank 0 names it against the
  // bytes rank 2 read from the files, and every rank ends with 70.
  const auto bad = job("auto", {"WEIGHTCAST_TEST_CORRUPT_DIGEST_RANK=2"});
  INFO(bad.out << bad.err);
  CHECK(bad.exit_status == 70);
  CHECK_THAT(bad.err, Contains("local shard mismatch against the files' bytes: rank 2: tensor '"));
  CHECK_THAT(bad.err, Contains("the files held bytes of xxh3"));
}

TEST_CASE("node ring: on cuda each rank copies its own boxes out of the pinned ring to its GPU "
          "- bit-exact",
          "[gpu][node_ring][multirank]") {
  if (!gpu_available()) return;
  TempDir dir;
  const auto checkpoint = synth_sharded(dir.path());
  const auto alone = one_rank_report(dir, checkpoint);
  // One visible GPU is every local rank's ordinal 0: no NCCL here, so two ranks may share it.
  for (const std::string placement : {"replicate", "fsdp"}) {
    INFO("placement " << placement);
    const std::string report = (dir / ("r{rank}-cuda-" + placement + ".json")).string();
    const auto r = run_cli(cat({"launch", "-n", "2", "--set", "checkpoint=" + checkpoint.string(),
                                "--set", "placement=" + placement, "--set", "verify=digest",
                                "--report", report, "--json", "-q"},
                               shm_sets("60s", "cuda")),
                           {}, job_timeout_s);
    INFO(r.out << r.err);
    REQUIRE(r.exit_status == 0);
    const auto by_rank = summaries(r.out);
    REQUIRE(by_rank.size() == 2);
    // Rank 0 hashed what each rank should have; each rank read back what landed on its GPU.
    CHECK_THAT(by_rank.at(0).value("verdict", std::string()), Contains("bit-exact"));
    for (const auto& [rank, summary] : by_rank) {
      CHECK(summary.value("node_reads", std::string()) == "ring");  // never local on cuda
    }
    if (placement == "replicate") {
      for (int rank = 0; rank < 2; ++rank) {
        const auto got =
            read_json(dir / ("r" + std::to_string(rank) + "-cuda-" + placement + ".json"));
        CHECK(got["tensors"] == alone["tensors"]);
      }
    }
  }
}
