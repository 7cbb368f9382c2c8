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
