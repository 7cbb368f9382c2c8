/**
 * @file job.hpp
 * @brief A whole load on any number of ranks as one call: `run_job`.
 *
 * Every rank of the job calls `run_job` with the same settings; rank 0 alone needs the
 * checkpoint. In order, on every rank:
 *  1. **meet**: the world is found (given, or from the launcher's environment as `weightcast
 *     run` finds it: world.hpp), the device made, the data plane chosen, and the ranks meet
 *     over the control plane (TCP to rank 0, control_plane.hpp); rank 0 sends its
 *     `identity` and every rank that has one compares it with its own, before rank 0 opens
 *     the checkpoint;
 *  2. **catalogue**: rank 0 opens the checkpoint and sends its catalogue to every rank, and
 *     every rank checks that it agrees with rank 0 on the settings that shape the broadcasts
 *     (`chunk_bytes`, device kind, transport, `verify`): ranks that disagree would post
 *     broadcasts of different sizes, which MPI does not detect;
 *  3. **plan**: the load's options are fixed for the device; then every rank tells rank 0 it
 *     is ready and rank 0 answers, so that a rank that failed so far ends every rank before
 *     any of them enters a collective (left out where the job initialises MPI itself:
 *     `MPI_Init_thread` waits for every rank anyway);
 *  4. **transport**: the data plane is joined: `mpi` (host memory; the caller's communicator
 *     or `MPI_COMM_WORLD`), `nccl` (GPU memory; the caller's communicator or a new one, whose
 *     unique id travels over the control plane), `local` at world size 1;
 *  5. **load**: `load()` (loader.hpp) on every rank;
 *  6. **verdict**: with `verify: digest` every rank hashes each tensor it holds (XXH3-64)
 *     and rank 0 compares them with its own; rank 0's verdict reaches every rank, which
 *     then shuts its transport down, and rank 0 waits for every rank to hang up.
 *
 * ## The failure model
 * No rank ever waits unboundedly, and every rank ends with the one message: a failure on any
 * rank (an error, a lost or stopped peer, a stall past `rendezvous.timeout` or
 * `load.timeout`) is sent to every rank over the control plane, and each rank's `run_job`
 * ends with that rank's message and `Errc`: "rank 2: model-00002-of-00004.safetensors: ...".
 *  - Where the failure can be unwound, `run_job` **throws** `Error` on every rank: before any
 *    collective (the rendezvous, the catalogue, the settings, step 3's readiness), with the
 *    `local` transport, with `nccl` while its broadcasts are in flight (they are ended with
 *    `ncclCommAbort`: NCCL docs, "Error handling and communicator abort"), and in the
 *    control-plane waits after the load.
 *  - Where it cannot, the `FailurePolicy` decides; by default (`end_process`) the process
 *    ends, with `_exit(exit_status(code))`, after `on_failure` and `before_exit`. That is: a
 *    failure while an `MPI_Ibcast` is in flight (a non-blocking collective cannot be cancelled,
 *    MPI 4.0 §5.12: MPI may still write into the arena and will hang any later collective or
 *    `MPI_Finalize`), and a calling thread that does not come back at all (stuck in
 *    `MPI_Init_thread`, `MPI_Comm_dup`, the mpi transport's node split (`MPI_Comm_split_type`) or
 *    `MPI_Finalize` past the timeout, or still in one
 *    of them 1 s after another rank's failure, while one that returns unwinds; or, 2 s after
 *    another rank's failure, still in a hook of the caller's or inside NCCL's own polling,
 *    which is bounded only by `load.timeout`: creating the communicator, enqueueing a
 *    broadcast group). With `throw_error` the first
 *    case throws too, and MPI must not be used again in this process; the second always ends
 *    the process, as nothing else returns control.
 *
 * `on_failure` is called once per failed job on every rank, with the message the job ends
 * with, before the bounded waits that let the other ranks learn of it: log or print there.
 * For another rank's failure it is called as this rank learns of it, from the control
 * plane's thread, while the calling thread may still be unwinding (a launcher may end
 * the process before that thread comes back): it must be safe to call from any thread.
 *
 * ## MPI
 * If MPI is already initialised (`MPI_Initialized`), the job uses it and never finalises
 * it; otherwise the job initialises it (`MPI_THREAD_FUNNELED`) and finalises it at the end.
 * The job never initialises MPI twice. It broadcasts on a duplicate (`MPI_Comm_dup`) of the
 * caller's communicator (`JobOptions::mpi_communicator`) or of `MPI_COMM_WORLD`: a
 * communicator of its own keeps its `MPI_Ibcast`s apart from any collective the trainer has
 * in flight on its communicator (collectives on one communicator must be posted in the same
 * order by every rank, MPI 4.0 §6.12), and lets it set `MPI_ERRORS_RETURN` without changing
 * the caller's error handler. The duplicate is freed at the end of the job.
 *
 * job.hpp needs neither mpi.h nor nccl.h nor Boost.Asio: communicators are handed in as
 * opaque values (weightcast/transport/mpi.hpp, weightcast/transport/nccl.hpp), and the coroutine form is in
 * weightcast/distributed/asio.hpp.
 */
