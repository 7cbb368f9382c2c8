// World detection: config, then torchrun, Slurm, Open MPI environments, else one rank.
#include "weightcast/config/config.hpp"
#include "weightcast/config/launch_options.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/control/control_plane.hpp"
#include "weightcast/control/world.hpp"

#include "support/env.hpp"
#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

using namespace weightcast;
using Catch::Matchers::Contains;
using test::ScopedEnv;

namespace {
Config with(std::vector<std::string> sets) { return load_config("", sets); }

// The Error detect_world(config) throws (FAILs when it throws none).
Error expect_world_error(const Config& config) {
  try {
    detect_world(config);
  } catch (const Error& e) {
    return e;
  }
  FAIL("detect_world threw no error");
  return Error(Errc::internal, "unreachable");
}
}  // namespace

TEST_CASE("world: no launcher is a world of one", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  const World w = detect_world(Config{});
  CHECK(w.rank == 0);
  CHECK(w.world_size == 1);
  CHECK(w.local_rank == 0);
  CHECK(w.source == WorldSource::single);
  CHECK_THAT(w.describe(), Contains("rank 0 of 1"));
}

TEST_CASE("world: torchrun, Slurm and Open MPI environments, in that order", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  {
    ScopedEnv env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
    World w = detect_world(Config{});
    CHECK(w.source == WorldSource::openmpi);
    CHECK((w.rank == 2 && w.world_size == 4 && w.local_rank == 0));
    {
      // srun starting Open MPI ranks: both families agree; Slurm's comes first.
      ScopedEnv slurm({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}});
      w = detect_world(Config{});
      CHECK(w.source == WorldSource::slurm);
      CHECK((w.rank == 2 && w.world_size == 4 && w.local_rank == 1));
      {
        // torchrun started by mpirun (one per node): torchrun's world, which is not mpirun's.
        ScopedEnv torchrun({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                            {"MASTER_ADDR", "10.0.0.7"}, {"TORCHELASTIC_RUN_ID", "job7"}});
        w = detect_world(Config{});
        CHECK(w.source == WorldSource::torchrun);
        CHECK((w.rank == 5 && w.world_size == 8 && w.local_rank == 1));
        CHECK(w.master_addr == "10.0.0.7");
        CHECK_THAT(w.describe(), Contains("torchrun"));
        // The config wins over every environment.
        w = detect_world(with({"world.rank=1", "world.size=2"}));
        CHECK(w.source == WorldSource::config);
        CHECK((w.rank == 1 && w.world_size == 2 && w.local_rank == 1));
      }
    }
  }
}

TEST_CASE("world: the job id comes from the family that gave the world", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  CHECK(detect_world(Config{}).job_id.empty());
  ScopedEnv mpi({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                 {"OMPI_MCA_ess_base_jobid", "1078001665"}});
  World w = detect_world(Config{});
  CHECK(w.job_id == "1078001665");
  CHECK(w.job_id_source == "OMPI_MCA_ess_base_jobid");
  {
    // PMIx's namespace first (Open MPI 5 sets no ess jobid); cut to 256 bytes.
    ScopedEnv pmix({{"PMIX_NAMESPACE", std::string(300, 'n')}});
    w = detect_world(Config{});
    CHECK(w.job_id == std::string(World::max_job_id_bytes, 'n'));
    CHECK(w.job_id_source == "PMIX_NAMESPACE");
  }
  {
    // srun inside the same allocation: Slurm's world, so Slurm's job and step.
    ScopedEnv slurm({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "77"},
                     {"SLURM_STEP_ID", "3"}});
    w = detect_world(Config{});
    CHECK(w.source == WorldSource::slurm);
    CHECK(w.job_id == "77.3");
    CHECK(w.job_id_source == "SLURM_JOB_ID.SLURM_STEP_ID");
    ScopedEnv torchrun({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "job7"}});
    w = detect_world(Config{});
    CHECK(w.job_id == "job7");
    CHECK(w.job_id_source == "TORCHELASTIC_RUN_ID");
  }
  // A world from the config has no launcher to vouch for it.
  CHECK(detect_world(with({"world.rank=1", "world.size=2"})).job_id.empty());
}

