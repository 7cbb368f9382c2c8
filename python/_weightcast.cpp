// weightcast._weightcast: the C++ side of the Python package. It binds the library's own
// entry points (open_checkpoint, load for one process, run_job for every rank of a world,
// with the caller's in-place destinations as its wants) and hands the arena out as DLPack
// tensors; the torch-facing API (dtype views, load_into's keys and wants, progress) is
// Python, in weightcast/*.py.
//
// Why a load runs on a thread of its own: the calling thread then waits with the GIL
// released and wakes every 50 ms to run Python's signal handlers (PyErr_CheckSignals), so
// Ctrl-C requests LoadOptions::stop and the load ends within moments; a blocking call in the
// main thread would not see SIGINT until it returned. Jobs all run on one such thread
// (JobThread), the one MPI is initialised on.
//
// Only the standard library, nanobind and the public headers (which include nothing else):
// the module can be built on a host that has none of the library's dependencies, given
// libweightcast.a built elsewhere.

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/distributed/job.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"
#include "weightcast/transport/transport.hpp"
#include "weightcast/transport/transport_mpi.hpp"
#include "weightcast/control/world.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace weightcast::python {
namespace {

// Arenas owned by live capsules: tensors handed out keep one capsule alive (tests read this
// to check that the arena goes exactly when its last tensor does).
std::atomic<long> live_arenas{0};

// Dimensions a tensor may cross DLPack with as it is (see py_tensors).
constexpr std::size_t kMaxExportDims = 64;

// Paths cross as bytes (os.fsencode / os.fsdecode): a POSIX file name is any bytes, and a
// name that is not UTF-8 (str with surrogate escapes in Python) would not pass as a str.
std::string fs_path(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }

nb::str fs_str(const std::string& s) {
  return nb::steal<nb::str>(PyUnicode_DecodeFSDefaultAndSize(s.data(),
                                                             static_cast<Py_ssize_t>(s.size())));
}

// A message quotes paths, which need not be UTF-8; escape such bytes rather than fail.
nb::str message_str(const char* what) {
  return nb::steal<nb::str>(PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)),
                                                 "backslashreplace"));
}

struct OwnedArena {
  std::shared_ptr<Arena> arena;
  explicit OwnedArena(std::shared_ptr<Arena> a) : arena(std::move(a)) { ++live_arenas; }
  ~OwnedArena() { --live_arenas; }
  OwnedArena(const OwnedArena&) = delete;
  OwnedArena& operator=(const OwnedArena&) = delete;
};

/// A catalogue, as Python sees it (read-only).
struct PyCatalogue {
  Catalogue catalogue;
};

/// The result of a load: the catalogue and stats, and the arena until `tensors()` hands it
/// to a capsule; for a job, the world and rank 0's verdict too.
struct PyLoadResult {
  std::shared_ptr<LoadResult> result;
  int rank = 0;
  int world_size = 1;
  std::string verdict;
};

// ---- the job thread ---------------------------------------------------------------------
//
// Every job (run_job) runs on this one thread of the module's own, for the life of the
// process. MPI, once weightcast initialises it, stays initialised until the interpreter
// exits (a process may initialise MPI once only, MPI 4.0 §11.2.1, so a job of its own that
// finalised it would leave a second load unable to start); it is initialised at
// MPI_THREAD_FUNNELED (MpiSession), so every later MPI call must come from the thread that
// initialised it: this one. `shutdown` (atexit) finalises MPI here and joins the thread.
class JobThread {
 public:
  static JobThread& get() {
    static JobThread* thread = new JobThread;  // never destroyed: shutdown() joins it
    return *thread;
  }

  template <class Work>
  auto submit(Work work) -> std::future<decltype(work())> {
    using Result = decltype(work());
    auto task = std::make_shared<std::packaged_task<Result()>>(std::move(work));
    std::future<Result> done = task->get_future();
    {
      std::lock_guard lock(_mutex);
      if (_closed) throw Error(Errc::unavailable, "weightcast: the interpreter is exiting");
      if (!_thread.joinable()) _thread = std::thread([this] { serve(); });
      _queue.emplace_back([task] { (*task)(); });
    }
    _changed.notify_one();
    return done;
  }

