// The loads the module runs (loads.hpp): one on this process, and this rank's part of a job
// on every rank, with the caller's progress callback on a thread of its own and the checks
// that a job over MPI can run in this process.

#include "loads.hpp"

#include "job_thread.hpp"

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/launch_options.hpp"
#include "weightcast/config/load_options.hpp"
#include "weightcast/control/world.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/distributed/job.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"
#include "weightcast/transport/transport.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

namespace weightcast::python {
namespace {

/// The caller's stream as Python hands it over: None is no stream; an int is a
/// `cudaStream_t`, 0 (torch's default stream) the legacy default stream, never "none".
CallerStream caller_stream(std::optional<std::uintptr_t> handle) {
  return handle ? CallerStream::from_handle(*handle) : CallerStream::none();
}

/// The caller's progress callback, called on a thread of its own: the load's hook only
/// records the latest update (every @p interval_s, and the last chunk) and returns, so a slow
/// callback neither throttles the pipeline nor keeps its stall timeout from firing; updates
/// that arrive while the callback runs are dropped but the latest. A callback that raises is
/// dropped (reported as unraisable) rather than failing the load.
class ProgressRelay {
 public:
  /// @p callback: None for no progress (then `hook()` is empty and no thread starts).
  ProgressRelay(nb::object callback, double interval_s)
      : _callback(std::move(callback)), _interval(interval_s) {
    if (!_callback.is_none()) _thread = std::thread([this] { serve(); });
  }
  /// Joins the thread: call `finish` first, without the GIL.
  ~ProgressRelay() {
    if (_thread.joinable()) finish();
  }
  ProgressRelay(const ProgressRelay&) = delete;
  ProgressRelay& operator=(const ProgressRelay&) = delete;

  /// The load's `on_progress`: cheap, never blocks on the callback.
  std::function<void(const LoadProgress&)> hook() {
    if (!_thread.joinable()) return {};
    return [this](const LoadProgress& p) {
      const auto now = std::chrono::steady_clock::now();
      if (p.chunks_done != p.chunks_total && now - _last < _interval) return;
      _last = now;
      {
        std::lock_guard lock(_mutex);
        _latest = Update{p.bytes_done, p.bytes_total, p.chunks_done, p.chunks_total, p.seconds,
                         std::string(p.shard_name)};
      }
      _changed.notify_one();
    };
  }

  /// Delivers the update still pending (the last chunk's, on success), then ends the thread.
  /// Call without the GIL (the thread takes it to call back).
  void finish() {
    {
      std::lock_guard lock(_mutex);
      _closing = true;
    }
    _changed.notify_one();
    if (_thread.joinable()) _thread.join();
  }

 private:
  struct Update {
    std::uint64_t bytes_done, bytes_total, chunks_done, chunks_total;
    double seconds;
    std::string shard;
  };

  void serve() {
    for (;;) {
      Update next;
      {
        std::unique_lock lock(_mutex);
        _changed.wait(lock, [this] { return _latest || _closing; });
        if (!_latest) return;
        next = std::move(*_latest);
        _latest.reset();
      }
      nb::gil_scoped_acquire acquire;
      if (_callback.is_none()) continue;
      try {
        _callback(next.bytes_done, next.bytes_total, next.chunks_done, next.chunks_total,
                  next.seconds, fs_str(next.shard));
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("weightcast progress renderer");
        _callback = nb::none();
      }
    }
  }

