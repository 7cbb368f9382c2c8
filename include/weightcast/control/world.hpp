/**
 * @file world.hpp
 * @brief Who this process is in the job: rank, world size, local rank, and where that came from.
 *
 * docs/DESIGN.md § World. The first source that names a rank wins:
 *  1. the config (`world.rank`, `world.size`, `world.local_rank`: `WorldRequest`);
 *  2. torchrun's environment: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` (and `MASTER_ADDR`, used as
 *     the default rendezvous address);
 *  3. Slurm: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`;
 *  4. Open MPI's mpirun: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
 *     `OMPI_COMM_WORLD_LOCAL_RANK`;
 *  5. otherwise a world of one rank, whose local rank is the first of `LOCAL_RANK`,
 *     `SLURM_LOCALID` and `OMPI_COMM_WORLD_LOCAL_RANK` set (alone), else 0.
 * A source counts only when both its rank and its size variables are set; when none counts but
 * one has only its rank or only its size variable set, that is a config error (except a rank
 * of 0 alone: Slurm's batch step without a task count sets `SLURM_PROCID=0` only, a world of
 * one). Where Open MPI's variables are set too and disagree, mpirun started this process:
 * against Slurm's (mpirun inside an sbatch script), Open MPI's are the world; against
 * torchrun's without `TORCHELASTIC_RUN_ID` (left over from another launcher), a config error.
 * `world.local_rank` in the config overrides the local rank of any source. `weightcast run`
 * uses this local rank as the CUDA device ordinal with one rank as with several.
 */
#pragma once

#include "weightcast/core/settings.hpp"

#include <string>
#include <string_view>

namespace weightcast {

/// Where the world came from.
enum class WorldSource {
  config,
  torchrun,
  slurm,
  openmpi,
  single,
  /// The rank and size of the MPI or NCCL communicator handed to `run_job` (job.hpp), where
  /// they differ from the environment's (a communicator split from the launcher's world).
  communicator,
  /// torch.distributed's process group: the Python package sets `world.rank` and `world.size`
  /// from it, as overrides whose origin is `process_group_origin` (docs/python.md).
  process_group,
};

/// The origin (`Config::set_at`) of `world.*` keys the Python package sets from a torch
/// process group: a world from the config keys set with it is `WorldSource::process_group`.
inline constexpr std::string_view process_group_origin = "torch.distributed's process group";

/// @return "config", "torchrun", "slurm", "openmpi", "single", "communicator" or
///         "process_group".
std::string_view to_string(WorldSource source) noexcept;

/// This process's place in the job.
struct World {
  int rank = 0;        ///< 0 ≤ rank < world_size; rank 0 reads the checkpoint.
  int world_size = 1;  ///< Number of ranks (≥ 1).
  int local_rank = 0;  ///< Rank among the processes of this node (the CUDA device ordinal).
  WorldSource source = WorldSource::single;  ///< Where rank and world size came from.
  std::string master_addr;  ///< `$MASTER_ADDR`, or empty when not set.
  /// The launcher's id of this job, the same on every rank of one job and different between
  /// jobs: `PMIX_NAMESPACE` (else `OMPI_MCA_ess_base_jobid`) under mpirun, `SLURM_JOB_ID`
  /// `.SLURM_STEP_ID` under srun, `TORCHELASTIC_RUN_ID` under torchrun; empty from the config
  /// or with no launcher. Cut to `max_job_id_bytes`. Rank 0 refuses a peer of another job.
  std::string job_id;
  /// The variable(s) `job_id` came from, for messages (e.g. "PMIX_NAMESPACE"); empty with it.
  std::string job_id_source;
  /// What says the launcher put the ranks on more than one host, for messages (e.g.
  /// "OMPI_COMM_WORLD_LOCAL_SIZE=2 of OMPI_COMM_WORLD_SIZE=4"); empty when every rank is on
  /// this host or the launcher does not say (`launcher_spans_hosts`).
  std::string spans_hosts;
  /// Rank 0's host as the launcher knows it (a host name or address), found only when the
  /// world spans hosts and neither `rendezvous.address` nor `$MASTER_ADDR` is set
  /// (`find_root_host`); empty otherwise or when the launcher does not say.
  std::string root_host;
  /// Where `root_host` came from, for messages (e.g. "PMIx's PMIX_HOSTNAME of rank 0").
  std::string root_host_source;

  /// Longest `job_id` kept, bytes (it travels in the rendezvous hello).
  static constexpr std::size_t max_job_id_bytes = 256;