  /// Finalises MPI if weightcast initialised it (on this thread), then ends the thread.
  void shutdown() {
    {
      std::lock_guard lock(_mutex);
      if (_closed) return;
      if (_thread.joinable()) {
        _queue.emplace_back([this] {
          // A broadcast left in flight by a failed job: MPI_Finalize would wait for it
          // forever; make no MPI call (the process is ending anyway).
          if (mpi && mpi_suspect) mpi->abandon();
          mpi.reset();
        });
      }
      _closed = true;
    }
    _changed.notify_one();
    if (_thread.joinable()) _thread.join();
  }

  /// In a child made by fork(): the thread was not copied, and the parent's MPI is not the
  /// child's to use (MPI 4.0 leaves fork undefined). The state is forgotten, not destroyed:
  /// joining or finalising what the parent owns would hang the child.
  void after_fork_in_child() noexcept {
    new (&_mutex) std::mutex;
    new (&_changed) std::condition_variable;
    if (_thread.joinable()) new (&_thread) std::thread;  // the parent's; leaked, not joined
    _queue.clear();
    (void)mpi.release();
    forked = true;
  }

  // Used on the job thread only.
  std::unique_ptr<MpiSession> mpi;
  bool mpi_suspect = false;  // a job failed after its broadcasts may have started
  bool forked = false;       // this process is a fork of one that may have used MPI

 private:
  void serve() {
    for (;;) {
      std::function<void()> next;
      {
        std::unique_lock lock(_mutex);
        _changed.wait(lock, [this] { return !_queue.empty() || _closed; });
        if (_queue.empty()) return;
        next = std::move(_queue.front());
        _queue.pop_front();
      }
      next();
    }
  }

  std::mutex _mutex;
  std::condition_variable _changed;
  std::deque<std::function<void()>> _queue;
  bool _closed = false;
  std::thread _thread;
};

// How a safetensors dtype crosses DLPack. Types DLPack and every torch >= 2.3 agree on go
// with their own code; the F8 and F4 types go as uint8 of the same bytes and the Python side
// views them as torch's dtype (a same-size `Tensor.view(dtype)`), since torch's DLPack
// import learnt the float8 codes only recently. `bytes_per_element` is the exported
// element's size.
struct Export {
  nb::dlpack::dtype dtype;
  bool packed_f4 = false;  // F4: two elements per uint8, the last dimension halved
  bool raw = false;        // F6: no element type at all; a 1-D uint8 of the tensor's bytes
};

Export export_of(Dtype dtype) {
  using nb::dlpack::dtype_code;
  auto dt = [](dtype_code code, int bits) {
    return nb::dlpack::dtype{static_cast<std::uint8_t>(code), static_cast<std::uint8_t>(bits), 1};
  };
  switch (dtype) {
    case Dtype::BOOL: return {dt(dtype_code::Bool, 8)};
    case Dtype::U8: return {dt(dtype_code::UInt, 8)};
    case Dtype::I8: return {dt(dtype_code::Int, 8)};
    case Dtype::I16: return {dt(dtype_code::Int, 16)};
    case Dtype::U16: return {dt(dtype_code::UInt, 16)};
    case Dtype::F16: return {dt(dtype_code::Float, 16)};
    case Dtype::BF16: return {dt(dtype_code::Bfloat, 16)};
    case Dtype::I32: return {dt(dtype_code::Int, 32)};
    case Dtype::U32: return {dt(dtype_code::UInt, 32)};
    case Dtype::F32: return {dt(dtype_code::Float, 32)};
    case Dtype::C64: return {dt(dtype_code::Complex, 64)};
    case Dtype::F64: return {dt(dtype_code::Float, 64)};
    case Dtype::I64: return {dt(dtype_code::Int, 64)};
    case Dtype::U64: return {dt(dtype_code::UInt, 64)};
    case Dtype::F8_E5M2:
    case Dtype::F8_E4M3:
    case Dtype::F8_E8M0:
    case Dtype::F8_E4M3FNUZ:
    case Dtype::F8_E5M2FNUZ: return {dt(dtype_code::UInt, 8)};
    case Dtype::F4: return {dt(dtype_code::UInt, 8), true, false};
    case Dtype::F6_E2M3:
    case Dtype::F6_E3M2: return {dt(dtype_code::UInt, 8), false, true};
  }
  return {dt(dtype_code::UInt, 8), false, true};
}