  nb::object _callback;  // used with the GIL held
  const std::chrono::duration<double> _interval;
  std::chrono::steady_clock::time_point _last;  // the load's thread only
  std::mutex _mutex;
  std::condition_variable _changed;
  std::optional<Update> _latest;
  bool _closing = false;
  std::thread _thread;  // last: starts after the members it uses exist
};

/// Runs @p work (which loads, reporting through @p relay), then lets @p relay deliver its
/// last update and end, without the GIL, whether @p work returned or threw.
template <class Work>
auto with_progress(ProgressRelay& relay, Work work) {
  struct Finish {
    ProgressRelay& relay;
    ~Finish() {
      nb::gil_scoped_release release;
      relay.finish();
    }
  } finish{relay};
  return work();
}

}  // namespace

PyLoadResult py_load(const PyCatalogue& catalogue, const std::string& device_kind,
                     int device_ordinal, const Config& config, std::optional<std::uintptr_t> cuda_stream,
                     nb::object progress, double progress_interval_s, const PyCancel* cancel) {
  LoadOptions options = load_options(config);
  const DeviceKind kind = parse_device_kind(device_kind);
  options.tensor_alignment = setting::torch_tensor_alignment(kind);
  options.cuda_stream = caller_stream(cuda_stream);
  check_load_options(options);
  ProgressRelay relay(std::move(progress), progress_interval_s);
  options.on_progress = relay.hook();

  Catalogue copy = catalogue.catalogue;
  auto result = with_progress(relay, [&] {
    return run_interruptible(
        [&](std::stop_token stop) {
          LoadOptions o = options;
          o.stop = stop;
          auto device = kind == DeviceKind::cuda ? make_cuda_device(device_ordinal)
                                                 : make_host_device();
          auto transport = make_local_transport();
          return std::make_shared<LoadResult>(load(std::move(copy), *device, *transport, o));
        },
        /*on_job_thread=*/false, /*keyboard_interrupt=*/nullptr,
        cancel != nullptr ? &cancel->requested : nullptr);
  });
  PyLoadResult out;
  out.result = std::move(result);
  return out;
}

// ---- a job on one or several ranks (run_job) --------------------------------------------

namespace {

/// "where: TypeError: message" for a Python exception (GIL held).
std::string fmt_python_error(nb::python_error& e, const char* where) {
  nb::handle type = e.type();
  return std::string(where) + ": " + nb::cast<std::string>(type.attr("__name__")) + ": " +
         nb::cast<std::string>(nb::str(e.value()));
}

/// A Python exception raised by a hook the job calls, as the library's `Error`: a
/// `weightcast.Error` keeps its status and message; any other exception is `usage` (64),
/// named by its type. The job then ends every rank with it.
[[noreturn]] void rethrow_as_error(nb::python_error& e, const char* where) {
  nb::object error_class = nb::module_::import_("weightcast._errors").attr("Error");
  if (e.matches(error_class)) {
    const int status = nb::cast<int>(e.value().attr("status"));
    throw Error(errc_for_exit_status(status), nb::cast<std::string>(nb::str(e.value())));
  }
  throw Error(Errc::usage, fmt_python_error(e, where));
}

/// Before a job on several ranks over MPI (the JobThread's own thread only): whether this
/// process can use MPI at all. Nothing here waits for another rank.
/// @throws Error `unavailable` (69) when MPI cannot be used for @p world.
void check_job_mpi(const World& world) {
  JobThread& thread = JobThread::get();
  if (thread.mpi_suspect) {
    throw Error(Errc::unavailable,
                "transport mpi: an earlier load on several ranks failed after its broadcasts "
                "had started, and MPI cannot be used again in this process (MPI 4.0 §5.12: a "
                "broadcast in flight cannot be cancelled); end the process and start again");
  }
  if (thread.forked && mpi_initialized()) {
    throw Error(Errc::unavailable,
                "transport mpi: this process is a fork of one that initialised MPI, which a "
                "forked child cannot use (MPI 4.0 leaves fork undefined); load in the parent");
  }
  if (!thread.mpi && !started_by_mpi_launcher() && !mpi_initialized()) {
    throw Error(Errc::unavailable,
                "transport mpi: " + world.describe() + ", but this process was not started "
                "by mpirun: host tensors on several ranks travel over MPI, which needs the "
                "ranks started by mpirun (mpirun -n " + std::to_string(world.world_size) +
                " python ...); under torchrun load to CUDA (device='cuda', transport nccl)");
  }
}

/// The job thread's MPI session, made on first use (the JobThread's own thread only): the
/// job calls it (JobOptions::mpi_source) once every rank has met, so that MPI_Init_thread,
/// which waits for every rank with no timeout of its own, never waits for a rank that did
/// not come: the rendezvous has named it by then.
/// @throws Error `unavailable` (69) when MPI's rank and size are not @p world's.
MpiCommunicator job_mpi(const World& world) {
  JobThread& thread = JobThread::get();
  if (!thread.mpi) {
    thread.mpi = std::make_unique<MpiSession>();
    // MPI holds the launcher's PMIx client now: let go of the world's (find_root_host).
    if (thread.mpi->initialised_mpi()) release_root_host_query();
  }
  if (thread.mpi->rank() != world.rank || thread.mpi->world_size() != world.world_size) {
    throw Error(Errc::unavailable,
                "transport mpi: MPI says rank " + std::to_string(thread.mpi->rank()) + " of " +
                    std::to_string(thread.mpi->world_size()) + ", but this is " +
                    world.describe() + "; launch every rank with mpirun -n " +
                    std::to_string(world.world_size));
  }
  return MpiCommunicator{thread.mpi->communicator()};
}

/// The checkpoint's path as the caller gave it, lexically normalised ("./a//b/" is "a/b"):
/// what every rank's load is compared by (JobOptions::identity). Not made absolute: ranks on
/// other nodes may run in other directories.
std::string checkpoint_as_given(const std::string& checkpoint) {
  std::string normal = std::filesystem::path(checkpoint).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

/// While it lives, this process runs a load on several ranks. Such loads run one at a time
/// per process: ranks meet in the order their loads reach rank 0, so two at once from two
/// threads would pair across ranks in whatever order each process started them.
class SeveralRanksLoad {
 public:
  SeveralRanksLoad() {
    if (in_flight().exchange(true)) {
      throw Error(Errc::usage,
                  "another load on several ranks is in progress in this process (from another "
                  "thread): loads on several ranks run one at a time per process, since every "
                  "rank must make the same calls in the same order; load one checkpoint after "
                  "the other");
    }
  }
  ~SeveralRanksLoad() { in_flight().store(false); }
  SeveralRanksLoad(const SeveralRanksLoad&) = delete;
  SeveralRanksLoad& operator=(const SeveralRanksLoad&) = delete;

 private:
  static std::atomic<bool>& in_flight() {
    static std::atomic<bool> flag{false};
    return flag;
  }
};

/// A Python want (name, offset, shape, data_ptr, capacity, memory, dtype) as the library's.
TensorWant want_of(const nb::handle& item) {
  nb::tuple t = nb::cast<nb::tuple>(item);
  if (t.size() != 7) throw Error(Errc::internal, "weightcast: a want is a 7-tuple");
  TensorWant w;
  w.tensor = nb::cast<std::string>(t[0]);
  if (!t[1].is_none()) w.offset = nb::cast<std::vector<std::uint64_t>>(t[1]);
  if (!t[2].is_none()) w.shape = nb::cast<std::vector<std::uint64_t>>(t[2]);
  w.destination.data = reinterpret_cast<std::byte*>(nb::cast<std::uintptr_t>(t[3]));
  w.destination.capacity_bytes = nb::cast<std::uint64_t>(t[4]);
  const std::string memory = nb::cast<std::string>(t[5]);
  w.destination.memory = memory == "cuda" ? MemoryKind::cuda : MemoryKind::host;
  if (!t[6].is_none()) {
    const std::string name = nb::cast<std::string>(t[6]);
    const auto dtype = parse_dtype(name);
    if (!dtype) throw Error(Errc::internal, "weightcast: no dtype '" + name + "'");
    w.destination.dtype = *dtype;
  }
  return w;
}

}  // namespace

PyLoadResult py_run_job(const std::string& checkpoint, const std::string& device_kind,
                        int device_ordinal, const Config& settings, std::optional<std::uintptr_t> cuda_stream,
                        std::optional<std::string> placement,
                        std::optional<int> rendezvous_port, nb::object plan,
                        nb::object progress, double progress_interval_s, bool alone,
                        bool pieces, const PyCancel* cancel) {
  const Config config = with_rendezvous_port(settings, rendezvous_port);
  // Alone: a world of one rank, whatever the launcher's environment says.
  World world = alone ? World{} : detect_world(config);
  const DeviceKind kind = parse_device_kind(device_kind);
  // A CUDA device's ordinal is the world's local rank (job.hpp); the caller's device wins.
  if (kind == DeviceKind::cuda) world.local_rank = device_ordinal;
  JobOptions job = JobOptions::from_config(config, world);
  job.checkpoint = checkpoint;
  job.pieces = pieces ? CheckpointPieces::separate : CheckpointPieces::refuse;
  job.device = kind;
  job.load.tensor_alignment = setting::torch_tensor_alignment(kind);
  job.load.cuda_stream = caller_stream(cuda_stream);
  check_load_options(job.load);
  // Every rank names the checkpoint it was given (never opened but on rank 0): two loads at
  // once, paired across ranks in the wrong order, then fail on every rank instead of
  // delivering one checkpoint's bytes into the other's destinations.
  job.identity = "checkpoint '" + checkpoint_as_given(checkpoint) + "'";
  const bool several = world.world_size > 1;
  std::optional<SeveralRanksLoad> one_at_a_time;
  if (several) one_at_a_time.emplace();
  ProgressRelay relay(std::move(progress), progress_interval_s);
  job.load.on_progress = relay.hook();
  if (placement) {
    if (*placement == "replicate") {
      job.placement = PlacementSpec{};
    } else if (*placement == "fsdp") {
      job.placement = PlacementSpec{PlacementMode::fsdp, {}};
    } else {
      throw Error(Errc::config, "placement: '" + *placement + "' is not one of replicate, fsdp");
    }
  }
  // Python unwinds: an exception on every rank, also where MPI is left with a broadcast in
  // flight (MPI is then unusable in this process: job_mpi refuses it after).
  job.failure_policy = FailurePolicy::throw_error;
  auto plan_fn = std::make_shared<nb::object>(std::move(plan));
  if (!plan_fn->is_none()) {
    const PlacementSpec spec = job.placement;
    job.wants = [plan_fn, spec](const Catalogue& catalogue, int rank, int world_size) {
      nb::gil_scoped_acquire acquire;
      try {
        nb::object got = (*plan_fn)(PyCatalogue{catalogue}, rank, world_size);
        if (got.is_none()) return resolve_placement(spec, catalogue, rank, world_size);
        RankWants wants;
        for (nb::handle item : got) wants.tensors.push_back(want_of(item));
        return wants;
      } catch (nb::python_error& e) {
        rethrow_as_error(e, "load_into");
      }
    };
  }
  // Host tensors travel over MPI where the config says mpi, or says auto in an MPI world
  // (mpirun's ranks, MPI initialised); torchrun's and torch.multiprocessing's ranks use tcp,
  // and `transport: shm` shares the node's staging ring instead (no MPI at all).
  const bool mpi = several && kind == DeviceKind::host &&
                   (job.transport == TransportKind::mpi ||
                    (job.transport == TransportKind::automatic && mpi_world_present()));
  auto started = std::make_shared<std::atomic<bool>>(false);
  job.on_load_start = [started] { started->store(true); };
  // A load stopped by Ctrl-C says so: the other ranks end with this rank's message.
  auto keyboard = std::make_shared<std::atomic<bool>>(false);
  // A load stopped by LoadHandle.cancel() says so too (a stop for any other reason keeps
  // the library's message).
  const std::atomic<bool>* cancelled = cancel != nullptr ? &cancel->requested : nullptr;
  job.on_load_end = [keyboard, cancelled](std::exception_ptr failure) {
    const bool by_cancel = cancelled != nullptr && cancelled->load();
    if (!failure || (!keyboard->load() && !by_cancel)) return;
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      if (e.code() != Errc::interrupted) return;
    } catch (...) {
      return;
    }
    if (keyboard->load()) {
      throw Error(Errc::interrupted, "interrupted by SIGINT (Ctrl-C) during the load");
    }
    throw Error(Errc::interrupted, "cancelled (LoadHandle.cancel()) during the load");
  };
  if (mpi) job.mpi_source = [world] { return job_mpi(world); };

  auto result = with_progress(relay, [&] {
    return run_interruptible(
        [&](std::stop_token stop) {
          JobOptions o = job;
          o.load.stop = stop;
          if (mpi) check_job_mpi(world);
          try {
            return std::make_shared<JobResult>(run_job(o));
          } catch (...) {
            if (mpi && started->load()) JobThread::get().mpi_suspect = true;
            throw;
          }
        },
        /*on_job_thread=*/true, keyboard.get(), cancelled);
  });
  PyLoadResult out;
  out.rank = result->world.rank;
  out.world_size = result->world.world_size;
  out.verdict = result->verdict.message;
  out.result = std::make_shared<LoadResult>(std::move(result->load));
  return out;
}

}  // namespace weightcast::python