  /// @return e.g. "rank 1 of 3 (local rank 1) from torchrun's environment (RANK, WORLD_SIZE)".
  [[nodiscard]] std::string describe() const;
};

/// What the launcher's configuration asks of this process's place: its `world.*` keys
/// (weightcast/config/launch_options.hpp fills it from a `Config`).
struct WorldRequest {
  /// `world.rank`; -1 (the setting's default, auto): the environment says.
  int rank = static_cast<int>(setting::world_rank.default_value);
  /// `world.size`; 0: auto.
  int world_size = static_cast<int>(setting::world_size.default_value);
  /// `world.local_rank`; -1: auto.
  int local_rank = static_cast<int>(setting::world_local_rank.default_value);
  /// Where `world.rank` and `world.size` were set, for messages: a file and line
  /// ("x.yaml:3"), "--set", or "" (not set, or set by a caller).
  std::string rank_set_at;
  std::string size_set_at;  ///< As `rank_set_at`, of `world.size`.
  /// Whether `rendezvous.address` says where rank 0 listens: then rank 0's host is not asked
  /// of the launcher (`find_root_host`).
  bool rendezvous_address_given = false;
};

/**
 * @brief Finds the world from @p request (the config's `world.*`), else from the environment
 *        (the order above), and the job id of the family it came from.
 * @throws Error `config` (78) naming the key or variable when a value is not a whole number
 *         (or negative, or past 2^20, the config's own bound; a local-rank variable set alone
 *         included), the size is below 1, the rank
 *         is not below the size, `world.rank` and `world.size` are not set together, no
 *         launcher's environment is complete but one is partial (`RANK` without `WORLD_SIZE`,
 *         say: the message names both), or torchrun's variables disagree with Open MPI's
 *         without `TORCHELASTIC_RUN_ID`.
 */
World detect_world(const WorldRequest& request);

/**
 * @brief What says the launcher of @p source put the job's ranks on more than one host:
 *        Open MPI's `OMPI_COMM_WORLD_LOCAL_SIZE` below `OMPI_COMM_WORLD_SIZE`; Slurm's
 *        `SLURM_STEP_NUM_NODES` (else `SLURM_NNODES`) above 1; torchrun's `LOCAL_WORLD_SIZE`
 *        below `WORLD_SIZE`, or `GROUP_WORLD_SIZE` (its nodes) above 1. Where mpirun started
 *        the process (Open MPI's two variables set) and torchrun did not
 *        (`TORCHELASTIC_RUN_ID` unset), Open MPI's say, whatever @p source (a script that sets
 *        `RANK`/`WORLD_SIZE` for torch's env:// under mpirun; mpirun inside an allocation).
 * @return e.g. "SLURM_STEP_NUM_NODES=2"; empty when the variables say one host, are not set
 *         or are not whole numbers (nothing to go on), and for any other @p source.
 */
[[nodiscard]] std::string launcher_spans_hosts(WorldSource source);

/// Rank 0's host as a launcher knows it (find_root_host).
struct RootHost {
  std::string host;     ///< Rank 0's host, or empty.
  std::string source;   ///< Where `host` came from, e.g. "PMIx's PMIX_HOSTNAME of rank 0".
  std::string why_not;  ///< With no host: why (e.g. "PMIx_Get: NOT-FOUND"), for messages.
};
/**
 * @brief Rank 0's host as the launcher of @p source knows it, for a world that spans hosts
 *        with no rendezvous address given. Under a PMIx launcher (Open MPI's mpirun,
 *        `srun --mpi=pmix`: `PMIX_NAMESPACE` set, and a build with PMIx) the job-level
 *        `PMIX_HOSTNAME` of rank 0, which needs no exchange between the ranks; else under
 *        Slurm the first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`), where
 *        Slurm's block and cyclic distributions put task 0.
 * @return the host (a name the caller resolves) and where it came from, or why there is none.
 *         Never throws.
 * @note PMIx's client stays initialised until MPI holds its own (`release_root_host_query`)
 *       or the process exits: Open MPI's `MPI_Init` cannot initialise it again once finalised.
 */
[[nodiscard]] RootHost find_root_host(WorldSource source);

/// Lets go of the PMIx client `find_root_host` initialised, if it did: call once MPI is
/// initialised (whoever creates the `MpiSession` that initialised it: the job, the Python
/// package) (Open MPI's MPI_Init holds one of its own, and its MPI_Finalize is then the last,
/// as mpirun expects). A no-op otherwise; never throws.
void release_root_host_query() noexcept;

/**
 * @brief The first host of a Slurm node list ("gpu[003-005,9],login" is "gpu003").
 * @return empty for an empty or malformed list.
 */
[[nodiscard]] std::string first_slurm_host(std::string_view nodelist);

/**
 * @brief Whether this process was started by an MPI launcher (Open MPI's mpirun or mpiexec:
 *        `OMPI_COMM_WORLD_SIZE`; a PMIx or PMI one such as `srun --mpi=pmix`: `PMIX_RANK`,
 *        `PMI_RANK`, `PMI_SIZE`), so that `MPI_Init_thread` joins the other ranks rather
 *        than making a world of one (MPI 4.0 §11.2: a singleton init otherwise).
 * @note torchrun's and Slurm's own variables say nothing of MPI: a world detected from them
 *       alone cannot use transport mpi.
 */
[[nodiscard]] bool started_by_mpi_launcher() noexcept;

}  // namespace weightcast