LoadResult& checked(const PyLoadResult& r) {
  if (!r.result) throw Error(Errc::internal, "weightcast: this LoadResult was already consumed");
  return *r.result;
}

/// Runs @p work on a thread of its own while this thread waits with the GIL released,
/// running Python's signal handlers every 50 ms. A handler that raises (Ctrl-C's
/// KeyboardInterrupt) requests a stop and re-raises here once the load has ended.
/// With @p on_job_thread, the work runs on the JobThread instead of a thread of its own.
/// @p keyboard_interrupt, when given, is set before the stop when the handler raised
/// KeyboardInterrupt (SIGINT's), for the work's message.
template <class Work>
auto run_interruptible(Work work, bool on_job_thread = false,
                       std::atomic<bool>* keyboard_interrupt = nullptr) {
  std::stop_source stop;
  std::optional<nb::python_error> raised;
  using Result = decltype(work(stop.get_token()));
  std::future<Result> done;
  {
    nb::gil_scoped_release release;
    auto run = [&work, token = stop.get_token()] { return work(token); };
    done = on_job_thread ? JobThread::get().submit(run) : std::async(std::launch::async, run);
    while (done.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      nb::gil_scoped_acquire acquire;
      if (!raised && PyErr_CheckSignals() != 0) {
        raised.emplace();  // fetches the handler's exception
        if (keyboard_interrupt != nullptr && raised->matches(PyExc_KeyboardInterrupt)) {
          keyboard_interrupt->store(true);
        }
        stop.request_stop();
      }
    }
  }
  if (raised) throw std::move(*raised);
  return done.get();
}

DeviceKind parse_device_kind(const std::string& kind) {
  if (kind == "host" || kind == "cpu") return DeviceKind::host;
  if (kind == "cuda") return DeviceKind::cuda;
  throw Error(Errc::config, "device: '" + kind + "' is not a device (cpu, cuda, cuda:N)");
}

DirectIo parse_direct_io(const std::string& text) {
  if (text == "auto") return DirectIo::automatic;
  if (text == "on") return DirectIo::on;
  if (text == "off") return DirectIo::off;
  throw Error(Errc::config, "direct_io: '" + text + "' is not one of auto, on, off");
}

ReaderKind parse_reader(const std::string& text) {
  if (text == "auto") return ReaderKind::automatic;
  if (text == "uring") return ReaderKind::uring;
  if (text == "pread") return ReaderKind::pread;
  throw Error(Errc::config, "reader: '" + text + "' is not one of auto, uring, pread");
}

/// Options of one Python load: a config file's (if any), then each keyword given.
struct PyOptions {
  std::optional<std::string> config;
  std::optional<std::string> chunk_size;   // "16MiB" or a byte count
  std::optional<std::uint32_t> buffer_depth;
  std::optional<std::uint32_t> io_depth;
  std::optional<std::string> direct_io;    // auto|on|off
  std::optional<std::string> timeout;      // "300s" or seconds
  std::optional<std::string> reader;       // auto|uring|pread
  std::optional<std::string> verify;       // digest|none
  /// The caller's CUDA stream (torch's current stream), 0 for none: LoadOptions::cuda_stream.
  std::uintptr_t cuda_stream = 0;
};

/// @p rendezvous_port goes through the config key `rendezvous.port`, so its rule (1 to
/// 65535) and message are the config's.
Config effective_config(const PyOptions& o, std::optional<int> rendezvous_port = std::nullopt) {
  std::vector<std::string> overrides;
  if (rendezvous_port) overrides.push_back("rendezvous.port=" + std::to_string(*rendezvous_port));
  if (o.verify) overrides.push_back("verify=" + *o.verify);
  Config config = load_config(o.config.value_or(std::string()), overrides);
  if (o.chunk_size) config.chunk_bytes = parse_size(*o.chunk_size, "chunk_size");
  if (o.buffer_depth) config.buffer_depth = *o.buffer_depth;
  if (o.io_depth) config.io_depth = *o.io_depth;
  if (o.direct_io) config.direct_io = parse_direct_io(*o.direct_io);
  if (o.timeout) config.timeout = parse_duration(*o.timeout, "timeout");
  if (o.reader) config.reader = parse_reader(*o.reader);
  return config;
}