#pragma once

#include "weightcast/transport/communicators.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/control/control_plane.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"
#include "weightcast/control/world.hpp"

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <vector>

namespace weightcast {

/// What `run_job` does with a failure it cannot unwind (see "The failure model" above).
enum class FailurePolicy {
  /// Ends the process: `on_failure`, `before_exit`, then `_exit(exit_status(code))` (no
  /// destructors or atexit handlers run: other threads may be inside MPI). The default.
  end_process,
  /// Throws `Error` as for any other failure, leaving MPI unusable in this process: a
  /// broadcast is still posted, so no further MPI call (`MPI_Finalize` included) may be
  /// made, and MPI may still write into memory the failed load had allocated. For callers
  /// that clean up, then end the process themselves. A calling thread stuck inside MPI
  /// still ends the process.
  throw_error,
};

/// Test seams: tests/distributed/test_multirank.cpp drives them through the CLI's `WEIGHTCAST_TEST_*`
/// variables (tools/test_hooks.cpp), to act on a job at a known step. Not for production use;
/// empty by default.
struct JobTestHooks {
  /// Rank 0, once it has opened the checkpoint, before it sends the catalogue.
  std::function<void()> after_catalogue;
  /// Every rank, on its digests before they go to rank 0 (a test corrupts one).
  std::function<void(std::vector<std::uint64_t>& digests)> before_report;
  /// Every rank, once it has the verdict, before its transport shuts down (MPI_Finalize).
  std::function<void()> after_verdict;
  /// Every rank under transport mpi, once its MPI session is open, still inside the watched
  /// call that opened it (a rank slow to come back from MPI_Comm_dup).
  std::function<void()> inside_mpi_open;
};

/// One rank's outcome of a job.
struct JobResult {
  LoadResult load;                     ///< This rank's tensors, arena and statistics.
  /// This rank's XXH3-64 of every tensor (catalogue order) that rank 0 compared; empty with
  /// `verify: none` and at world size 1 (nothing to compare with).
  std::vector<std::uint64_t> digests;
  double digest_seconds = 0;           ///< Time this rank spent hashing, seconds.
  /// Rank 0's verdict, the same on every rank: status 0 and e.g. "3 ranks × 291 tensors
  /// bit-exact (...)". A failing verdict is thrown (`Error` `internal`, 70), never returned.
  Verdict verdict;
  World world;                         ///< The world the job ran in.
};

/**
 * @brief Everything one rank's `run_job` needs: a plain aggregate; every field has a
 *        default. `from_config` fills it as `weightcast run` does from its YAML config.
 *
 * The settings that shape the broadcasts (`load.chunk_bytes`, `device`, `transport`,
 * `verify`) must be the same on every rank: rank 0 compares them and the job fails with
 * `config` (78) naming the first that differs. Hooks run on the thread that called `run_job`
 * unless said otherwise; an exception a hook throws fails the job on every rank with this
 * rank's message, as any error does.
 */
struct JobOptions {
  /// The checkpoint: a `.safetensors` file, a directory, or an index. Read on rank 0 only
  /// (the others get its catalogue); ignored elsewhere.
  std::filesystem::path checkpoint;
  /// What a directory of several `.safetensors` files and no index is to rank 0
  /// (`open_checkpoint`): refused, or pieces of tensors each its own catalogue entry (the DCP
  /// reader's). Ignored on the other ranks.
  CheckpointPieces pieces = CheckpointPieces::refuse;
  /// This process's place; nullopt: `detect_world(WorldRequest{})` (the launcher's environment),
  /// or, with `mpi_communicator` / `nccl_communicator`, the communicator's rank and size.
  std::optional<World> world;
  /// What this rank's load is, as the caller names it, e.g. "checkpoint 'models/llama'" (the
  /// Python package sets the checkpoint's path as given, lexically normalised). Rank 0 shares
  /// its own once the ranks have met, before it opens the checkpoint; a rank whose `identity`
  /// differs from rank 0's fails the job on every rank with `config` (78), its message naming
  /// this rank's and rank 0's: two jobs whose ranks met in the wrong pairs (two loads at once
  /// in each process, started in different orders) must not deliver one job's bytes to the
  /// other's. Empty on this rank or on rank 0: not compared (ranks other than 0 may then pass
  /// any `checkpoint`, which they never read).
  std::string identity;
  /// Where the ranks meet; nullopt: `rendezvous_options(Config{}, world)`: rank 0's address
  /// from `$MASTER_ADDR` (else 127.0.0.1), port `setting::rendezvous_port`'s default, token
  /// `$WEIGHTCAST_TOKEN`, timeout `load.timeout`. Unused at world size 1.
  std::optional<RendezvousOptions> rendezvous;
  /// Where tensors land: host memory, a CUDA device (the world's local rank is its ordinal,
  /// or `nccl_communicator->cuda_device`), or auto (cuda where a GPU is usable).
  DeviceKind device = DeviceKind::automatic;
  /// The data plane: auto is `local` at world size 1, else `nccl` for GPU memory and, for
  /// host memory, `mpi` in an MPI world (mpirun's ranks, MPI initialised, a communicator or
  /// `mpi_source` handed in) or `tcp` elsewhere (`resolve_transport`).
  TransportKind transport = TransportKind::automatic;
  /// The caller's MPI communicator to broadcast on (duplicated: see "MPI" above); nullopt:
  /// `MPI_COMM_WORLD`. Implies `transport` mpi.
  std::optional<MpiCommunicator> mpi_communicator;
  /// Where transport mpi gets the caller's communicator when the caller makes it on first
  /// use and keeps it past the job (the Python package initialises MPI once per process):
  /// called on the calling thread in step 4, once every rank has met and said it is ready,
  /// inside the same watched call as `MPI_Init_thread` (past the rendezvous timeout, the job
  /// ends the process: the failure model); what it returns is used as `mpi_communicator`.
  /// Unlike a communicator made before `run_job`, an MPI initialised here cannot hold a rank
  /// past the timeout when some rank never joins: the rendezvous fails first. Ignored when
  /// `mpi_communicator` is set or the transport is not mpi.
  std::function<MpiCommunicator()> mpi_source;
  /// The caller's NCCL communicator to broadcast on, as it is; nullopt: a new one of the
  /// job's own. Implies `transport` nccl and a cuda device.
  std::optional<NcclCommunicator> nccl_communicator;
  /// `digest`: every rank's tensors are hashed and compared with rank 0's after the load;
  /// `none` skips that work.
  Verify verify = Verify::digest;
  /// The load's knobs and hooks (loader.hpp). `load.stop` stops the load as `load()` says
  /// (requested earlier, the job ends as the load starts), and every rank then ends with this
  /// rank's `interrupted` (130); the job also reports this rank's progress to the others
  /// (for a stall's message) from `load.on_progress`'s call site.
  LoadOptions load;

