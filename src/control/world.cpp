#include "weightcast/control/world.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdlib>
#include <optional>

namespace weightcast {

std::string_view to_string(WorldSource source) noexcept {
  switch (source) {
    case WorldSource::config: return "config";
    case WorldSource::torchrun: return "torchrun";
    case WorldSource::slurm: return "slurm";
    case WorldSource::openmpi: return "openmpi";
    case WorldSource::single: return "single";
    case WorldSource::communicator: return "communicator";
    case WorldSource::process_group: return "process_group";
  }
  return "single";
}

namespace {

struct EnvSource {
  WorldSource source;
  const char* rank;
  const char* size;
  const char* local_rank;
};

// The order of docs/DESIGN.md § World: a launcher that sets more than one family (torchrun inside
// an srun allocation sets both) is described by the innermost, most specific one first.
constexpr EnvSource env_sources[] = {
    {WorldSource::torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {WorldSource::slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {WorldSource::openmpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
};

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

int env_int(const char* name, const char* text) {
  std::string_view view(text);
  int value = -1;
  auto [end, ec] = std::from_chars(view.data(), view.data() + view.size(), value);
  const bool digits = end == view.data() + view.size();
  if (!digits || (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw Error(Errc::config, fmt::format("environment {}='{}': not a whole number", name, text));
  }
  // The config's own bound on world.size and the ranks (the settings registry): a world of
  // more would allocate per-rank state for nothing (one WORLD_SIZE=2147483647 took gigabytes).
  constexpr auto max_world = setting::max_world_size;
  if (ec == std::errc::result_out_of_range || value > max_world) {
    throw Error(Errc::config, fmt::format("environment {}='{}': out of range (at most {})", name,
                                          text, max_world));
  }
  if (value < 0) {
    throw Error(Errc::config, fmt::format("environment {}='{}': must be >= 0", name, text));
  }
  return value;
}

/// "x.yaml:3: " or "--set ": where a key was set (@p where: `WorldRequest::rank_set_at`'s
/// form), as a message's prefix; "" for a key not set from a file or --set.
std::string set_prefix(std::string_view where) {
  if (where.empty()) return {};
  return where == "--set" ? std::string("--set ") : fmt::format("{}: ", where);
}

/// " from x.yaml:3", " from --set" or "": where a key was set, after its name.
std::string set_suffix(std::string_view where) {
  return where.empty() ? std::string() : fmt::format(" from {}", where);
}

/// Checks a world; @p request, when given, says where its world.* keys were set.
void check(const World& world, std::string_view rank_name, std::string_view size_name,
           const WorldRequest* request = nullptr) {
  const std::string size_at = request != nullptr ? set_prefix(request->size_set_at) : "";
  const std::string rank_at = request != nullptr ? set_prefix(request->rank_set_at) : "";
  const std::string size_from = request != nullptr ? set_suffix(request->size_set_at) : "";
  if (world.world_size < 1) {
    throw Error(Errc::config, fmt::format("{}{}={}: the world size must be at least 1", size_at,
                                          size_name, world.world_size));
  }
  if (world.rank >= world.world_size) {
    throw Error(Errc::config,
                fmt::format("{}{}={}: the rank must be below the world size ({}={}{})", rank_at,
                            rank_name, world.rank, size_name, world.world_size, size_from));
  }
}

}  // namespace

std::string World::describe() const {
  std::string where;
  switch (source) {
    case WorldSource::config: where = "the config (world.*)"; break;
    case WorldSource::torchrun: where = "torchrun's environment (RANK, WORLD_SIZE)"; break;
    case WorldSource::slurm: where = "Slurm's environment (SLURM_PROCID, SLURM_NTASKS)"; break;
    case WorldSource::openmpi:
      where = "Open MPI's environment (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE)";
      break;
    case WorldSource::single: where = "no launcher (a world of one rank)"; break;
    case WorldSource::communicator: where = "the communicator handed to run_job"; break;
    case WorldSource::process_group: where = "torch.distributed's process group"; break;
  }
  return fmt::format("rank {} of {} (local rank {}) from {}", rank, world_size, local_rank, where);
}

namespace {

World detect_place(const WorldRequest& request);

// The job id of @p source's family (see World::job_id).
void find_job_id(World& world) {
  auto take = [&](std::string id, std::string from) {
    if (id.size() > World::max_job_id_bytes) id.resize(World::max_job_id_bytes);
    world.job_id = std::move(id);
    world.job_id_source = std::move(from);
  };
  switch (world.source) {
    case WorldSource::openmpi:
      if (const char* ns = env("PMIX_NAMESPACE")) return take(ns, "PMIX_NAMESPACE");
      if (const char* id = env("OMPI_MCA_ess_base_jobid")) {
        return take(id, "OMPI_MCA_ess_base_jobid");
      }
      return;
    case WorldSource::slurm:
      if (const char* job = env("SLURM_JOB_ID")) {
        const char* step = env("SLURM_STEP_ID");
        return take(step != nullptr ? fmt::format("{}.{}", job, step) : std::string(job),
                    step != nullptr ? "SLURM_JOB_ID.SLURM_STEP_ID" : "SLURM_JOB_ID");
      }
      return;
    case WorldSource::torchrun:
      if (const char* id = env("TORCHELASTIC_RUN_ID")) return take(id, "TORCHELASTIC_RUN_ID");
      return;
    case WorldSource::config:
    case WorldSource::single:
    case WorldSource::communicator:
    case WorldSource::process_group:
      return;
  }
}

}  // namespace

World detect_world(const WorldRequest& request) {
  World world = detect_place(request);
  find_job_id(world);
  world.spans_hosts = launcher_spans_hosts(world.source);
  // Only where nobody said where rank 0 listens: asking PMIx initialises its client.
  if (!world.spans_hosts.empty() && !request.rendezvous_address_given &&
      world.master_addr.empty()) {
    RootHost root = find_root_host(world.source);
    world.root_host = std::move(root.host);
    world.root_host_source = std::move(root.source);
  }
  return world;
}

namespace {

World detect_place(const WorldRequest& request) {
  World world;
  if (const char* addr = env("MASTER_ADDR")) world.master_addr = addr;
  // @p source's world, when its rank and size variables are both set.
  const auto from_source = [&](const EnvSource& source) -> std::optional<World> {
    const char* rank = env(source.rank);
    const char* size = env(source.size);
    if (rank == nullptr || size == nullptr) return std::nullopt;
    World candidate = world;
    candidate.rank = env_int(source.rank, rank);
    candidate.world_size = env_int(source.size, size);
    const char* local = env(source.local_rank);
    candidate.local_rank = local != nullptr ? env_int(source.local_rank, local) : candidate.rank;
    if (request.local_rank >= 0) candidate.local_rank = request.local_rank;
    candidate.source = source.source;
    return candidate;
  };
  if (request.rank >= 0 || request.world_size > 0) {
    if (request.rank < 0 || request.world_size <= 0) {
      const bool rank_given = request.rank >= 0;
      const std::string_view given = rank_given ? "world.rank" : "world.size";
      const std::string_view other = rank_given ? "world.size" : "world.rank";
      throw Error(Errc::config,
                  fmt::format("{}{}={} but {} is auto{}: set both or neither (auto)",
                              set_prefix(rank_given ? request.rank_set_at : request.size_set_at),
                              given, rank_given ? request.rank : request.world_size, other,
                              set_suffix(rank_given ? request.size_set_at : request.rank_set_at)));
    }
    world.rank = request.rank;
    world.world_size = request.world_size;
    world.local_rank = request.local_rank >= 0 ? request.local_rank : world.rank;
    world.source = request.rank_set_at == process_group_origin ? WorldSource::process_group
                                                               : WorldSource::config;
    check(world, "world.rank", "world.size", &request);
    // A process group numbers its own ranks (a subgroup, processes torch started): the
    // launcher's variables are not a second opinion there.
    if (world.source == WorldSource::process_group) return world;
    // The config wins (docs/DESIGN.md § World); under a launcher that placed this process elsewhere
    // every rank started from one config takes the same place: rank 0 twice ended in
    // "Address already in use" with nothing to say why. Say it.
    for (const EnvSource& source : env_sources) {
      std::optional<World> placed;
      try {
        placed = from_source(source);
      } catch (const Error&) {
        continue;  // not a world to compare with
      }
      if (!placed || (placed->rank == world.rank && placed->world_size == world.world_size)) {
        continue;
      }
      spdlog::warn("world.rank {} and world.size {} from the config, though {}={} {}={} ({} "
                   "started this process): every rank given this config takes the same place; "
                   "leave world.* auto under a launcher",
                   world.rank, world.world_size, source.rank, placed->rank, source.size,
                   placed->world_size, to_string(source.source));
      break;
    }
    return world;
  }
  // The first family that set both variables, in the order above.
  for (const EnvSource& source : env_sources) {
    std::optional<World> first = from_source(source);
    if (!first) continue;
    // Open MPI's variables are set by mpirun for each process it starts, so where they are
    // present mpirun started this one. When another family disagrees with them:
    //  - Slurm's: mpirun inside an sbatch script, whose ranks all inherit the batch step's
    //    SLURM_PROCID=0 (and its SLURM_NTASKS): Open MPI's is the world.
    //  - torchrun's: torchrun started by mpirun sets its own world (and TORCHELASTIC_RUN_ID);
    //    without that variable RANK/WORLD_SIZE were left over from elsewhere, and no one can
    //    tell which world is meant.
    // torchrun's against Slurm's is torchrun inside srun: torchrun's is the world.
    const EnvSource& mpi_source = env_sources[2];
    std::optional<World> openmpi;
    if (first->source != WorldSource::openmpi) {
      try {
        openmpi = from_source(mpi_source);
      } catch (const Error&) {  // unusable: not a world to compare with
      }
    }
    if (openmpi && (openmpi->rank != first->rank || openmpi->world_size != first->world_size)) {
      if (first->source == WorldSource::slurm) {
        check(*openmpi, mpi_source.rank, mpi_source.size);
        return *openmpi;
      }
      if (env("TORCHELASTIC_RUN_ID") == nullptr) {
        throw Error(Errc::config,
                    fmt::format("environment: RANK={} WORLD_SIZE={} (torchrun's variables) but "
                                "OMPI_COMM_WORLD_RANK={} OMPI_COMM_WORLD_SIZE={} (mpirun "
                                "started this process): RANK/WORLD_SIZE look left over from "
                                "another launcher; unset them, or set world.rank/world.size",
                                first->rank, first->world_size, openmpi->rank,
                                openmpi->world_size));
      }
    }
    check(*first, source.rank, source.size);
    return *first;
  }
  // No launcher set both: one that set only half is a mistake (a missing export, a typo), not a
  // world of one rank, which would load as rank 0 and leave the real job waiting.
  for (const EnvSource& source : env_sources) {
    const char* rank = env(source.rank);
    const char* size = env(source.size);
    if ((rank == nullptr) == (size == nullptr)) continue;
    // Rank 0 alone is a world of one seen from its only rank: Slurm's batch step sets
    // SLURM_PROCID=0 without SLURM_NTASKS when the job gave no task count.
    if (rank != nullptr && std::string_view(rank) == "0") continue;
    const char* set = rank != nullptr ? source.rank : source.size;
    const char* missing = rank != nullptr ? source.size : source.rank;
    throw Error(Errc::config,
                fmt::format("environment: {}={} is set but {} is not: a partial {} environment "
                            "(set both {} and {}, or neither for a world of one rank)",
                            set, rank != nullptr ? rank : size, missing, to_string(source.source),
                            source.rank, source.size));
  }
  // A world of one still has a local rank, which picks its GPU: a launcher's local-rank
  // variable set alone (LOCAL_RANK=1 weightcast run), the first in the order above.
  for (const EnvSource& source : env_sources) {
    if (const char* local = env(source.local_rank)) {
      world.local_rank = env_int(source.local_rank, local);
      break;
    }
  }
  if (request.local_rank >= 0) world.local_rank = request.local_rank;
  return world;
}

}  // namespace

bool started_by_mpi_launcher() noexcept {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (env(name) != nullptr) return true;
  }
  return false;
}

}  // namespace weightcast