nb::dict tensor_meta(const TensorInfo& t) {
  nb::dict d;
  d["name"] = t.name;
  d["dtype"] = std::string(dtype_name(t.dtype));
  d["shape"] = nb::tuple(nb::cast(t.shape));
  d["bytes"] = t.bytes;
  d["shard"] = t.shard;
  return d;
}

nb::dict stats_dict(const LoadStats& s) {
  nb::dict d;
  d["bytes"] = s.bytes;
  d["chunks"] = s.chunks;
  d["seconds"] = s.seconds;
  d["staging_bytes"] = s.staging_bytes;
  d["reader"] = s.reader;
  d["io_mode"] = s.io_mode;
  d["device"] = s.device;
  d["transport"] = s.transport;
  d["gbps"] = s.gbps();
  return d;
}

/// `check_load_options`, naming the keyword the caller wrote rather than the C++ field.
void check_keyword_options(const LoadOptions& options) {
  try {
    check_load_options(options);
  } catch (const Error& e) {
    std::string message = e.what();
    for (auto [field, keyword] : {std::pair{"LoadOptions::chunk_bytes", "chunk_size"},
                                  std::pair{"LoadOptions::", ""}}) {
      if (auto at = message.find(field); at != std::string::npos) {
        message.replace(at, std::string_view(field).size(), keyword);
      }
    }
    throw Error(e.code(), message);
  }
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

PyLoadResult py_load(const PyCatalogue& catalogue, const std::string& device_kind,
                     int device_ordinal, const PyOptions& py_options, nb::object progress,
                     double progress_interval_s) {
  const Config config = effective_config(py_options);
  LoadOptions options = LoadOptions::from_config(config);
  const DeviceKind kind = parse_device_kind(device_kind);
  // Element-aligned host tensors at no cost for files whose offsets are aligned (the
  // safetensors writer sorts by alignment); 256 on CUDA, what torch's allocator gives kernels.
  options.tensor_alignment = kind == DeviceKind::cuda ? 256 : 8;
  check_keyword_options(options);
  ProgressRelay relay(std::move(progress), progress_interval_s);
  options.on_progress = relay.hook();
  options.cuda_stream = reinterpret_cast<void*>(py_options.cuda_stream);

  Catalogue copy = catalogue.catalogue;
  auto result = with_progress(relay, [&] {
    return run_interruptible([&](std::stop_token stop) {
      LoadOptions o = options;
      o.stop = stop;
      auto device = kind == DeviceKind::cuda ? make_cuda_device(device_ordinal)
                                             : make_host_device();
      auto transport = make_local_transport();
      return std::make_shared<LoadResult>(load(std::move(copy), *device, *transport, o));
    });
  });
  PyLoadResult out;
  out.result = std::move(result);
  return out;
}

// ---- a job on one or several ranks (run_job) --------------------------------------------

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
  if (!thread.mpi) thread.mpi = std::make_unique<MpiSession>();
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

/// One rank's part of a job (weightcast::run_job), from the Python keywords.
///
/// @p plan, when not None, is called on every rank once the catalogue is known (on the job
/// thread, with the GIL), as plan(catalogue, rank, world_size): it may raise (a
/// `weightcast.Error` ends every rank with its status and message), and returns None (each
/// rank receives what `placement` gives it, in the arena) or this rank's wants (in place).
PyLoadResult py_run_job(const std::string& checkpoint, const std::string& device_kind,
                        int device_ordinal, const PyOptions& py_options,
                        std::optional<std::string> placement,
                        std::optional<int> rendezvous_port, nb::object plan,
                        nb::object progress, double progress_interval_s, bool alone) {
  const Config config = effective_config(py_options, rendezvous_port);
  // Alone: a world of one rank, whatever the launcher's environment says.
  World world = alone ? World{} : detect_world(config);
  const DeviceKind kind = parse_device_kind(device_kind);
  // A CUDA device's ordinal is the world's local rank (job.hpp); the caller's device wins.
  if (kind == DeviceKind::cuda) world.local_rank = device_ordinal;
  JobOptions job = JobOptions::from_config(config, world);
  job.checkpoint = checkpoint;
  job.device = kind;
  job.load.tensor_alignment = kind == DeviceKind::cuda ? 256 : 8;
  check_keyword_options(job.load);
  // Every rank names the checkpoint it was given (never opened but on rank 0): two loads at
  // once, paired across ranks in the wrong order, then fail on every rank instead of
  // delivering one checkpoint's bytes into the other's destinations.
  job.identity = "checkpoint '" + checkpoint_as_given(checkpoint) + "'";
  const bool several = world.world_size > 1;
  std::optional<SeveralRanksLoad> one_at_a_time;
  if (several) one_at_a_time.emplace();
  ProgressRelay relay(std::move(progress), progress_interval_s);
  job.load.on_progress = relay.hook();
  job.load.cuda_stream = reinterpret_cast<void*>(py_options.cuda_stream);
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
  const bool mpi = several && kind == DeviceKind::host;
  auto started = std::make_shared<std::atomic<bool>>(false);
  job.on_load_start = [started] { started->store(true); };
  // A load stopped by Ctrl-C says so: the other ranks end with this rank's message.
  auto keyboard = std::make_shared<std::atomic<bool>>(false);
  job.on_load_end = [keyboard](std::exception_ptr failure) {
    if (!failure || !keyboard->load()) return;
    try {
      std::rethrow_exception(failure);
    } catch (const Error& e) {
      if (e.code() != Errc::interrupted) return;
    } catch (...) {
      return;
    }
    throw Error(Errc::interrupted, "interrupted by SIGINT (Ctrl-C) during the load");
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
        /*on_job_thread=*/true, keyboard.get());
  });
  PyLoadResult out;
  out.rank = result->world.rank;
  out.world_size = result->world.world_size;
  out.verdict = result->verdict.message;
  out.result = std::make_shared<LoadResult>(std::move(result->load));
  return out;
}