TEST_CASE("world: families that disagree: mpirun's world wins over an inherited Slurm one, "
          "left-over RANK/WORLD_SIZE under mpirun are refused", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  // mpirun -np 4 inside an sbatch script: every rank inherits the batch step's SLURM_PROCID=0.
  ScopedEnv mpi({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"SLURM_PROCID", "0"},
                 {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}});
  World w = detect_world(Config{});
  CHECK(w.source == WorldSource::openmpi);
  CHECK((w.rank == 3 && w.world_size == 4 && w.local_rank == 3));
  {
    // RANK/WORLD_SIZE from an earlier job, under mpirun: neither world can be trusted.
    ScopedEnv stale({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
    const auto e = expect_world_error(Config{});
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("RANK=0 WORLD_SIZE=1") &&
                             Contains("OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=4") &&
                             Contains("left over"));
    // The same numbers agree: nothing to refuse.
    ScopedEnv agree({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
    CHECK(detect_world(Config{}).source == WorldSource::torchrun);
  }
  // torchrun inside srun: Slurm's tasks are nodes, torchrun's world is every process.
  ScopedEnv no_mpi({{"OMPI_COMM_WORLD_RANK", std::nullopt}, {"OMPI_COMM_WORLD_SIZE", std::nullopt}});
  ScopedEnv torchrun({{"RANK", "6"}, {"WORLD_SIZE", "16"}});
  w = detect_world(Config{});
  CHECK(w.source == WorldSource::torchrun);
  CHECK((w.rank == 6 && w.world_size == 16));
}

TEST_CASE("world: a source counts only with both rank and size", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  ScopedEnv env({{"RANK", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}});
  const World w = detect_world(Config{});
  CHECK(w.source == WorldSource::slurm);
  CHECK(w.local_rank == 0);  // SLURM_LOCALID unset: the rank
}

TEST_CASE("world: bad values are config errors naming the variable or key", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  auto error_of = [](const Config& c) {
    try {
      detect_world(c);
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("no error"));
  };
  {
    ScopedEnv env({{"RANK", "one"}, {"WORLD_SIZE", "2"}});
    auto [code, what] = error_of(Config{});
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("RANK='one'"));
  }
  {
    ScopedEnv env({{"RANK", "3"}, {"WORLD_SIZE", "3"}});
    auto [code, what] = error_of(Config{});
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("RANK=3") && Contains("WORLD_SIZE=3"));
  }
  {
    auto [code, what] = error_of(with({"world.rank=1"}));
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("world.rank=1 but world.size is auto"));
  }
  {
    auto [code, what] = error_of(with({"world.rank=2", "world.size=2"}));
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("world.rank=2"));
  }
}

TEST_CASE("world: world.rank and world.size errors say where each was set", "[world]") {
  // "world.rank and world.size: set both or neither (auto)" named no file, line or --set.
  ScopedEnv clean(test::no_launcher_env());
  test::TempDir dir;
  const auto config_file = [&](const std::string& yaml) {
    const auto path = dir / "w.yaml";
    test::write_file(path, yaml);
    return path.string();
  };
  std::string path = config_file("io_depth: 4\nworld.rank: 0\n");
  CHECK(std::string(expect_world_error(load_config(path, {})).what()) ==
        path + ":2: world.rank=0 but world.size is auto: set both or neither (auto)");
  path = config_file("world:\n  size: 2\n  rank: auto\n");
  CHECK(std::string(expect_world_error(load_config(path, {})).what()) ==
        path + ":2: world.size=2 but world.rank is auto from " + path +
            ":3: set both or neither (auto)");
  CHECK(std::string(expect_world_error(with({"world.size=2"})).what()) ==
        "--set world.size=2 but world.rank is auto: set both or neither (auto)");
  path = config_file("world: {rank: 3, size: 2}\n");
  const Error e = expect_world_error(load_config(path, {}));
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) == path + ":1: world.rank=3: the rank must be below the world "
                                        "size (world.size=2 from " + path + ":1)");
  CHECK(std::string(expect_world_error(load_config(path, {"world.size=3", "world.rank=5"}))
                        .what()) ==
        "--set world.rank=5: the rank must be below the world size (world.size=3 from --set)");
  // A Config built in code names no place.
  Config code;
  code.world_rank = 4;
  code.world_size = 2;
  CHECK(std::string(expect_world_error(code).what()) ==
        "world.rank=4: the rank must be below the world size (world.size=2)");
}

