// Where rank 0 runs, from the launcher: whether the world spans hosts, and rank 0's host for a
// rendezvous nobody gave an address for (docs/multirank.md § Across nodes).
#include "weightcast/control/world.hpp"

#include "weightcast/transport/transport_mpi.hpp"

#include <fmt/core.h>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>

#ifdef WEIGHTCAST_HAVE_PMIX
#include <pmix.h>
#endif

namespace weightcast {

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// A whole number ≥ 0 from the environment, or -1 (unset or not a number: nothing to go on;
// detect_world already refuses the world's own malformed variables).
long long env_count(const char* name) {
  const char* text = env(name);
  if (text == nullptr) return -1;
  const std::string_view view(text);
  long long value = -1;
  auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  return ec == std::errc() && end == view.data() + view.size() && value >= 0 ? value : -1;
}

// "LOCAL=2 of ALL=4" when both are set and LOCAL is below ALL.
std::string fewer_here(const char* local_name, const char* all_name) {
  const long long local = env_count(local_name);
  const long long all = env_count(all_name);
  if (local < 1 || all < 1 || local >= all) return {};
  return fmt::format("{}={} of {}={}", local_name, local, all_name, all);
}

// "NAME=n" when NAME is above 1.
std::string above_one(const char* name) {
  const long long count = env_count(name);
  return count > 1 ? fmt::format("{}={}", name, count) : std::string();
}

#ifdef WEIGHTCAST_HAVE_PMIX
// Whether this process holds an initialisation of PMIx's client of its own.
std::atomic<bool> pmix_held{false};

// PMIx's job-level data (PMIx standard v4 § 6.1, "PMIX_HOSTNAME"): the launcher registers
// each process's host with its server before the processes start, so a PMIx_Get of rank 0's
// needs no exchange between the ranks and no collective.
RootHost pmix_root_host() {
  static std::once_flag finalize_once;
  pmix_proc_t me;
  pmix_status_t rc = PMIx_Init(&me, nullptr, 0);
  if (rc != PMIX_SUCCESS) {
    return {{}, {}, fmt::format("PMIx_Init: {}", PMIx_Error_string(rc))};
  }
  // Held until MPI holds its own (release_root_host_query), or at exit: Open MPI's MPI_Init
  // joins this initialisation (PMIx counts them) and cannot initialise PMIx again once it was
  // finalised ("getting local rank failed"); one finalised only after MPI_Finalize, at exit,
  // made mpirun call the exit improper under Python.
  const bool already = pmix_held.exchange(true);
  if (already) PMIx_Finalize(nullptr, 0);  // one held is enough
  std::call_once(finalize_once, [] { std::atexit(release_root_host_query); });
  pmix_proc_t root;
  PMIX_LOAD_PROCID(&root, me.nspace, 0);
  pmix_value_t* value = nullptr;
  rc = PMIx_Get(&root, PMIX_HOSTNAME, nullptr, 0, &value);
  if (rc != PMIX_SUCCESS || value == nullptr) {
    return {{}, {}, fmt::format("PMIx_Get(PMIX_HOSTNAME of rank 0): {}", PMIx_Error_string(rc))};
  }
  RootHost found;
  if (value->type == PMIX_STRING && value->data.string != nullptr) {
    found.host = value->data.string;
    found.source = "PMIx's PMIX_HOSTNAME of rank 0";
  } else {
    found.why_not = "PMIx_Get(PMIX_HOSTNAME of rank 0): not a string";
  }
  PMIX_VALUE_RELEASE(value);
  if (mpi_initialized()) release_root_host_query();
  return found;
}
#endif

}  // namespace

void release_root_host_query() noexcept {
#ifdef WEIGHTCAST_HAVE_PMIX
  if (pmix_held.exchange(false)) PMIx_Finalize(nullptr, 0);
#endif
}

std::string launcher_spans_hosts(WorldSource source) {
  // Open MPI's variables are set by mpirun for each process it starts: where they are, they
  // say where the ranks are whichever family the world came from (a script under mpirun that
  // sets RANK/WORLD_SIZE for torch's env://, mpirun inside a Slurm allocation).
  if (source != WorldSource::config && source != WorldSource::communicator &&
      source != WorldSource::process_group &&
      source != WorldSource::single && env("OMPI_COMM_WORLD_LOCAL_SIZE") != nullptr &&
      env("OMPI_COMM_WORLD_SIZE") != nullptr && env("TORCHELASTIC_RUN_ID") == nullptr) {
    source = WorldSource::openmpi;
  }
  switch (source) {
    case WorldSource::openmpi:
      return fewer_here("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE");
    case WorldSource::slurm:
      // The step's nodes: an allocation of several nodes may run a step on one.
      if (env("SLURM_STEP_NUM_NODES") != nullptr) return above_one("SLURM_STEP_NUM_NODES");
      return above_one("SLURM_NNODES");
    case WorldSource::torchrun: {
      std::string fewer = fewer_here("LOCAL_WORLD_SIZE", "WORLD_SIZE");
      return fewer.empty() ? above_one("GROUP_WORLD_SIZE") : fewer;
    }
    case WorldSource::config:
    case WorldSource::single:
    case WorldSource::communicator:
    case WorldSource::process_group:
      return {};
  }
  return {};
}

std::string first_slurm_host(std::string_view nodelist) {
  // A list is comma-separated items; an item is a prefix, then optionally "[ranges]" and more
  // (Slurm's hostlist syntax). The first host: the prefix, the first number of the first
  // bracket (its zero padding kept), and what follows the bracket up to the next item.
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const std::size_t close = nodelist.find(']', i);
    if (close == std::string_view::npos) return {};
    const std::string_view ranges = nodelist.substr(i + 1, close - i - 1);
    const std::size_t stop = ranges.find_first_of("-,");
    const std::string_view first = ranges.substr(0, stop);
    if (first.empty()) return {};
    host += first;
    i = close + 1;
  }
  return host;
}

RootHost find_root_host(WorldSource source) {
  // RANK/WORLD_SIZE set by a script under mpirun (not torchrun) agree with Open MPI's
  // (detect_world refuses them otherwise): PMIx's rank 0 is the world's.
  if (source == WorldSource::torchrun && env("OMPI_COMM_WORLD_SIZE") != nullptr &&
      env("TORCHELASTIC_RUN_ID") == nullptr) {
    source = WorldSource::openmpi;
  }
  if (source != WorldSource::openmpi && source != WorldSource::slurm) {
    return {{}, {}, fmt::format("{} does not say where rank 0 runs", to_string(source))};
  }
  std::string pmix_why;
  if (env("PMIX_NAMESPACE") != nullptr) {
#ifdef WEIGHTCAST_HAVE_PMIX
    RootHost found = pmix_root_host();
    if (!found.host.empty()) return found;
    pmix_why = found.why_not;
#else
    pmix_why = "this build has no PMIx";
#endif
  } else {
    pmix_why = "no PMIx launcher (PMIX_NAMESPACE unset)";
  }
  if (source == WorldSource::slurm) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
      const char* list = env(name);
      if (list == nullptr) continue;
      std::string host = first_slurm_host(list);
      if (!host.empty()) return {host, fmt::format("the first host of {}", name), {}};
    }
  }
  return {{}, {}, pmix_why};
}

}  // namespace weightcast