/// The tensors of @p r as (name, dtype, tensor) with one capsule owning the arena; the
/// result gives up its own reference, so the arena lives exactly as long as the tensors.
nb::list py_tensors(PyLoadResult& r) {
  LoadResult& result = checked(r);
  auto* owned = new OwnedArena(result.arena);
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<OwnedArena*>(p); });
  const bool cuda = result.arena->kind() == MemoryKind::cuda;
  int device_id = 0;
  if (cuda) {
    // "cuda:N"
    const std::string& name = result.stats.device;
    device_id = std::stoi(name.substr(name.find(':') + 1));
  }
  const int device_type = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  // Tensors of zero bytes still need a pointer DLPack accepts; any aligned address will do
  // (nothing is ever read through it), so use the arena's base or a static byte.
  alignas(256) static std::byte empty_tensor_storage[1];

  nb::list out;
  // A placed load (placement fsdp on several ranks) holds this rank's local shards only.
  const std::size_t count =
      result.placed ? result.wants.tensors.size() : result.catalogue.tensors.size();
  for (std::size_t i = 0; i < count; ++i) {
    const TensorView view = result.placed ? result.local(i) : result.tensor(i);
    const TensorInfo& info = *view.info;
    const Export e = export_of(info.dtype);
    const std::vector<std::uint64_t> local =
        view.want != nullptr ? local_shape(info, *view.want) : info.shape;
    const std::uint64_t bytes = view.want != nullptr ? local_bytes(info, *view.want) : info.bytes;
    std::vector<std::size_t> shape(local.begin(), local.end());
    // F4 with an odd last dimension (or a scalar) has no float4_e2m1fn_x2 shape: it goes as
    // raw bytes like F6; `weightcast.load` refuses it up front unless asked for bytes.
    const bool f4_pairs = e.packed_f4 && !shape.empty() && shape.back() % 2 == 0;
    if (e.raw || (e.packed_f4 && !f4_pairs)) {
      shape = {static_cast<std::size_t>(bytes)};
    } else if (e.packed_f4) {
      shape.back() /= 2;
    }
    // nanobind's DLPack export aborts the process (a "critical error") somewhere past 128
    // dimensions, while safetensors and torch take any count: a tensor of many dimensions goes
    // flat and the Python side views it in its shape (`weightcast._dtypes.as_torch`).
    if (shape.size() > kMaxExportDims) {
      shape = {static_cast<std::size_t>(bytes / (e.dtype.bits / 8))};
    }
    void* data = view.data != nullptr ? static_cast<void*>(view.data)
                 : cuda && result.arena->data() != nullptr
                     ? static_cast<void*>(result.arena->data())
                     : static_cast<void*>(empty_tensor_storage);
    // Contiguous strides as torch computes them: a zero-size dimension counts as 1, so a
    // [2, 0, 3] tensor has strides [3, 3, 1] like torch.empty(2, 0, 3).
    std::vector<std::int64_t> strides(shape.size());
    std::int64_t stride = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= std::max<std::int64_t>(static_cast<std::int64_t>(shape[d]), 1);
    }
    nb::ndarray<nb::pytorch> array(data, shape.size(), shape.data(), owner, strides.data(),
                                   e.dtype, device_type, device_id);
    out.append(nb::make_tuple(info.name, std::string(dtype_name(info.dtype)),
                              nb::cast(array, nb::rv_policy::reference),
                              nb::tuple(nb::cast(local))));
  }
  r.result->arena.reset();
  return out;
}

}  // namespace
}  // namespace weightcast::python

