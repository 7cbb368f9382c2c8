// The launcher's subcommands. Each returns the process exit status and throws
// weightcast::Error for failures (main() prints it and exits with its sysexits status).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace weightcast::cli {

struct RunArgs {
  std::string config_path;             ///< YAML config; empty for built-in defaults.
  std::vector<std::string> overrides;  ///< --set key=value, in order.
  std::string report_path;             ///< --report PATH; empty for none.
  std::string trace_path;              ///< --trace PATH (wins over `trace:`); empty for none.
  bool quiet = false;                  ///< --quiet: no config, no progress, no notices.
  bool json = false;                   ///< --json: the summary as JSON on stdout.
};
int run(const RunArgs& args);
}  // namespace weightcast::cli

namespace weightcast {
struct Config;
struct World;
}  // namespace weightcast

namespace weightcast::cli {
/// `run` when the world has more than one rank (tools/run_ranks.cpp): control plane, data
/// plane, final report compared on rank 0.
int run_ranks(const RunArgs& args, const Config& config, const World& world);

struct LaunchArgs {
  int ranks = 0;                       ///< -n N: number of ranks to start (≥ 1).
  std::string config_path;             ///< YAML config passed to every rank.
  std::vector<std::string> overrides;  ///< --set key=value, passed to every rank.
  std::string report_path;             ///< --report PATH, passed to every rank.
  std::string spawner = "auto";        ///< --spawner auto|mpirun|local.
  double grace_s = 5;                  ///< --grace: SIGTERM → SIGKILL delay, seconds.
};
/// `weightcast launch` (tools/launch.cpp): starts N ranks of `weightcast run`.
int launch(const LaunchArgs& args);

struct InspectArgs {
  std::string path;  ///< Checkpoint file, directory or index.
};
int inspect(const InspectArgs& args);

struct SynthArgs {
  std::string out_dir;
  std::string params = "1B";         ///< Target parameter count: "125M", "1B", "7B"…
  std::string dtype = "BF16";
  std::string shard_size = "2GiB";   ///< Shard when the checkpoint is larger than this.
  std::uint64_t seed = 0;
};
int synth(const SynthArgs& args);

}  // namespace weightcast::cli
