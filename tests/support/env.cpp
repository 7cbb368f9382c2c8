#include "support/env.hpp"

#include <cstdlib>

namespace weightcast::test {

ScopedEnv::ScopedEnv(const std::vector<Entry>& entries) {
  for (const auto& [name, value] : entries) {
    const char* old = std::getenv(name.c_str());
    _saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
}

ScopedEnv::~ScopedEnv() {
  for (auto it = _saved.rbegin(); it != _saved.rend(); ++it) {
    if (it->second) {
      ::setenv(it->first.c_str(), it->second->c_str(), 1);
    } else {
      ::unsetenv(it->first.c_str());
    }
  }
}

std::vector<ScopedEnv::Entry> no_launcher_env() {
  std::vector<ScopedEnv::Entry> entries;
  for (const char* name :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID",
        "SLURM_NTASKS", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "WEIGHTCAST_TOKEN", "TORCHELASTIC_RUN_ID",
        "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "SLURM_STEP_ID",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NNODES", "SLURM_STEP_NUM_NODES",
        "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE"}) {
    entries.emplace_back(name, std::nullopt);
  }
  return entries;
}

}  // namespace weightcast::test