NB_MODULE(_weightcast, m) {
  using namespace weightcast;
  using namespace weightcast::python;
  m.doc() = "weightcast's C++ core (internal; use the `weightcast` package).";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      nb::object cls = nb::module_::import_("weightcast._errors").attr("Error");
      nb::object exc = cls(message_str(e.what()), exit_status(e.code()));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });

  nb::class_<PyCatalogue>(m, "Catalogue", "A checkpoint's tensors, as read from its headers.")
      .def_prop_ro("tensors",
                   [](const PyCatalogue& c) {
                     nb::list l;
                     for (const auto& t : c.catalogue.tensors) l.append(tensor_meta(t));
                     return l;
                   },
                   "Every tensor (dicts: name, dtype, shape, bytes, shard), file order.")
      .def_prop_ro("shards",
                   [](const PyCatalogue& c) {
                     nb::list l;
                     for (const auto& s : c.catalogue.shards) l.append(fs_str(s.path.string()));
                     return l;
                   },
                   "The shard files' resolved paths.")
      .def_prop_ro("metadata", [](const PyCatalogue& c) {
        nb::dict d;
        for (const auto& [k, v] : c.catalogue.metadata) d[nb::str(k.c_str(), k.size())] = v;
        return d;
      }, "`__metadata__` of every shard merged (first shard wins).")
      .def_prop_ro("total_bytes", [](const PyCatalogue& c) { return c.catalogue.total_bytes(); },
                   "Sum of all tensor sizes, bytes.");

  nb::class_<PyLoadResult>(m, "LoadResult", "A finished load: its stats, and the arena.")
      .def_prop_ro("stats", [](const PyLoadResult& r) { return stats_dict(checked(r).stats); })
      .def_prop_ro("rank", [](const PyLoadResult& r) { return r.rank; }, "This rank.")
      .def_prop_ro("world_size", [](const PyLoadResult& r) { return r.world_size; },
                   "The number of ranks of the load.")
      .def_prop_ro("verdict", [](const PyLoadResult& r) { return r.verdict; },
                   "Rank 0's verdict of a job, the same on every rank (\"\" for `load`).")
      .def("tensors", &py_tensors,
           "(name, dtype, tensor) per tensor; the arena then belongs to the tensors.");

  m.def(
      "open_checkpoint",
      [](const nb::bytes& path_bytes) {
        PyCatalogue c;
        const std::string path = fs_path(path_bytes);
        {
          nb::gil_scoped_release release;
          c.catalogue = open_checkpoint(path);
        }
        return c;
      },
      "path"_a, "Opens and validates a checkpoint's headers (weightcast::open_checkpoint).");

  m.def(
      "load",
      [](const PyCatalogue& catalogue, const std::string& device, int ordinal,
         std::optional<nb::bytes> config, std::optional<std::string> chunk_size,
         std::optional<std::uint32_t> buffer_depth, std::optional<std::uint32_t> io_depth,
         std::optional<std::string> direct_io, std::optional<std::string> timeout,
         std::optional<std::string> reader, std::optional<std::string> verify,
         nb::object progress, double progress_interval_s, std::uintptr_t cuda_stream) {
        PyOptions o{config ? std::optional<std::string>(fs_path(*config)) : std::nullopt,
                    std::move(chunk_size), buffer_depth, io_depth,
                    std::move(direct_io), std::move(timeout), std::move(reader),
                    std::move(verify), cuda_stream};
        return py_load(catalogue, device, ordinal, o, std::move(progress), progress_interval_s);
      },
      "catalogue"_a, "device"_a, "ordinal"_a, "config"_a.none(), "chunk_size"_a.none(),
      "buffer_depth"_a.none(), "io_depth"_a.none(), "direct_io"_a.none(), "timeout"_a.none(),
      "reader"_a.none(), "verify"_a.none(), "progress"_a.none(), "progress_interval_s"_a,
      "cuda_stream"_a = 0,
      "Loads a catalogue into a host or CUDA arena on this process (world size 1); the load "
      "writes after the work queued on cuda_stream (a cudaStream_t, 0: none) and that stream "
      "waits for the load's writes.");

  m.def(
      "run_job",
      [](const nb::bytes& checkpoint, const std::string& device, int ordinal,
         std::optional<nb::bytes> config, std::optional<std::string> chunk_size,
         std::optional<std::uint32_t> buffer_depth, std::optional<std::uint32_t> io_depth,
         std::optional<std::string> direct_io, std::optional<std::string> timeout,
         std::optional<std::string> reader, std::optional<std::string> verify,
         std::optional<std::string> placement, std::optional<int> rendezvous_port,
         nb::object plan, nb::object progress, double progress_interval_s, bool alone,
         std::uintptr_t cuda_stream) {
        PyOptions o{config ? std::optional<std::string>(fs_path(*config)) : std::nullopt,
                    std::move(chunk_size), buffer_depth, io_depth,
                    std::move(direct_io), std::move(timeout), std::move(reader),
                    std::move(verify), cuda_stream};
        return py_run_job(fs_path(checkpoint), device, ordinal, o, std::move(placement),
                          rendezvous_port, std::move(plan), std::move(progress),
                          progress_interval_s, alone);
      },
      "checkpoint"_a, "device"_a, "ordinal"_a, "config"_a.none(), "chunk_size"_a.none(),
      "buffer_depth"_a.none(), "io_depth"_a.none(), "direct_io"_a.none(), "timeout"_a.none(),
      "reader"_a.none(), "verify"_a.none(), "placement"_a.none(), "rendezvous_port"_a.none(),
      "plan"_a.none(),
      "progress"_a.none(), "progress_interval_s"_a, "alone"_a = false, "cuda_stream"_a = 0,
      "This rank's part of a load on every rank of the world (weightcast::run_job); rank 0 "
      "alone reads the checkpoint. cuda_stream: as for load.");
  m.def("after_fork_in_child", [] { JobThread::get().after_fork_in_child(); },
        "Forgets the parent's job thread and MPI session in a forked child (os.register_at_fork).");
  m.def("shutdown", [] {
        nb::gil_scoped_release release;
        JobThread::get().shutdown();
      },
      "Finalises MPI if weightcast initialised it and ends the job thread (atexit).");

  m.def(
      "detect_world",
      [](std::optional<nb::bytes> config) {
        const World w = detect_world(config ? load_config(fs_path(*config), {}) : Config{});
        nb::dict d;
        d["rank"] = w.rank;
        d["world_size"] = w.world_size;
        d["local_rank"] = w.local_rank;
        d["source"] = std::string(to_string(w.source));
        d["describe"] = w.describe();
        return d;
      },
      "config"_a.none(),
      "This process's world: the config's world.* keys, else torchrun, Slurm, Open MPI.");
  m.def(
      "config_device",
      [](const nb::bytes& config) {
        return std::string(to_string(load_config(fs_path(config), {}).device));
      },
      "config"_a, "The `device` key of a config file: auto, host or cuda.");
  m.def(
      "check_setting",
      [](const std::string& key, const std::string& value) {
        (void)load_config(std::string(), {key + "=" + value});
      },
      "key"_a, "value"_a,
      "Checks one config key's value as `--set key=value` would: the config's rule and "
      "message (Error, status 78, naming the key and value).");
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices this process can use; 0 without CUDA in the build or a driver.");
  m.def("live_arenas", [] { return live_arenas.load(); },
        "Arenas currently owned by tensors handed out (for lifetime tests).");
  m.def("build_info", [] {
    nb::dict d;
    d["version"] = WEIGHTCAST_VERSION;
#ifdef WEIGHTCAST_HAVE_CUDA
    d["cuda"] = true;
#else
    d["cuda"] = false;
#endif
#ifdef WEIGHTCAST_HAVE_MPI
    d["mpi"] = true;
#else
    d["mpi"] = false;
#endif
    return d;
  }, "What this build has: version, cuda, mpi.");
}
