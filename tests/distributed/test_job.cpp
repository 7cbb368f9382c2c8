// The job API (weightcast/distributed/job.hpp): one rank from a test, two ranks in one process failing
// before any collective, and three ranks under mpirun in a program that initialised MPI.
#include "weightcast/distributed/asio.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/distributed/job.hpp"
#include "weightcast/distributed/detail/job_setup.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include "support/mpirun.hpp"
#include "support/paths.hpp"
#include "support/ports.hpp"
#include "support/process.hpp"
#include "support/ports.hpp"
#include "support/report.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <fmt/core.h>

#include <chrono>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <vector>

#include <unistd.h>

using namespace weightcast;
using namespace weightcast::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
namespace fs = std::filesystem;

namespace {

constexpr const char* corpus_file = "huggingface__safetensors/samples/overall.safetensors";

JobOptions one_rank(const fs::path& checkpoint) {
  JobOptions job;
  job.checkpoint = checkpoint;
  job.world = World{};  // rank 0 of 1, whatever the environment says
  job.device = DeviceKind::host;
  job.load.chunk_bytes = 4096;
  return job;
}

void check_against_manifest(const LoadResult& result) {
  const auto expected = corpus_manifest().at(corpus_file);
  REQUIRE(result.catalogue.tensors.size() == expected.size());
  const auto digests = tensor_digests(result);
  for (std::size_t i = 0; i < digests.size(); ++i) {
    INFO(result.catalogue.tensors[i].name);
    CHECK(digest_hex(digests[i]) == expected.at(result.catalogue.tensors[i].name).at("xxh3"));
  }
}

// Rank @p rank of a job of two ranks in this process (threads), meeting on @p port.
JobOptions two_ranks(int rank, std::uint16_t port, const fs::path& checkpoint) {
  JobOptions job;
  job.checkpoint = checkpoint;
  job.world = World{rank, 2, rank};
  RendezvousOptions rendezvous;
  rendezvous.port = port;
  rendezvous.timeout = std::chrono::seconds(20);
  job.rendezvous = rendezvous;
  job.device = DeviceKind::host;
  job.transport = TransportKind::mpi;
  job.failure_policy = FailurePolicy::throw_error;
  return job;
}

struct Outcome {
  std::optional<Error> error;
  std::vector<std::string> reported;  // on_failure's messages
};

// Runs both ranks of a two-rank job on threads; @p adjust changes rank r's options.
std::vector<Outcome> run_two(std::uint16_t port, const fs::path& checkpoint,
                             const std::function<void(int, JobOptions&)>& adjust) {
  std::vector<Outcome> outcomes(2);
  std::vector<JobOptions> jobs;
  for (int rank = 0; rank < 2; ++rank) {
    jobs.push_back(two_ranks(rank, port, checkpoint));
    adjust(rank, jobs.back());
    jobs.back().on_failure = [&outcomes, rank](const Error& e) {
      outcomes[rank].reported.emplace_back(e.what());
    };
  }
  std::vector<std::future<void>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::async(std::launch::async, [&, rank] {
      try {
        run_job(jobs[rank]);
      } catch (const Error& e) {
        outcomes[rank].error = e;
      }
    }));
  }
  for (auto& f : ranks) REQUIRE(f.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  return outcomes;
}

}  // namespace

TEST_CASE("job: one rank loads a corpus file bit-exact through run_job", "[job]") {
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  std::vector<std::string> seen;
  JobOptions job = one_rank(checkpoint);
  job.on_catalogue = [&](const Catalogue& c) {
    seen.push_back(fmt::format("catalogue {}", c.tensors.size()));
  };
  job.on_load_start = [&] { seen.emplace_back("start"); };
  job.on_load_end = [&](std::exception_ptr e) { seen.push_back(e ? "failed" : "end"); };
  job.on_loaded = [&](const JobResult&) { seen.emplace_back("loaded"); };
  job.on_verdict = [&](const JobResult& r) { seen.push_back("verdict " + r.verdict.message); };
  const JobResult result = run_job(job);
  check_against_manifest(result.load);
  CHECK(result.world.world_size == 1);
  CHECK(result.verdict.status == 0);
  CHECK(result.digests.empty());  // nothing to compare alone: no hashing
  CHECK(result.load.stats.transport == "local");
  const auto tensors = result.load.catalogue.tensors.size();
  CHECK(seen == std::vector<std::string>{
                    fmt::format("catalogue {}", tensors), "start", "end", "loaded",
                    fmt::format("verdict 1 rank: {} tensors loaded (nothing to compare)",
                                tensors)});
}