  /// Which part of each tensor this rank receives (docs/placement.md): `replicate` (the
  /// default: every tensor whole), `fsdp` (torch's `Shard(0)` with torch.chunk's split), and
  /// rules by tensor name. Each rank resolves its own (ranks may run different configs);
  /// rank 0 checks every rank's wants against the catalogue before any byte moves and fails
  /// every rank with one message naming the rank, tensor and key (78; 65 for the checkpoint).
  PlacementSpec placement;
  /// In-place destinations: when set, called on every rank once the catalogue is known, it
  /// returns this rank's wants (per tensor: the local shard's offset and shape per dim, and
  /// a destination pointer with its capacity, memory kind and optional dtype to cast to), and
  /// `placement` is not used. Bytes land straight in those destinations; the result's
  /// `load.local(i)` views them. Called on the job's thread; the memory must stay valid until
  /// `run_job` returns.
  std::function<RankWants(const Catalogue& catalogue, int rank, int world_size)> wants;

  /// What to do with a failure that cannot be unwound (see "The failure model").
  FailurePolicy failure_policy = FailurePolicy::end_process;
  /// Called once when this rank's job fails, with the error it ends with, before the bounded
  /// waits that let the other ranks learn of it and before the process may be ended. May run
  /// on a thread of the job's own (when the calling thread is stuck). Must not throw. Empty:
  /// nothing, except that the error is logged (log.hpp) before the process is ended.
  std::function<void(const Error&)> on_failure;
  /// Called just before the process is ended (`FailurePolicy`), after `on_failure`: flush
  /// what must not be lost. Any thread; must not throw.
  std::function<void(const Error&)> before_exit;

