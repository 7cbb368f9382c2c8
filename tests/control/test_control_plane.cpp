// The control plane on loopback: catalogue and message wire formats, rendezvous, token,
// reports, verdict, and rank 0's listener against strangers (floods, slow and hostile
// clients, descriptor exhaustion).
#include "weightcast/checkpoint/catalogue_wire.hpp"
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/config/launch_options.hpp"
#include "weightcast/control/control_plane.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/error.hpp"

#include "support/paths.hpp"
#include "support/ports.hpp"
#include "support/tcp_client.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <string_view>
#include <future>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stop_token>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace weightcast;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using Clock = std::chrono::steady_clock;
namespace wire = weightcast::detail;

namespace {

Catalogue corpus_catalogue(const std::string& relative) {
  return open_checkpoint(test::corpus_dir() / "real" / relative);
}

Error decode_error(std::string_view bytes) {
  try {
    decode_catalogue(bytes, "catalogue from rank 0");
  } catch (const Error& e) {
    return e;
  }
  FAIL("decoded without an error");
  return Error(Errc::internal, "");
}

World world_of(int rank, int size) {
  World w;
  w.rank = rank;
  w.world_size = size;
  w.local_rank = rank;
  return w;
}

RendezvousOptions loopback(std::uint16_t port, std::string token = "t0ken",
                           std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  RendezvousOptions o;
  o.address = "127.0.0.1";
  o.port = port;
  o.token = std::move(token);
  o.timeout = timeout;
  return o;
}

// The control plane's timeout for the tests that move over 64 MiB through it: a bound on a
// hang, not on speed, with room for ThreadSanitizer's slowdown (scripts/sanitize.sh).
constexpr std::chrono::milliseconds slow_wire = std::chrono::seconds(120);

// Rank 0 of a small job: rendezvous, share, gather, verdict.
// @return when the rendezvous completed.
Clock::time_point serve_job(int world_size, RendezvousOptions options) {
  ControlPlane root(world_of(0, world_size), options);
  const auto joined = Clock::now();
  root.share("catalogue bytes");
  root.gather(RankReport{0, 100, 0.5, {1, 2, 3}});
  root.finish(Verdict{0, "ok"});
  return joined;
}

// A peer rank of that job. @return the verdict, or a description of what went wrong.
std::string join_job(int rank, int world_size, RendezvousOptions options) {
  try {
    ControlPlane control(world_of(rank, world_size), options);
    if (control.share({}) != "catalogue bytes") return "wrong shared bytes";
    control.gather(RankReport{rank, 100, 0.5, {1, 2, 3}});
    return control.finish({}).message;
  } catch (const Error& e) {
    return e.what();
  }
}

std::string hello_frame(int rank, int world_size, const std::string& token) {
  return wire::frame_bytes(wire::Frame::hello, wire::encode_hello({rank, world_size, token}));
}

std::string header_claiming(wire::Frame type, std::uint32_t length) {
  std::string bytes(1, static_cast<char>(type));
  bytes.append(reinterpret_cast<const char*>(&length), 4);
  return bytes;
}

// After a stranger's visit, the real peer (rank 1 of 2) still joins and the job that rank 0
// (@p root, serve_job on @p port) runs ends: the stranger took no rank's place.
void finish_with_real_peer(std::future<Clock::time_point>& root, std::uint16_t port) {
  CHECK(join_job(1, 2, loopback(port)) == "ok");
  REQUIRE(root.wait_for(5s) == std::future_status::ready);
  root.get();
}

// Reads rank 0's answer to @p client within 2 s; REQUIREs one, and CHECKs that it is a reject.
// @return the refusal message.
std::string read_refusal(test::TcpClient& client) {
  const auto refusal = client.read_frame(2s);
  REQUIRE(refusal);
  CHECK(refusal->type == static_cast<std::uint8_t>(wire::Frame::reject));
  return refusal->payload;
}

// Captures what weightcast logs while alive (spdlog's default logger, as log.hpp allows).
class LogCapture {
 public:
  LogCapture() : _sink(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(512)) {
    _previous = spdlog::default_logger();
    auto logger = std::make_shared<spdlog::logger>("capture", _sink);
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(_previous); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  [[nodiscard]] std::string text() const {
    std::string all;
    for (const auto& line : _sink->last_formatted()) all += line;
    return all;
  }
  // Waits until a logged message holds @p needle. @return false after @p wait.
  // Searches the raw messages, not formatted lines: formatting is a virtual call, and while a
  // test holds every file descriptor, UBSan's vptr check cannot probe memory (it needs a
  // pipe) and reports a false "invalid vptr".
  bool wait_for(const std::string& needle, std::chrono::milliseconds wait) const {
    const auto deadline = Clock::now() + wait;
    auto logged = [&] {
      for (const auto& message : _sink->last_raw()) {
        const std::string_view payload(message.payload.data(), message.payload.size());
        if (payload.find(needle) != std::string_view::npos) return true;
      }
      return false;
    };
    while (!logged()) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> _sink;
  std::shared_ptr<spdlog::logger> _previous;
};

// Leaves this process no free file descriptor while alive: lowers RLIMIT_NOFILE to just
// above the highest open descriptor and fills every hole below it. Restores both after.
class NoFreeDescriptors {
 public:
  explicit NoFreeDescriptors(int fd_to_copy) {
    int highest = 0;
    if (DIR* dir = ::opendir("/proc/self/fd")) {
      while (const dirent* entry = ::readdir(dir)) {
        if (entry->d_name[0] != '.') highest = std::max(highest, std::atoi(entry->d_name));
      }
      ::closedir(dir);
    }
    ::getrlimit(RLIMIT_NOFILE, &_saved);
    rlimit lowered = _saved;
    lowered.rlim_cur = static_cast<rlim_t>(highest) + 1;
    _ok = ::setrlimit(RLIMIT_NOFILE, &lowered) == 0;
    while (_ok) {
      const int copy = ::dup(fd_to_copy);
      if (copy < 0) {
        _ok = errno == EMFILE;
        break;
      }
      _copies.push_back(copy);
    }
  }
  ~NoFreeDescriptors() {
    for (int fd : _copies) ::close(fd);
    ::setrlimit(RLIMIT_NOFILE, &_saved);
  }
  NoFreeDescriptors(const NoFreeDescriptors&) = delete;
  NoFreeDescriptors& operator=(const NoFreeDescriptors&) = delete;
  /// @return whether the table is full (a new descriptor now fails with EMFILE).
  [[nodiscard]] bool full() const noexcept { return _ok; }

 private:
  rlimit _saved{};
  std::vector<int> _copies;
  bool _ok = false;
};

}  // namespace

TEST_CASE("catalogue wire: round trip keeps everything, shard paths and identities too",
          "[control_plane]") {
  for (const char* file : {"huggingface__safetensors/samples/overall.safetensors",
                           "anirudh-ak__peft-gpt2/model/lora_model/adapter_model.safetensors",
                           "JunSuzukiJapan__tl/model.safetensors"}) {
    INFO(file);
    const Catalogue original = corpus_catalogue(file);
    const Catalogue back = decode_catalogue(encode_catalogue(original), "test");
    REQUIRE(back.shards.size() == original.shards.size());
    for (std::size_t s = 0; s < back.shards.size(); ++s) {
      // A rank on rank 0's node may read the file itself: the very one rank 0 described.
      CHECK(back.shards[s].path == original.shards[s].path);
      CHECK(back.shards[s].device == original.shards[s].device);
      CHECK(back.shards[s].inode == original.shards[s].inode);
      CHECK(back.shards[s].modified_ns == original.shards[s].modified_ns);
      CHECK(back.shards[s].changed_ns == original.shards[s].changed_ns);
      CHECK(back.shards[s].name == original.shards[s].name);
      CHECK(back.shards[s].file_bytes == original.shards[s].file_bytes);
      CHECK(back.shards[s].data_offset == original.shards[s].data_offset);
    }
    REQUIRE(back.tensors.size() == original.tensors.size());
    for (std::size_t t = 0; t < back.tensors.size(); ++t) {
      CHECK(back.tensors[t].name == original.tensors[t].name);
      CHECK(back.tensors[t].dtype == original.tensors[t].dtype);
      CHECK(back.tensors[t].shape == original.tensors[t].shape);
      CHECK(back.tensors[t].shard == original.tensors[t].shard);
      CHECK(back.tensors[t].file_offset == original.tensors[t].file_offset);
      CHECK(back.tensors[t].bytes == original.tensors[t].bytes);
    }
    CHECK(back.metadata == original.metadata);
  }
}

TEST_CASE("catalogue wire: the decoder never trusts the peer", "[control_plane]") {
  const std::string good =
      encode_catalogue(corpus_catalogue("huggingface__safetensors/samples/overall.safetensors"));
  // Every truncation is an error, never a crash or an over-read.
  for (std::size_t n = 0; n < good.size(); ++n) {
    const Error e = decode_error(std::string_view(good).substr(0, n));
    CHECK(e.code() == Errc::unavailable);
  }
  CHECK_THAT(decode_error(good + "x").what(), Contains("trailing"));
  std::string bad_magic = good;
  bad_magic[0] ^= 1;
  CHECK_THAT(decode_error(bad_magic).what(), Contains("magic"));
  std::string bad_version = good;
  bad_version[4] = 9;
  CHECK_THAT(decode_error(bad_version).what(), Contains("version 9"));
  // A huge shard count is refused before anything is allocated.
  std::string huge = good;
  huge[8] = huge[9] = huge[10] = huge[11] = '\xff';
  CHECK_THAT(decode_error(huge).what(), Contains("more entries than the payload holds"));
  // Flipping bytes anywhere is at worst an error.
  for (std::size_t i = 12; i < good.size(); i += 3) {
    std::string flipped = good;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x5a);
    try {
      decode_catalogue(flipped, "fuzz");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
    }
  }
}

TEST_CASE("control plane: 3 ranks meet, share, report and agree", "[control_plane]") {
  const std::uint16_t port = test::free_port();
  auto peer = [port](int rank) {
    ControlPlane control(world_of(rank, 3), loopback(port));
    const std::string shared = control.share({});
    RankReport report{rank, 100, 0.5, {1, 2, static_cast<std::uint64_t>(rank == 2 ? 9 : 3)}};
    control.gather(report);
    const Verdict verdict = control.finish({});
    return std::make_pair(shared, verdict);
  };
  auto one = std::async(std::launch::async, peer, 1);
  auto two = std::async(std::launch::async, peer, 2);
  ControlPlane root(world_of(0, 3), loopback(port));
  CHECK(root.share("catalogue bytes") == "catalogue bytes");
  const auto reports = root.gather(RankReport{0, 100, 0.5, {1, 2, 3}});
  REQUIRE(reports.size() == 3);
  CHECK(reports[1].rank == 1);
  CHECK(reports[1].digests == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(reports[2].digests == std::vector<std::uint64_t>{1, 2, 9});
  root.finish(Verdict{70, "rank 2 differs"});
  for (auto* f : {&one, &two}) {
    REQUIRE(f->wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    auto [shared, verdict] = f->get();
    CHECK(shared == "catalogue bytes");
    CHECK(verdict.status == 70);
    CHECK(verdict.message == "rank 2 differs");
  }
}

TEST_CASE("control plane: bytes longer than one frame reach every rank whole and in order",
          "[control_plane]") {
  // A catalogue past the 64 MiB of one frame (a header near the format's 100 MB limit
  // encodes to about 78 MB) goes in pieces; what follows it is a share of its own.
  const std::uint16_t port = test::free_port();
  std::string big(wire::max_share_bytes + 12'345, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131) >> 7);
  auto peer = [port](int rank) {
    ControlPlane control(world_of(rank, 3), loopback(port, "t0ken", slow_wire));
    std::string first = control.share({});
    std::string second = control.share({});
    control.gather(RankReport{rank, 0, 0.0, {}});
    control.finish({});
    return std::make_pair(std::move(first), std::move(second));
  };
  auto one = std::async(std::launch::async, peer, 1);
  auto two = std::async(std::launch::async, peer, 2);
  ControlPlane root(world_of(0, 3), loopback(port, "t0ken", slow_wire));
  CHECK(root.share(big).size() == big.size());
  root.share("nccl id");
  root.gather(RankReport{0, 0, 0.0, {}});
  root.finish(Verdict{0, "ok"});
  for (auto* f : {&one, &two}) {
    REQUIRE(f->wait_for(2 * slow_wire) == std::future_status::ready);
    const auto [first, second] = f->get();
    CHECK(first.size() == big.size());
    CHECK(first == big);
    CHECK(second == "nccl id");
  }
}

TEST_CASE("control plane: a report longer than one frame reaches rank 0 whole, from each rank",
          "[control_plane]") {
  // What a rank reports grows with the checkpoint (its placement wants, a digest per tensor):
  // past the 64 MiB + 4 KiB of one frame it goes in pieces, each rank's kept apart, and the
  // next report (one frame) follows as a report of its own.
  const std::uint16_t port = test::free_port();
  const std::size_t count = wire::max_share_bytes / 8 + 1'000;
  auto digests_of = [count](int rank) {
    std::vector<std::uint64_t> digests(count);
    for (std::size_t i = 0; i < count; ++i) digests[i] = i * 0x9E3779B97F4A7C15ull + rank;
    return digests;
  };
  auto peer = [port, &digests_of](int rank) {
    ControlPlane control(world_of(rank, 3), loopback(port, "t0ken", slow_wire));
    control.gather(RankReport{rank, 7, 0.25, digests_of(rank)});
    control.share({});
    control.gather(RankReport{rank, 8, 0.5, {static_cast<std::uint64_t>(rank)}});
    return control.finish({});
  };
  auto one = std::async(std::launch::async, peer, 1);
  auto two = std::async(std::launch::async, peer, 2);
  ControlPlane root(world_of(0, 3), loopback(port, "t0ken", slow_wire));
  const auto big = root.gather(RankReport{0, 0, 0.0, {}});
  REQUIRE(big.size() == 3);
  for (int r : {1, 2}) {
    INFO("rank " << r);
    CHECK(big[r].rank == r);
    CHECK(big[r].bytes == 7);
    CHECK(big[r].digests.size() == count);
    CHECK(big[r].digests == digests_of(r));
  }
  root.share("next");
  const auto small = root.gather(RankReport{0, 0, 0.0, {}});
  CHECK(small[1].digests == std::vector<std::uint64_t>{1});
  CHECK(small[2].digests == std::vector<std::uint64_t>{2});
  root.finish(Verdict{0, "ok"});
  for (auto* f : {&one, &two}) {
    REQUIRE(f->wait_for(2 * slow_wire) == std::future_status::ready);
    CHECK(f->get().message == "ok");
  }
}

TEST_CASE("catalogue wire: a shape of any number of dimensions travels, as the format allows",
          "[control_plane]") {
  // The format sets no limit on a shape's dimensions; one rank loads a 100-dimensional
  // tensor, so every rank must.
  Catalogue catalogue;
  catalogue.shards.push_back(ShardInfo{"", "model.safetensors", 8 + 100 + 1, 8 + 100});
  TensorInfo tensor{"t", Dtype::U8, std::vector<std::uint64_t>(100, 1), 0, 8 + 100, 1};
  catalogue.tensors.push_back(tensor);
  const Catalogue back = decode_catalogue(encode_catalogue(catalogue), "test");
  REQUIRE(back.tensors.size() == 1);
  CHECK(back.tensors[0].shape == tensor.shape);
}

TEST_CASE("control plane: the heartbeat carries each rank's progress to rank 0 and back",
          "[control_plane]") {
  // timeout 1 s: a heartbeat every 100 ms.
  const std::uint16_t port = test::free_port();
  const auto timeout = std::chrono::milliseconds(1000);
  std::promise<void> reported;
  auto done = reported.get_future().share();
  auto peer = [&](int rank) {
    ControlPlane control(world_of(rank, 3), loopback(port, "", timeout));
    control.note_progress(rank == 1 ? 5 : 7);
    done.wait();
    return control.stall_report();
  };
  auto one = std::async(std::launch::async, peer, 1);
  auto two = std::async(std::launch::async, peer, 2);
  ControlPlane root(world_of(0, 3), loopback(port, "", timeout));
  root.note_progress(7);
  // Before any heartbeat from a peer, rank 0 knows only its own count.
  std::string report;
  for (int i = 0; i < 100; ++i) {
    report = root.stall_report();
    if (report.find("rank 1 5") != std::string::npos &&
        report.find("rank 2 7") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(report == "every rank answers on the control plane; chunks landed: rank 0 7, rank 1 5, "
                  "rank 2 7; furthest behind: rank(s) 1 (a slow rank, or a slow link to it)");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // rank 0's beats reach them
  root.finish({});  // the peers' hang-ups are expected from now on
  reported.set_value();
  for (auto* f : {&one, &two}) {
    REQUIRE(f->wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  }
  CHECK(one.get() == "rank 0 answers on the control plane; chunks landed: rank 0 7, rank 1 5");
  CHECK(two.get() == "rank 0 answers on the control plane; chunks landed: rank 0 7, rank 2 7");
}

TEST_CASE("control plane: the ranks that did not join are listed as ranges, not one by one",
          "[control_plane]") {
  // A world of 2^20 ranks (the most a config or environment may give) with none joining: the
  // message stays a line (it listed every rank: megabytes).
  try {
    ControlPlane root(world_of(0, 1 << 20),
                      loopback(test::free_port(), "", std::chrono::milliseconds(300)));
    FAIL("rank 0 saw a world of 2^20 ranks join");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(), Contains("rank(s) 1-1048575 did not join"));
    CHECK(std::string(e.what()).size() < 300);
  }
}

TEST_CASE("control plane: a rank of another job is refused by its launcher's job id",
          "[control_plane]") {
  // Two plain mpirun jobs on one port set no token: without the job id, a rank of one joined
  // the other (and the jobs failed with false digest mismatches).
  const std::uint16_t port = test::free_port();
  auto options = [port](const std::string& job_id) {
    RendezvousOptions o = loopback(port, "", std::chrono::seconds(2));
    o.job_id = job_id;
    o.job_id_source = "PMIX_NAMESPACE";
    return o;
  };
  auto stray = std::async(std::launch::async, [&] {
    try {
      ControlPlane control(world_of(1, 2), options("222"));
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("joined"));
  });
  try {
    ControlPlane root(world_of(0, 2), options("111"));
    FAIL("rank 0 took a rank of another job");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(), Contains("rank(s) 1 did not join") && Contains("another job"));
  }
  REQUIRE(stray.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  auto [code, what] = stray.get();
  CHECK(code == Errc::config);
  CHECK_THAT(what, Contains(fmt::format("refused this rank: rank 1 belongs to another job: its "
                                        "launcher's job id is '222', this job's is '111' "
                                        "(PMIX_NAMESPACE); two jobs are using rendezvous port "
                                        "{}: give each its own rendezvous.port",
                                        port)));
  // A peer without a job id (started by hand) is not refused for it.
  auto unknown = std::async(std::launch::async, [&] {
    ControlPlane control(world_of(1, 2), options(""));
    return control.finish({}).status;
  });
  ControlPlane root(world_of(0, 2), options("111"));
  root.finish({});
  REQUIRE(unknown.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  CHECK(unknown.get() == 0);
}

TEST_CASE("control plane: a rank 0 that cannot listen says why and what to try",
          "[control_plane]") {
  // Every bind failure said "another job on this port?".
  const std::uint16_t port = test::free_port();
  auto listen_error = [](RendezvousOptions options) {
    try {
      ControlPlane root(world_of(0, 2), options);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
      return std::string(e.what());
    }
    return std::string("listened");
  };
  {
    test::TcpListener taken(port);
    CHECK_THAT(listen_error(loopback(port, "", 1s)),
               Contains(fmt::format("cannot listen on 127.0.0.1:{}: Address already in use "
                                    "(another job on this port? give each job its own "
                                    "rendezvous.port)",
                                    port)));
  }
  RendezvousOptions elsewhere = loopback(port, "", 1s);
  elsewhere.address = "192.0.2.1";  // TEST-NET-1 (RFC 5737): no host has it
  CHECK_THAT(listen_error(elsewhere),
             Contains(fmt::format("cannot listen on 192.0.2.1:{}: ", port)) &&
                 Contains("(no interface of this host has that address: set "
                          "rendezvous.address to one of this host's, or leave it auto)"));
  // An IPv6 address is written in brackets beside a port, and may be given so.
  Config config;
  config.rendezvous_address = "[::1]";
  config.rendezvous_port = port;
  config.timeout = 300ms;
  const RendezvousOptions v6 = rendezvous_options(config, world_of(1, 2));
  CHECK(v6.address == "::1");
  try {
    ControlPlane peer(world_of(1, 2), v6);
    FAIL("joined nobody");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Contains(fmt::format("rank 0 at [::1]:{}", port)));
  }
}

TEST_CASE("control plane: a wrong token is refused on both sides", "[control_plane]") {
  const std::uint16_t port = test::free_port();
  auto intruder = std::async(std::launch::async, [port] {
    try {
      ControlPlane control(world_of(1, 2), loopback(port, "wrong"));
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("joined"));
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    ControlPlane root(world_of(0, 2), loopback(port, "right", std::chrono::seconds(2)));
    FAIL("rank 0 accepted a wrong token");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::timeout);
    CHECK_THAT(e.what(), Contains("rank(s) 1 did not join") && Contains("wrong job token"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
  REQUIRE(intruder.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
  auto [code, what] = intruder.get();
  CHECK(code == Errc::config);
  CHECK_THAT(what, Contains("refused this rank") && Contains("wrong job token"));
}

TEST_CASE("control plane: a stop ends the rendezvous on rank 0 and on a peer, long before the "
          "timeout", "[control_plane]") {
  // Ctrl-C in Python while the other ranks never come: the wait ends on the stop, as it
  // would on the timeout, rank 0 telling the ranks that joined.
  const std::uint16_t port = test::free_port();
  for (const int rank : {0, 1}) {
    INFO("rank " << rank);
    std::stop_source stop;
    auto options = loopback(rank == 0 ? port : test::free_port(), "", std::chrono::seconds(60));
    options.stop = stop.get_token();
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      stop.request_stop();
    });
    const auto begin = std::chrono::steady_clock::now();
    try {
      ControlPlane control(world_of(rank, 3), options);
      FAIL("the rendezvous completed");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::interrupted);
      CHECK_THAT(e.what(), StartsWith("rendezvous: stopped (RendezvousOptions::stop)"));
      if (rank == 0) CHECK_THAT(e.what(), Contains("rank(s) 1-2 had not joined"));
    }
    stopper.join();
    CHECK(std::chrono::steady_clock::now() - begin < std::chrono::seconds(20));  // not 60 s
  }
}

TEST_CASE("control plane: no rank 0 is unavailable within the timeout", "[control_plane]") {
  const std::uint16_t nobody = test::free_port();  // nothing listens there
  const auto start = std::chrono::steady_clock::now();
  try {
    ControlPlane control(world_of(1, 2), loopback(nobody, "t", std::chrono::milliseconds(1500)));
    FAIL("connected to nobody");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), Contains(fmt::format("cannot reach rank 0 at 127.0.0.1:{}", nobody)));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
}

// ---- the message decoders (fuzzed by fuzz/fuzz_control_message.cpp) ----------------------

TEST_CASE("control wire: messages round trip", "[control_plane]") {
  const wire::Hello hello =
      wire::decode_hello(wire::encode_hello({2, 3, "s3cret", "1078001665"}), "test");
  CHECK(hello.rank == 2);
  CHECK(hello.world_size == 3);
  CHECK(hello.token == "s3cret");
  CHECK(hello.job_id == "1078001665");
  // The longest token and job id fit the hello rank 0 reads.
  CHECK(wire::encode_hello({2, 3, std::string(wire::max_token_bytes, 't'),
                            std::string(World::max_job_id_bytes, 'j')})
            .size() == wire::max_hello_bytes);
  const auto status = wire::decode_status(wire::encode_status(74, "rank 0: read failed"), "t");
  CHECK(status.status == 74);
  CHECK(status.message == "rank 0: read failed");
  // A status the shell would read as a signal becomes 69.
  CHECK(wire::decode_status(wire::encode_status(200, "x"), "t").status == 69);
  CHECK(wire::decode_status(wire::encode_status(131, "x"), "t").status == 69);
  // A rank interrupted by SIGINT or SIGTERM: every rank ends with its 128 + signal.
  CHECK(wire::decode_status(wire::encode_status(130, "x"), "t").status == 130);
  CHECK(wire::decode_status(wire::encode_status(143, "x"), "t").status == 143);
  CHECK(wire::decode_status(wire::encode_status(-1, "x"), "t").status == 69);
  CHECK(wire::encode_status(1, std::string(100'000, 'm')).size() ==
        4 + 4 + wire::max_status_message_bytes);
  CHECK(wire::decode_progress(wire::encode_progress(139), "t") == 139);
  CHECK(wire::decode_progress(wire::encode_progress(~0ull), "t") == ~0ull);
  const RankReport report =
      wire::decode_report(wire::encode_report({1, 4096, 0.25, {7, 8, 9}, {4, 5}}), "t");
  CHECK(report.rank == 1);
  CHECK(report.bytes == 4096);
  CHECK(report.seconds == 0.25);
  CHECK(report.digests == std::vector<std::uint64_t>{7, 8, 9});
  CHECK(report.expected == std::vector<std::uint64_t>{4, 5});
  CHECK(wire::decode_report(wire::encode_report({1, 8, 1.0, {1}}), "t").expected.empty());
}

TEST_CASE("control wire: every decoder refuses truncated and padded payloads",
          "[control_plane]") {
  auto error_of = [](auto decode, const std::string& bytes) {
    try {
      decode(bytes);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
      return std::string(e.what());
    }
    return std::string("decoded");
  };
  auto hello = [](const std::string& b) { return wire::decode_hello(b, "hello"); };
  auto status = [](const std::string& b) { return wire::decode_status(b, "abort"); };
  auto report = [](const std::string& b) { return wire::decode_report(b, "report"); };
  const std::string good_hello = wire::encode_hello({1, 2, "token"});
  const std::string good_status = wire::encode_status(75, "stalled");
  const std::string good_report = wire::encode_report({1, 8, 1.0, {1, 2}, {3, 4}});
  for (std::size_t n = 0; n < good_hello.size(); ++n) {
    CHECK_THAT(error_of(hello, good_hello.substr(0, n)), Contains("truncated"));
  }
  for (std::size_t n = 0; n < good_status.size(); ++n) {
    CHECK_THAT(error_of(status, good_status.substr(0, n)), Contains("truncated"));
  }
  for (std::size_t n = 0; n < good_report.size(); ++n) {
    CHECK_THAT(error_of(report, good_report.substr(0, n)),
               Contains("truncated") || Contains("more entries than the payload holds"));
  }
  CHECK_THAT(error_of(hello, good_hello + "x"), Contains("1 trailing bytes"));
  CHECK_THAT(error_of(status, good_status + "x"), Contains("1 trailing bytes"));
  CHECK_THAT(error_of(report, good_report + "x"), Contains("1 trailing bytes"));
  std::string stranger = good_hello;
  stranger[0] = 'G';
  CHECK_THAT(error_of(hello, stranger), Contains("hello: magic: not weightcast"));
  std::string newer = good_hello;
  newer[4] = 6;
  CHECK_THAT(error_of(hello, newer), Contains("protocol version 6, rank 0 speaks 5"));
  auto progress = [](const std::string& b) { return wire::decode_progress(b, "progress"); };
  const std::string good_progress = wire::encode_progress(139);
  for (std::size_t n = 0; n < good_progress.size(); ++n) {
    CHECK_THAT(error_of(progress, good_progress.substr(0, n)), Contains("truncated"));
  }
  CHECK_THAT(error_of(progress, good_progress + "x"), Contains("1 trailing bytes"));
  // A digest count of 2^32 - 1 in a 32-byte payload is refused before the digests are
  // allocated.
  std::string hostile = wire::encode_report({1, 8, 1.0, {}});
  std::memset(hostile.data() + 20, 0xff, 4);
  CHECK_THAT(error_of(report, hostile), Contains("digests: claims more entries"));
  std::string hostile_expected = wire::encode_report({1, 8, 1.0, {}});
  std::memset(hostile_expected.data() + 24, 0xff, 4);
  CHECK_THAT(error_of(report, hostile_expected), Contains("expected digests: claims more entries"));
  // A token string claiming 4 GiB is refused from its length alone.
  std::string long_token = wire::encode_hello({1, 2, ""});
  std::memset(long_token.data() + 16, 0xff, 4);
  CHECK_THAT(error_of(hello, long_token), Contains("token: truncated"));
}

TEST_CASE("control wire: frame headers are checked per reader before any allocation",
          "[control_plane]") {
  auto header = [](wire::Frame type, std::uint32_t length) {
    std::array<char, wire::frame_header_bytes> bytes{};
    const std::string raw = header_claiming(type, length);
    std::memcpy(bytes.data(), raw.data(), bytes.size());
    return bytes;
  };
  auto error_of = [](const std::array<char, wire::frame_header_bytes>& bytes,
                     wire::FrameReader reader) {
    try {
      wire::decode_frame_header(bytes, reader, "first message");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::unavailable);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  using wire::Frame;
  using wire::FrameReader;
  CHECK_THAT(error_of(header(Frame::hello, 0xffffffffu), FrameReader::greeting),
             Contains("first message: hello message of 4294967295 bytes, over the limit of "
                      "4096"));
  CHECK(error_of(header(Frame::hello, 4096), FrameReader::greeting) == "accepted");
  CHECK_THAT(error_of(header(Frame::share, 8), FrameReader::greeting),
             Contains("unexpected message type 4 (share)"));
  CHECK_THAT(error_of(header(static_cast<Frame>('G'), 0x20544547), FrameReader::greeting),
             Contains("unexpected message type 71 (unknown)"));
  // Rank 0 takes reports and ABORTs from a peer, nothing it sends itself.
  CHECK(error_of(header(Frame::report, 1024), FrameReader::root) == "accepted");
  CHECK_THAT(error_of(header(Frame::report, 0xffffffffu), FrameReader::root),
             Contains("over the limit of 67112960"));
  CHECK_THAT(error_of(header(Frame::abort, 0xffffffffu), FrameReader::root),
             Contains("over the limit of 65536"));
  CHECK_THAT(error_of(header(Frame::share, 8), FrameReader::root), Contains("unexpected"));
  CHECK_THAT(error_of(header(Frame::hello, 8), FrameReader::root), Contains("unexpected"));
  // What a peer takes from rank 0 is bounded too.
  CHECK(error_of(header(Frame::welcome, 0), FrameReader::joining) == "accepted");
  CHECK_THAT(error_of(header(Frame::welcome, 1), FrameReader::joining),
             Contains("over the limit of 0"));
  CHECK_THAT(error_of(header(Frame::reject, 0xffffffffu), FrameReader::joining),
             Contains("refusal message of 4294967295 bytes"));
  CHECK_THAT(error_of(header(Frame::share, 8), FrameReader::joining), Contains("unexpected"));
  CHECK(error_of(header(Frame::share, wire::max_share_bytes), FrameReader::peer) == "accepted");
  CHECK_THAT(error_of(header(Frame::share, wire::max_share_bytes + 1), FrameReader::peer),
             Contains("over the limit"));
  // A piece of longer shared bytes is bounded like a SHARE; only a peer takes one.
  CHECK(error_of(header(Frame::share_part, wire::max_share_bytes), FrameReader::peer) ==
        "accepted");
  CHECK_THAT(error_of(header(Frame::share_part, wire::max_share_bytes + 1), FrameReader::peer),
             Contains("share part message of 67112961 bytes, over the limit of 67112960"));
  CHECK_THAT(error_of(header(Frame::share_part, 8), FrameReader::root), Contains("unexpected"));
  CHECK_THAT(error_of(header(Frame::share_part, 8), FrameReader::joining),
             Contains("unexpected"));
  CHECK_THAT(error_of(header(Frame::done, 0xffffffffu), FrameReader::peer),
             Contains("verdict message of 4294967295 bytes"));
  CHECK_THAT(error_of(header(Frame::report, 8), FrameReader::peer), Contains("unexpected"));
  // A piece of a longer report is bounded like a REPORT; only rank 0 takes one.
  CHECK(error_of(header(Frame::report_part, wire::max_share_bytes), FrameReader::root) ==
        "accepted");
  CHECK_THAT(error_of(header(Frame::report_part, wire::max_share_bytes + 1), FrameReader::root),
             Contains("report part message of 67112961 bytes, over the limit of 67112960"));
  CHECK_THAT(error_of(header(Frame::report_part, 8), FrameReader::peer), Contains("unexpected"));
  CHECK_THAT(error_of(header(Frame::report_part, 8), FrameReader::greeting),
             Contains("unexpected"));
  // The heartbeat goes both ways after the rendezvous, 8 bytes exactly at most.
  CHECK(error_of(header(Frame::progress, 8), FrameReader::root) == "accepted");
  CHECK(error_of(header(Frame::progress, 8), FrameReader::peer) == "accepted");
  CHECK_THAT(error_of(header(Frame::progress, 9), FrameReader::peer),
             Contains("progress message of 9 bytes, over the limit of 8"));
  CHECK_THAT(error_of(header(Frame::progress, 8), FrameReader::greeting), Contains("unexpected"));
  CHECK_THAT(error_of(header(Frame::progress, 8), FrameReader::joining), Contains("unexpected"));
}

TEST_CASE("control wire: the token comparison", "[control_plane]") {
  CHECK(wire::tokens_equal("t0ken", "t0ken"));
  CHECK(wire::tokens_equal("", ""));
  CHECK_FALSE(wire::tokens_equal("t0ke", "t0ken"));
  CHECK_FALSE(wire::tokens_equal("t0kenX", "t0ken"));
  CHECK_FALSE(wire::tokens_equal("", "t0ken"));
  CHECK_FALSE(wire::tokens_equal("t0ken", ""));
  CHECK_FALSE(wire::tokens_equal("T0ken", "t0ken"));
  CHECK_FALSE(wire::tokens_equal(std::string("t0ken\0", 6), "t0ken"));
}

// ---- rank 0's listener against strangers (real sockets on loopback) -----------------------

TEST_CASE("control plane: a flood of silent connections neither holds descriptors nor locks "
          "the peers out",
          "[control_plane]") {
  const std::uint16_t port = test::free_port();
  LogCapture log;
  auto root = std::async(std::launch::async, serve_job, 3, loopback(port));
  // 200 connections that say nothing, all before the real peers.
  std::vector<test::TcpClient> flood;
  for (int i = 0; i < 200; ++i) flood.emplace_back(port);
  // Rank 0 lets at most 64 wait for their hello: it closes the oldest of the rest at once.
  std::vector<bool> closed(flood.size(), false);
  std::size_t closed_count = 0;
  for (const auto until = Clock::now() + 3s; closed_count < 200 - 64 && Clock::now() < until;) {
    for (std::size_t i = 0; i < flood.size(); ++i) {
      if (!closed[i] && flood[i].closed_within(0ms)) {
        closed[i] = true;
        ++closed_count;
      }
    }
    std::this_thread::sleep_for(20ms);
  }
  CHECK(closed_count >= 200 - 64);
  CHECK_THAT(log.text(), Contains("connections are waiting to say hello; closing the oldest"));
  const auto peers_start = Clock::now();
  auto one = std::async(std::launch::async, join_job, 1, 3, loopback(port));
  auto two = std::async(std::launch::async, join_job, 2, 3, loopback(port));
  REQUIRE(root.wait_for(10s) == std::future_status::ready);
  const auto joined = root.get();
  CHECK(joined - peers_start < 3s);
  CHECK(one.get() == "ok");
  CHECK(two.get() == "ok");
}

TEST_CASE("control plane: a hello trickled a byte at a time does not hold up the job",
          "[control_plane]") {
  const std::uint16_t port = test::free_port();
  auto root = std::async(std::launch::async, serve_job, 3, loopback(port));
  test::TcpClient slow(port);
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    // A well-formed hello (wrong token), one byte every 200 ms: 6 s for the whole of it.
    const std::string hello = hello_frame(2, 3, "slow-client");
    for (char byte : hello) {
      if (stop || !slow.send(std::string_view(&byte, 1))) return;
      std::this_thread::sleep_for(200ms);
    }
  });
  std::this_thread::sleep_for(300ms);  // the trickle has begun
  const auto peers_start = Clock::now();
  auto one = std::async(std::launch::async, join_job, 1, 3, loopback(port));
  auto two = std::async(std::launch::async, join_job, 2, 3, loopback(port));
  const bool done = root.wait_for(10s) == std::future_status::ready;
  stop = true;
  trickle.join();
  REQUIRE(done);
  CHECK(root.get() - peers_start < 3s);
  CHECK(one.get() == "ok");
  CHECK(two.get() == "ok");
}

TEST_CASE("control plane: a connection that does not finish its hello in 5 s is closed",
          "[control_plane]") {
  const std::uint16_t port = test::free_port();
  LogCapture log;
  auto root = std::async(std::launch::async, serve_job, 2, loopback(port, "t0ken", 9s));
  test::TcpClient slow(port);
  const auto connected = Clock::now();
  // Trickle a hello, one byte every 200 ms, until rank 0 hangs up.
  const std::string hello = hello_frame(1, 2, "t0ken");
  bool closed = false;
  for (std::size_t i = 0; i < hello.size() && !closed; ++i) {
    closed = !slow.send(hello.substr(i, 1)) || slow.closed_within(200ms);
  }
  const auto held = Clock::now() - connected;
  CHECK(closed);
  CHECK(held > 4s);
  CHECK(held < 6500ms);
  CHECK_THAT(log.text(), Contains("no hello within 5000 ms"));
  // The rendezvous is still open to the real peer.
  finish_with_real_peer(root, port);
}

TEST_CASE("control plane: a frame header claiming 4 GiB is refused at once", "[control_plane]") {
  const std::uint16_t port = test::free_port();
  auto root = std::async(std::launch::async, serve_job, 2, loopback(port));
  test::TcpClient hostile(port);
  const auto sent = Clock::now();
  REQUIRE(hostile.send(header_claiming(wire::Frame::hello, 0xffffffffu)));
  const std::string refusal = read_refusal(hostile);
  CHECK(Clock::now() - sent < 1s);
  CHECK_THAT(refusal, Contains("not a weightcast hello") &&
                          Contains("4294967295 bytes, over the limit of 4096"));
  CHECK(hostile.closed_within(1s));
  // And rank 0 is still there for the real peer.
  finish_with_real_peer(root, port);
}

TEST_CASE("control plane: a peer gives up at once on a reply claiming 4 GiB", "[control_plane]") {
  const std::uint16_t port = test::free_port();
  test::TcpListener fake_root(port);
  const auto start = Clock::now();
  auto peer = std::async(std::launch::async, join_job, 1, 2, loopback(port, "t0ken", 10s));
  test::TcpClient connection = fake_root.accept(5s);
  const auto hello = connection.read_frame(2s);
  REQUIRE(hello);
  const wire::Hello decoded = wire::decode_hello(hello->payload, "hello");
  CHECK(decoded.rank == 1);
  CHECK(decoded.token == "t0ken");
  REQUIRE(connection.send(header_claiming(wire::Frame::reject, 0xffffffffu)));
  REQUIRE(peer.wait_for(5s) == std::future_status::ready);
  CHECK(Clock::now() - start < 3s);
  CHECK_THAT(peer.get(), Contains(fmt::format("rendezvous: 127.0.0.1:{} answered this rank's hello "
                                              "with a malformed message",
                                              port)) &&
                             Contains("refusal message of 4294967295 bytes, over the limit of "
                                      "65536"));
}

TEST_CASE("control plane: a rank 0 that accepts but never answers is a timeout, not a close",
          "[control_plane]") {
  // A stopped rank 0 (its listener's backlog still accepts) or another service on the port:
  // the peer said "rank 0 closed the connection during the rendezvous" (69), which was false.
  const std::uint16_t port = test::free_port();
  test::TcpListener silent_root(port);
  auto peer = std::async(std::launch::async, [port] {
    try {
      ControlPlane control(world_of(1, 2), loopback(port, "t0ken", 1500ms));
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("joined"));
  });
  test::TcpClient connection = silent_root.accept(5s);
  REQUIRE(connection.read_frame(2s));  // the hello, left unanswered
  REQUIRE(peer.wait_for(10s) == std::future_status::ready);
  const auto [code, what] = peer.get();
  CHECK(code == Errc::timeout);
  CHECK_THAT(what, Contains(fmt::format("rendezvous: 127.0.0.1:{} accepted this rank's connection "
                                        "but did not answer its hello within 1500 ms (timeout)",
                                        port)));
}

TEST_CASE("control plane: without the token a connection learns nothing of the job",
          "[control_plane]") {
  const std::uint16_t port = test::free_port();
  auto root = std::async(std::launch::async, serve_job, 2, loopback(port));
  for (const std::string token : {"wrong", "t0ke", "t0kenX", ""}) {
    INFO("token '" << token << "'");
    test::TcpClient stranger(port);
    // Wrong in every other field too: the token is what rank 0 answers first.
    REQUIRE(stranger.send(hello_frame(5, 7, token)));
    CHECK(read_refusal(stranger) == "wrong job token (a rank of another job on this port, or "
                                    "ranks started with different rendezvous.token or "
                                    "WEIGHTCAST_TOKEN)");
    // Nothing more is read from it: the connection is closed, whatever it sends next.
    stranger.send(hello_frame(1, 2, "t0ken"));
    CHECK(stranger.closed_within(1s));
  }
  {
    // With the token, the job's shape is fair to tell.
    test::TcpClient member(port);
    REQUIRE(member.send(hello_frame(5, 7, "t0ken")));
    CHECK_THAT(read_refusal(member), Contains("world size 7, rank 0 has 2"));
  }
  // Refusals take no rank's place.
  finish_with_real_peer(root, port);
}

TEST_CASE("control plane: a loopback rendezvous in a world on several hosts is refused at once",
          "[control_plane]") {
  // Every rank, rank 0 included, refuses before it listens or dials: the ranks on other hosts
  // would otherwise retry for the whole timeout and then blame rank 0.
  for (const char* address : {"127.0.0.1", "::1", "localhost"}) {
    for (int rank : {0, 1}) {
      RendezvousOptions options = loopback(test::free_port(), "t0ken", std::chrono::seconds(30));
      options.address = address;
      options.spans_hosts = "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4";
      const auto begin = Clock::now();
      try {
        ControlPlane plane(world_of(rank, 4), options);
        FAIL("a loopback rendezvous on several hosts was accepted");
      } catch (const Error& e) {
        CHECK(e.code() == Errc::config);
        CHECK_THAT(e.what(), Contains(fmt::format("rendezvous: address {}", address)));
        CHECK_THAT(e.what(), Contains("from the default is loopback, but the ranks run on more "
                                      "than one host (OMPI_COMM_WORLD_LOCAL_SIZE=2 of "
                                      "OMPI_COMM_WORLD_SIZE=4)"));
        CHECK_THAT(e.what(), Contains("set rendezvous.address (or MASTER_ADDR)"));
      }
      CHECK(Clock::now() - begin < std::chrono::seconds(5));
    }
  }
}

TEST_CASE("control plane: rank 0 binds only rendezvous.address", "[control_plane]") {
  const std::uint16_t port = test::free_port();
  auto root = std::async(std::launch::async, serve_job, 2, loopback(port));
  { test::TcpClient listening(port); }  // waits until rank 0 listens on 127.0.0.1
  // 127.0.0.2 is loopback too on Linux: it would connect to a wildcard (0.0.0.0) bind.
  CHECK(test::connect_errno("127.0.0.2", port) == ECONNREFUSED);
  finish_with_real_peer(root, port);
}

TEST_CASE("control plane: rank 0 keeps accepting after running out of file descriptors",
          "[control_plane]") {
  const std::uint16_t port = test::free_port();
  // Declared first, so it outlives rank 0: a peer that hangs up mid-job ends rank 0's process.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  test::TcpClient peer(fd);
  LogCapture log;
  auto root = std::async(std::launch::async, serve_job, 2, loopback(port));
  // Not a probe connection: rank 0 would close it at some later moment, and a descriptor
  // freed after the table is full lets the accept below succeed.
  REQUIRE(log.wait_for("rendezvous: listening on", 5s));
  bool full = false;
  bool connected = false;
  bool accept_failed = false;
  {
    NoFreeDescriptors exhausted(fd);
    full = exhausted.full();
    if (full) {
      // The connection waits in rank 0's backlog; accepting it fails with EMFILE.
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_port = htons(port);
      to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      connected = ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0;
      accept_failed = log.wait_for("cannot accept a connection", 5s);
    }
  }
  REQUIRE(full);
  REQUIRE(connected);
  CHECK(accept_failed);
  CHECK_THAT(log.text(), Contains("Too many open files"));
  // Descriptors are free again: rank 0 takes the waiting connection and the job goes on.
  REQUIRE(peer.send(hello_frame(1, 2, "t0ken")));
  const auto welcome = peer.read_frame(3s);
  REQUIRE(welcome);
  CHECK(welcome->type == static_cast<std::uint8_t>(wire::Frame::welcome));
  const auto shared = peer.read_frame(3s);
  REQUIRE(shared);
  CHECK(shared->payload == "catalogue bytes");
  REQUIRE(peer.send(wire::frame_bytes(wire::Frame::report,
                                      wire::encode_report({1, 100, 0.5, {1, 2, 3}}))));
  const auto verdict = peer.read_frame(3s);
  REQUIRE(verdict);
  CHECK(verdict->type == static_cast<std::uint8_t>(wire::Frame::done));
  REQUIRE(root.wait_for(5s) == std::future_status::ready);
  root.get();
}

TEST_CASE("control plane: a token too long for a hello is a config error on the peer",
          "[control_plane]") {
  try {
    ControlPlane control(world_of(1, 2), loopback(test::free_port(), std::string(5000, 'k'), 1s));
    FAIL("joined with a 5000-byte token");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("rendezvous.token is 5000 bytes; rank 0 takes at most " +
                                  std::to_string(wire::max_token_bytes)));
  }
}