TEST_CASE("world: world.* and rendezvous.* keys round-trip through the config", "[world]") {
  const Config c = with({"world.rank=1", "world.size=3", "world.local_rank=0",
                         "rendezvous.address=127.0.0.2", "rendezvous.port=30000",
                         "rendezvous.token=s3cret"});
  CHECK(c.world_rank == 1);
  CHECK(c.world_size == 3);
  CHECK(c.world_local_rank == 0);
  CHECK(c.rendezvous_address == "127.0.0.2");
  CHECK(c.rendezvous_port == 30000);
  CHECK(c.rendezvous_token == "s3cret");
  const std::string yaml = c.to_yaml();
  CHECK_THAT(yaml, Contains("world.size: 3"));
  CHECK_THAT(yaml, !Contains("s3cret"));  // the token is masked
  const Config d = Config{};
  CHECK_THAT(d.to_yaml(), Contains("world.rank: auto") && Contains("rendezvous.port: 29555"));
  CHECK_THROWS_AS(with({"rendezvous.port=0"}), Error);
  CHECK_THROWS_AS(with({"world.size=0"}), Error);
}

TEST_CASE("world: a partial launcher environment is a config error naming both variables",
          "[world]") {
  // Half of torchrun's pair once meant a world of one: the process loaded as rank 0 and
  // the real job waited for a rank that never came.
  ScopedEnv clean(test::no_launcher_env());
  auto error_of = [] {
    try {
      detect_world(Config{});
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("no error"));
  };
  const std::vector<std::tuple<std::string, std::string, std::string>> cases{
      {"RANK", "1", "WORLD_SIZE"},
      {"WORLD_SIZE", "4", "RANK"},
      {"SLURM_PROCID", "2", "SLURM_NTASKS"},
      {"OMPI_COMM_WORLD_SIZE", "3", "OMPI_COMM_WORLD_RANK"}};
  for (const auto& [set, value, missing] : cases) {
    ScopedEnv env({{set, value}});
    auto [code, what] = error_of();
    INFO(what);
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains(set + "=" + value + " is set but " + missing + " is not"));
  }
  {  // a complete source still wins over another's stray half (torchrun inside srun)
    ScopedEnv env({{"WORLD_SIZE", "4"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
    CHECK(detect_world(Config{}).source == WorldSource::slurm);
  }
  {  // rank 0 alone is its own world of one: Slurm's batch step without a task count
    ScopedEnv env(std::vector<ScopedEnv::Entry>{{"SLURM_PROCID", "0"}});
    CHECK(detect_world(Config{}).world_size == 1);
  }
  {  // LOCAL_RANK alone picks a GPU for a world of one; it is no partial world
    ScopedEnv env(std::vector<ScopedEnv::Entry>{{"LOCAL_RANK", "1"}});
    const World w = detect_world(Config{});
    CHECK(w.world_size == 1);
    CHECK(w.source == WorldSource::single);
    CHECK(w.local_rank == 1);
    CHECK(detect_world(with({"world.local_rank=3"})).local_rank == 3);  // the config wins
  }
  {  // so does another launcher's local rank alone, the first set in the order above
    ScopedEnv env({{"SLURM_LOCALID", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "5"}});
    CHECK(detect_world(Config{}).local_rank == 2);
  }
  {  // and it is checked as a complete source's is
    ScopedEnv env(std::vector<ScopedEnv::Entry>{{"LOCAL_RANK", "x1"}});
    const Error e = expect_world_error(Config{});
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("LOCAL_RANK='x1': not a whole number"));
  }
}

TEST_CASE("world: negative and too large numbers say so, not 'not a whole number'",
          "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  auto error_of = [](const std::vector<std::string>& sets) {
    try {
      detect_world(with(sets));
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(Errc::internal, std::string("no error"));
  };
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "99999999999999"}});
    auto [code, what] = error_of({});
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("WORLD_SIZE='99999999999999': out of range"));
  }
  {
    // Beyond the config's bound (world.size ≤ 2^20), though it fits an int.
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2147483647"}});
    auto [code, what] = error_of({});
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("WORLD_SIZE='2147483647': out of range (at most 1048576)"));
  }
  {
    ScopedEnv env({{"RANK", "-1"}, {"WORLD_SIZE", "2"}});
    auto [code, what] = error_of({});
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("RANK='-1': must be >= 0"));
  }
  for (const std::string bad : {"-3", "99999999999999999999999"}) {
    INFO(bad);
    auto [code, what] = error_of({"world.local_rank=" + bad});
    CHECK(code == Errc::config);
    CHECK_THAT(what, Contains("'" + bad + "' is out of range (must be 0 to"));
  }
}