TEST_CASE("job: run_job_async and async_run_job give run_job's result", "[job]") {
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  auto future = run_job_async(one_rank(checkpoint));
  REQUIRE(future.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  check_against_manifest(future.get().load);

  boost::asio::io_context io;
  std::optional<JobResult> awaited;
  std::exception_ptr failure;
  int ticks = 0;  // other work on the io_context runs while the job does
  boost::asio::co_spawn(io, async_run_job(one_rank(checkpoint)),
                        [&](std::exception_ptr e, JobResult r) {
                          failure = e;
                          awaited.emplace(std::move(r));
                        });
  boost::asio::co_spawn(io, [&]() -> boost::asio::awaitable<void> {
    ++ticks;
    co_return;
  }, boost::asio::detached);
  io.run();
  REQUIRE_FALSE(failure);
  REQUIRE(awaited);
  check_against_manifest(awaited->load);
  CHECK(ticks == 1);

  // Errors come back through the awaitable.
  std::optional<Errc> code;
  boost::asio::co_spawn(io, async_run_job(one_rank("/does/not/exist.safetensors")),
                        [&](std::exception_ptr e, JobResult) {
                          try {
                            if (e) std::rethrow_exception(e);
                          } catch (const Error& error) {
                            code = error.code();
                          }
                        });
  io.restart();
  io.run();
  CHECK(code == Errc::missing_input);
}

TEST_CASE("job: one rank's failures are thrown as they are, without a rank prefix", "[job]") {
  std::vector<std::string> reported;
  JobOptions job = one_rank("/does/not/exist.safetensors");
  job.on_failure = [&](const Error& e) { reported.emplace_back(e.what()); };
  try {
    run_job(job);
    FAIL("run_job did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::missing_input);
    CHECK_THAT(e.what(), StartsWith("/does/not/exist.safetensors"));
    CHECK(reported == std::vector<std::string>{e.what()});  // once, the same message
  }
  job.checkpoint.clear();
  try {
    run_job(job);
    FAIL("run_job did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), StartsWith("checkpoint: not set"));
  }
  job = one_rank(corpus_dir() / "real" / corpus_file);
  job.transport = TransportKind::mpi;
  try {
    run_job(job);
    FAIL("run_job did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("transport: mpi: this is a world of one rank"));
  }
}

TEST_CASE("job: a stop requested before the job ends it with interrupted", "[job]") {
  std::stop_source stop;
  stop.request_stop();
  JobOptions job = one_rank(corpus_dir() / "real" / corpus_file);
  job.load.stop = stop.get_token();
  try {
    run_job(job);
    FAIL("run_job did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::interrupted);
  }
}

TEST_CASE("job: exit_status is the one mapping from Errc to <sysexits.h>", "[job]") {
  const std::map<Errc, int> statuses{
      {Errc::usage, 64},   {Errc::invalid_checkpoint, 65}, {Errc::missing_input, 66},
      {Errc::unavailable, 69}, {Errc::internal, 70},       {Errc::io, 74},
      {Errc::timeout, 75}, {Errc::config, 78},             {Errc::interrupted, 130},
      {Errc::terminated, 143}};
  for (const auto& [code, status] : statuses) {
    CHECK(exit_status(code) == status);
    CHECK(errc_for_exit_status(status) == code);
  }
  CHECK(errc_for_exit_status(1) == Errc::unavailable);
}

// Two ranks in this process (threads), failing before any collective: MPI is never touched
// (this process never initialises it), and each rank's run_job throws. A failure on rank 1
// after rank 0 has shared the settings is tested under mpirun below: rank 0 would be in
// MPI_Init_thread by then.

TEST_CASE("job: a hook's exception on rank 0 ends every rank with rank 0's message", "[job]") {
  if (!mpi_compiled_in()) {
    WARN("skipped: this build has no MPI (the job's transport would be refused first)");
    return;
  }
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = run_two(free_port(), checkpoint, [](int rank, JobOptions& job) {
    if (rank == 0) {
      job.on_catalogue = [](const Catalogue&) { throw Error(Errc::io, "cannot write here"); };
    }
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // < timeout
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(outcomes[rank].error);
    CHECK(outcomes[rank].error->code() == Errc::io);
    CHECK(std::string(outcomes[rank].error->what()) == "rank 0: cannot write here");
    // Reported once, with the message the job ends with.
    REQUIRE(outcomes[rank].reported.size() == 1);
    CHECK(outcomes[rank].reported[0] == outcomes[rank].error->what());
  }
}

TEST_CASE("job: a rank whose load is not rank 0's fails every rank naming both, before rank 0 "
          "opens the checkpoint", "[job]") {
  // Two loads at once in each process meet in arrival order: the identity is what keeps one
  // job's bytes out of the other's destinations.
  if (!mpi_compiled_in()) {
    WARN("skipped: this build has no MPI (the job's transport would be refused first)");
    return;
  }
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  bool opened = false;
  const auto outcomes = run_two(free_port(), checkpoint, [&](int rank, JobOptions& job) {
    job.identity = rank == 0 ? "checkpoint 'policy.safetensors'" : "checkpoint 'ref.safetensors'";
    if (rank == 0) job.on_catalogue = [&](const Catalogue&) { opened = true; };
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(outcomes[rank].error);
    CHECK(outcomes[rank].error->code() == Errc::config);
    CHECK_THAT(outcomes[rank].error->what(),
               StartsWith("rank 1: this rank's load is not rank 0's: this rank loads checkpoint "
                          "'ref.safetensors', rank 0 loads checkpoint 'policy.safetensors'"));
  }
  CHECK_FALSE(opened);
}

TEST_CASE("job: an identity set on one rank only is not compared", "[job]") {
  if (!mpi_compiled_in()) {
    WARN("skipped: this build has no MPI (the job's transport would be refused first)");
    return;
  }
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  const auto outcomes = run_two(free_port(), checkpoint, [](int rank, JobOptions& job) {
    if (rank == 1) job.identity = "checkpoint 'elsewhere'";
    // Past the identity, the first step to fail: rank 0's own hook.
    if (rank == 0) job.on_catalogue = [](const Catalogue&) { throw Error(Errc::io, "stop here"); };
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(outcomes[rank].error);
    CHECK(std::string(outcomes[rank].error->what()) == "rank 0: stop here");
  }
}

TEST_CASE("job: an exception that is not an Error ends every rank with internal", "[job]") {
  if (!mpi_compiled_in()) {
    WARN("skipped: this build has no MPI (the job's transport would be refused first)");
    return;
  }
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  const auto outcomes = run_two(free_port(), checkpoint, [](int rank, JobOptions& job) {
    if (rank == 0) {
      job.on_control_plane = [](ControlPlane* c) {
        if (c != nullptr) throw std::runtime_error("not an Error");
      };
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    REQUIRE(outcomes[rank].error);
    CHECK(outcomes[rank].error->code() == Errc::internal);
    CHECK(std::string(outcomes[rank].error->what()) == "rank 0: not an Error");
  }
}

TEST_CASE("job: a rank whose rank 0 never comes ends with unavailable, not a hang", "[job]") {
  if (!mpi_compiled_in()) {
    WARN("skipped: this build has no MPI (the job's transport would be refused first)");
    return;
  }
  const std::uint16_t port = free_port();
  JobOptions job = two_ranks(1, port, "");
  job.rendezvous->timeout = std::chrono::milliseconds(1500);
  try {
    run_job(job);
    FAIL("run_job did not throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::unavailable);
    CHECK_THAT(e.what(), StartsWith(fmt::format(
                             "rank 1: rendezvous: cannot reach rank 0 at 127.0.0.1:{}", port)));
  }
}

#ifdef WEIGHTCAST_MPI_JOB_PATH
namespace {

// The lines of OUT_DIR/r<rank>.txt that mpi_job wrote.
std::vector<std::string> rank_lines(const fs::path& dir, int rank) {
  std::istringstream in(read_file(dir / ("r" + std::to_string(rank) + ".txt")));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

ProcessResult run_mpi_job(const std::string& mode, const fs::path& checkpoint, int port,
                          const fs::path& out) {
  auto argv = mpirun_prefix(3);
  argv.insert(argv.end(), {WEIGHTCAST_MPI_JOB_PATH, mode, checkpoint.string(),
                           std::to_string(port), out.string()});
  return run_process(argv, {}, 120);
}

void check_tensors(const std::vector<std::string>& lines) {
  const auto expected = corpus_manifest().at(corpus_file);
  std::size_t tensors = 0;
  for (const auto& line : lines) {
    const auto space = line.find(' ');
    const std::string name = line.substr(0, space);
    if (!expected.contains(name)) continue;
    ++tensors;
    CHECK(line.substr(space + 1) == expected.at(name).at("xxh3").get<std::string>());
  }
  CHECK(tensors == expected.size());
}

// Runs mpi_job `mode` on 3 ranks, in which every rank catches the job's failure: its file holds
// the error line, which must match `error_line`, then "allreduce 3" (MPI still usable).
template <typename Matcher>
void check_every_rank_threw(const std::string& mode, const Matcher& error_line) {
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  TempDir dir;
  const auto r = run_mpi_job(mode, checkpoint, free_port(), dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    const auto lines = rank_lines(dir.path(), rank);
    REQUIRE(lines.size() == 2);
    CHECK_THAT(lines[0], error_line);
    CHECK(lines[1] == "allreduce 3");
  }
}

}  // namespace

TEST_CASE("job: 3 ranks under mpirun in a program that initialised MPI itself", "[job][mpi]") {
  REQUIRE_MPI();
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  TempDir dir;
  // No communicator handed in: the job uses MPI as the program initialised it, and leaves
  // it initialised (the program's own MPI_Allreduce and MPI_Finalize succeed).
  const auto r = run_mpi_job("world", checkpoint, free_port(), dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    const auto lines = rank_lines(dir.path(), rank);
    REQUIRE(lines.size() > 3);
    CHECK(lines[0] == fmt::format("job_rank {} of 3", rank));
    CHECK_THAT(lines[1], StartsWith("verdict 3 ranks × ") && Contains("bit-exact"));
    check_tensors(lines);
    CHECK(lines.back() == "allreduce 3");
  }
}

TEST_CASE("job: a communicator handed in gives the job its ranks", "[job][mpi]") {
  REQUIRE_MPI();
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  TempDir dir;
  // MPI_COMM_WORLD split with the ranks reversed: world rank 2 is the job's rank 0 (the only
  // one given the checkpoint), whatever mpirun's environment says.
  const auto r = run_mpi_job("split", checkpoint, free_port(), dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  for (int world_rank = 0; world_rank < 3; ++world_rank) {
    INFO("world rank " << world_rank);
    const auto lines = rank_lines(dir.path(), world_rank);
    REQUIRE(lines.size() > 3);
    CHECK(lines[0] == fmt::format("job_rank {} of 3", 2 - world_rank));
    CHECK_THAT(lines[1], Contains("bit-exact"));
    check_tensors(lines);
    CHECK(lines.back() == "allreduce 3");
  }
}

TEST_CASE("job: a communicator handed in carries a placed load's slices between its ranks",
          "[job][mpi][placement]") {
  // The slices went on MPI_COMM_WORLD: with the ranks reversed, the job's rank 2 (world rank
  // 0) waited for a message from world rank 0, itself.
  REQUIRE_MPI();
  const auto checkpoint = corpus_dir() / "real" / corpus_file;
  TempDir dir;
  const int port = test::free_port();
  const auto r = run_mpi_job("split-fsdp", checkpoint, port, dir.path());
  INFO(r.out << r.err);
  REQUIRE(r.exit_status == 0);
  for (int world_rank = 0; world_rank < 3; ++world_rank) {
    INFO("world rank " << world_rank);
    const auto lines = rank_lines(dir.path(), world_rank);
    REQUIRE(lines.size() > 3);
    CHECK(lines[0] == fmt::format("job_rank {} of 3", 2 - world_rank));
    CHECK_THAT(lines[1], Contains("local shards bit-exact"));
    CHECK(lines.back() == "allreduce 3");
  }
}

TEST_CASE("job: a rank still inside MPI_Comm_dup when another fails throws as the others do",
          "[job][mpi]") {
  // Rank 1 leaves MPI_Comm_dup and fails at once; rank 0 is still inside the watched call. It
  // used to be ended by its watchdog (a watched call was taken never to return after another
  // rank's failure) instead of throwing.
  REQUIRE_MPI();
  check_every_rank_threw("slow-dup",
                         StartsWith("error 78 rank 1: ") && Contains("mpi_job: no wants here"));
}

TEST_CASE("job: under mpirun, settings that differ throw on every rank and MPI stays usable",
          "[job][mpi]") {
  REQUIRE_MPI();
  check_every_rank_threw("mismatch", StartsWith("error 78 rank 1: chunk_size differs between "
                                                "ranks: this rank has 128 KiB"));
}
#endif

TEST_CASE("job: ranks that plan different tensor alignments are refused with 78",
          "[job][settings]") {
  using weightcast::detail::check_shared_settings;
  using weightcast::detail::planned_tensor_alignment;
  using weightcast::detail::shared_settings;
  // The cuda device's floor: the Python package asks 256 there, 8 on host; an embedder 1.
  CHECK(planned_tensor_alignment(1, /*host_device=*/false) == 256);
  CHECK(planned_tensor_alignment(4096, false) == 4096);
  CHECK(planned_tensor_alignment(1, true) == 1);
  const auto settings = [](std::uint64_t alignment) {
    return shared_settings(64 << 20, alignment, true, weightcast::TransportKind::mpi,
                           weightcast::Verify::digest);
  };
  CHECK_NOTHROW(check_shared_settings(settings(8), settings(8)));
  try {
    check_shared_settings(settings(1), settings(8));
    FAIL("different tensor alignments accepted");
  } catch (const weightcast::Error& e) {
    CHECK(e.code() == weightcast::Errc::config);
    CHECK_THAT(e.what(), Catch::Contains("tensor_alignment differs between ranks: this rank has 1 B, "
                                         "rank 0 has 8 B"));
  }
}