  /// Called once the ranks have met with the job's control plane (to send an ABORT of the
  /// caller's, e.g. on a signal: `ControlPlane::abort`), and with nullptr before it closes.
  /// A throw from the first call fails the job on every rank (the CLI checks its output paths
  /// there).
  std::function<void(ControlPlane*)> on_control_plane;
  /// Called on every rank before the catalogue is shared: on rank 0 with the checkpoint's
  /// catalogue, just opened; elsewhere with an empty one.
  std::function<void(const Catalogue&)> on_catalogue;
  /// Called just before the load starts.
  std::function<void()> on_load_start;
  /// Called once the load has ended, with its failure (null on success). May throw: its
  /// exception then replaces the load's outcome (the CLI turns a stop on SIGTERM into
  /// "interrupted by SIGTERM" there, after writing the trace).
  std::function<void(std::exception_ptr failure)> on_load_end;
  /// Called on every rank once this rank has loaded and hashed, before the verdict
  /// (`JobResult::verdict` is empty then).
  std::function<void(const JobResult&)> on_loaded;
  /// Called on every rank with the verdict, passing or failing, before the job acts on it
  /// (a failing verdict is thrown after this) and before the transport shuts down.
  std::function<void(const JobResult&)> on_verdict;

  JobTestHooks test_hooks;  ///< Test seams; empty in production.

  /**
   * @brief The options `weightcast run` uses for @p config in @p world: checkpoint, device,
   *        transport, verify, `load_options(config)` (config/load_options.hpp), the world, and
   *        `rendezvous_options(config, world)`. Hooks are left empty.
   */
  static JobOptions from_config(const Config& config, const World& world);
};

/**
 * @brief Runs this rank's part of the job described by @p options (see the file comment);
 *        blocks until the job has ended on this rank (on rank 0: until every rank has hung
 *        up after the verdict).
 *
 * Call it on every rank of the world with the same settings. Messages of a job of several
 * ranks start with the rank they concern ("rank 2: ..."); at world size 1 they do not.
 *
 * @return this rank's result and rank 0's passing verdict.
 * @throws Error with this rank's message, or the failing rank's on every other (its `Errc`;
 *         `exit_status` maps it to a `<sysexits.h>` status): `config` (78) for options out of
 *         bounds, a transport that does not suit the world or device, settings or an
 *         `identity` that differ between ranks, no checkpoint on rank 0; what
 *         `open_checkpoint` and `load` throw (64-66, 74, 75, 130); `unavailable` (69) when a
 *         peer is lost, the device, MPI or NCCL cannot be used, or MPI's rank and size
 *         disagree with the world; `timeout` (75) when a rank stalls (the message names the
 *         silent ranks and how far each got); `interrupted` (130) when `load.stop` is
 *         requested, also during the rendezvous; `internal` (70) for a digest mismatch (rank
 *         0 lists them; the others say rank 0 found some).
 *         Under `FailurePolicy::end_process` some failures end the process instead (above).
 */
JobResult run_job(const JobOptions& options);

/// `run_job(options)` on a thread of its own; the future holds the result or the error. As
/// with every `std::async` future, destroying it waits for the job to end (request a stop on
/// `options.load.stop` to end it early). With MPI initialised by the caller at
/// `MPI_THREAD_FUNNELED` or less, the job must run on the thread that initialised MPI: use
/// `run_job` there (the job throws `unavailable` otherwise).
std::future<JobResult> run_job_async(JobOptions options);

/// @return true when this build has MPI and this process is in an MPI world: MPI is
///         initialised already, or an MPI launcher started it (`started_by_mpi_launcher`:
///         `OMPI_COMM_WORLD_SIZE`, `PMIX_RANK`, `PMI_RANK`, `PMI_SIZE`). What `transport: auto`
///         on host memory asks before it picks mpi over tcp (`resolve_transport`). Never throws.
bool mpi_world_present() noexcept;

/**
 * @brief The data plane of a world of @p world_size ranks for @p asked on a device that is
 *        host memory (@p host_device) or a GPU; `run_job` applies it, and a launcher may
 *        before it starts any rank.
 * @param mpi_world whether the ranks are in an MPI world (the build has MPI and
 *        `mpi_world_present()`, or an MPI communicator or `mpi_source` is handed in): what
 *        `auto` on host memory needs to pick mpi.
 * @return `local` at world size 1; else `mpi`, `tcp` or `nccl` (auto: nccl for a GPU; for
 *         host memory mpi where @p mpi_world, else tcp).
 * @throws Error `config` (78): at world size 1 for mpi, nccl or tcp (there is no other rank
 *         to broadcast to); at more ranks for local (it moves no bytes between processes),
 *         mpi or tcp with a GPU device, or nccl with host memory. The message names the keys
 *         to change.
 */
TransportKind resolve_transport(TransportKind asked, bool host_device, int world_size,
                                bool mpi_world = false);

}  // namespace weightcast