TEST_CASE("world: whether the launcher put the ranks on more than one host", "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  CHECK(launcher_spans_hosts(WorldSource::openmpi).empty());
  {
    // mpirun on one host: as many ranks here as in the world.
    ScopedEnv one({{"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK(launcher_spans_hosts(WorldSource::openmpi).empty());
  }
  {
    ScopedEnv two({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK(launcher_spans_hosts(WorldSource::openmpi) ==
          "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4");
    // mpirun started this process: its variables say where the ranks are, whichever family
    // the world came from (a script that sets RANK/WORLD_SIZE for torch under mpirun) ...
    CHECK(launcher_spans_hosts(WorldSource::torchrun) ==
          "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4");
    CHECK(launcher_spans_hosts(WorldSource::slurm) ==
          "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4");
    // ... but not a world from the config, nor torchrun's own under mpirun.
    CHECK(launcher_spans_hosts(WorldSource::config).empty());
    ScopedEnv torchrun({ScopedEnv::Entry{"TORCHELASTIC_RUN_ID", "x"}});
    CHECK(launcher_spans_hosts(WorldSource::torchrun).empty());
  }
  {
    ScopedEnv garbage({{"OMPI_COMM_WORLD_LOCAL_SIZE", "two"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK(launcher_spans_hosts(WorldSource::openmpi).empty());
  }
  {
    // mpirun on one node of a Slurm allocation of three: one host.
    ScopedEnv allocation({{"SLURM_NNODES", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"OMPI_COMM_WORLD_SIZE", "4"}});
    CHECK(launcher_spans_hosts(WorldSource::slurm).empty());
  }
  {
    ScopedEnv allocation({ScopedEnv::Entry{"SLURM_NNODES", "3"}});
    CHECK(launcher_spans_hosts(WorldSource::slurm) == "SLURM_NNODES=3");
    // A step on one node of a larger allocation is on one host.
    ScopedEnv step({ScopedEnv::Entry{"SLURM_STEP_NUM_NODES", "1"}});
    CHECK(launcher_spans_hosts(WorldSource::slurm).empty());
  }
  {
    ScopedEnv torchrun({{"LOCAL_WORLD_SIZE", "8"}, {"WORLD_SIZE", "16"}});
    CHECK(launcher_spans_hosts(WorldSource::torchrun) == "LOCAL_WORLD_SIZE=8 of WORLD_SIZE=16");
  }
  {
    ScopedEnv torchrun({{"LOCAL_WORLD_SIZE", "8"}, {"WORLD_SIZE", "8"}, {"GROUP_WORLD_SIZE", "1"}});
    CHECK(launcher_spans_hosts(WorldSource::torchrun).empty());
  }
  {
    ScopedEnv groups({ScopedEnv::Entry{"GROUP_WORLD_SIZE", "2"}});
    CHECK(launcher_spans_hosts(WorldSource::torchrun) == "GROUP_WORLD_SIZE=2");
  }
}

TEST_CASE("world: the first host of a Slurm node list", "[world]") {
  CHECK(first_slurm_host("node7") == "node7");
  CHECK(first_slurm_host("gpu1,gpu2") == "gpu1");
  CHECK(first_slurm_host("gpu[003-005,9],login") == "gpu003");
  CHECK(first_slurm_host("rack[2,4]-node[01-08]") == "rack2-node01");
  CHECK(first_slurm_host("a[").empty());
  CHECK(first_slurm_host("a[]").empty());
  CHECK(first_slurm_host("").empty());
}

TEST_CASE("world: rank 0's host from the launcher, only where no address was given",
          "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  ScopedEnv slurm({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"},
                   {"SLURM_STEP_NODELIST", "cn[017-018]"}});
  World w = detect_world(Config{});
  CHECK(w.spans_hosts == "SLURM_NNODES=2");
  CHECK(w.root_host == "cn017");
  CHECK(w.root_host_source == "the first host of SLURM_STEP_NODELIST");
  RendezvousOptions options = rendezvous_options(Config{}, w);
  CHECK(options.address == "cn017");
  CHECK(options.address_source == "the first host of SLURM_STEP_NODELIST");
  CHECK(options.spans_hosts == "SLURM_NNODES=2");
  {
    ScopedEnv master({ScopedEnv::Entry{"MASTER_ADDR", "10.0.0.1"}});
    w = detect_world(Config{});
    CHECK(w.root_host.empty());
    options = rendezvous_options(Config{}, w);
    CHECK(options.address == "10.0.0.1");
    CHECK(options.address_source == "MASTER_ADDR");
  }
  const Config given = with({"rendezvous.address=10.0.0.2"});
  w = detect_world(given);
  CHECK(w.root_host.empty());
  options = rendezvous_options(given, w);
  CHECK(options.address == "10.0.0.2");
  CHECK(options.address_source == "rendezvous.address");
  {
    // One node: the default loopback address stays.
    ScopedEnv one({ScopedEnv::Entry{"SLURM_NNODES", "1"}});
    w = detect_world(Config{});
    CHECK(w.spans_hosts.empty());
    CHECK(rendezvous_options(Config{}, w).address == "127.0.0.1");
  }
}

TEST_CASE("world: world.* set by a torch process group is that group's world, whatever the "
          "launcher's variables say",
          "[world]") {
  ScopedEnv clean(test::no_launcher_env());
  // A subgroup under mpirun: the group numbers its own ranks.
  ScopedEnv mpirun({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  Config config;
  apply_overrides(config, {"world.rank=1", "world.size=2", "world.local_rank=1"},
                  process_group_origin);
  const World w = detect_world(config);
  CHECK((w.rank == 1 && w.world_size == 2 && w.local_rank == 1));
  CHECK(w.source == WorldSource::process_group);
  CHECK(w.job_id.empty());
  CHECK_THAT(w.describe(), Contains("rank 1 of 2 (local rank 1) from torch.distributed's "
                                    "process group"));
  // mpirun's word on hosts is not the group's.
  CHECK(launcher_spans_hosts(w.source).empty());
  // The same keys from a file or --set are the config's.
  Config plain;
  apply_overrides(plain, {"world.rank=1", "world.size=2"}, "--set");
  CHECK(detect_world(plain).source == WorldSource::config);
}
