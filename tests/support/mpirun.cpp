#include "support/mpirun.hpp"

#include "support/process.hpp"

#include "weightcast/transport/transport_mpi.hpp"

#include <unistd.h>

namespace weightcast::test {

std::string mpirun_path() {
  static const std::string path = [] {
    auto r = run_process({"/bin/sh", "-c", "command -v mpirun"}, {}, 30);
    std::string p = r.out.substr(0, r.out.find('\n'));
    return r.exit_status == 0 ? p : std::string();
  }();
  return path;
}

bool have_mpirun() { return mpi_compiled_in() && !mpirun_path().empty(); }

std::vector<std::string> mpirun_options() {
  std::vector<std::string> argv{mpirun_path(), "--oversubscribe"};
  if (::geteuid() == 0) argv.emplace_back("--allow-run-as-root");
  return argv;
}

std::vector<std::string> mpirun_prefix(int ranks) {
  std::vector<std::string> argv = mpirun_options();
  argv.insert(argv.end(), {"-np", std::to_string(ranks)});
  return argv;
}

}  // namespace weightcast::test
