// weightcast._weightcast: the C++ side of the Python package, its bindings. It binds the
// library's own entry points (open_checkpoint, load for one process, run_job for every rank
// of a world, with the caller's in-place destinations as its wants) and hands the arena out
// as DLPack tensors; the torch-facing API (dtype views, load_into's keys and wants, progress)
// is Python, in weightcast/*.py. The module's other files: py_types.hpp (the values Python
// holds), options.cpp (keywords as the library's options), job_thread.hpp (the thread jobs
// and MPI run on, and Ctrl-C during a load), loads.cpp (the loads), dlpack_export.cpp (the
// arena as DLPack tensors).
//
// Only the standard library, nanobind and the public headers (which include nothing else):
// the module can be built on a host that has none of the library's dependencies, given
// libweightcast.a built elsewhere.

#include "dlpack_export.hpp"
#include "job_thread.hpp"
#include "loads.hpp"
#include "options.hpp"
#include "py_types.hpp"

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/config/launch_options.hpp"
#include "weightcast/control/world.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/device/device.hpp"
#include "weightcast/device/gpu_info.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>

namespace nb = nanobind;
using namespace nb::literals;

namespace weightcast::python {
namespace {

const char* type_name(SettingType type) noexcept {
  switch (type) {
    case SettingType::size: return "size";
    case SettingType::count: return "count";
    case SettingType::auto_count: return "auto_count";
    case SettingType::duration: return "duration";
    case SettingType::choice: return "choice";
    case SettingType::text: return "text";
    case SettingType::address: return "address";
    case SettingType::rules: return "rules";
  }
  return "";
}

// One registry entry for Python's checks, messages and docs (tests/python/test_surfaces.py).
nb::dict setting_dict(const Setting& s) {
  nb::dict d;
  d["name"] = std::string(s.name);
  d["type"] = type_name(s.type);
  d["default"] = default_text(s);
  const bool bounded = s.type == SettingType::size || s.type == SettingType::count ||
                       s.type == SettingType::auto_count || s.type == SettingType::duration ||
                       (s.type == SettingType::text && s.max > 0);
  d["min"] = bounded ? nb::cast(s.min) : nb::none();
  d["max"] = bounded ? nb::cast(s.max) : nb::none();
  d["min_text"] = bounded ? nb::cast(bound_text(s, s.min)) : nb::none();
  d["max_text"] = bounded ? nb::cast(bound_text(s, s.max)) : nb::none();
  nb::list spellings;
  nb::list printed;
  for (const Spelling& sp : s.spellings) {
    spellings.append(std::string(sp.name));
    if (choice_name(s, sp.value) == sp.name) printed.append(std::string(sp.name));
  }
  d["spellings"] = spellings;
  d["printed"] = printed;  // one per value: what messages list
  d["what"] = std::string(s.what);
  d["doc"] = std::string(s.doc);
  return d;
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
  d["node_reads"] = s.node_reads;
  d["gbps"] = s.gbps();
  return d;
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
      .def_prop_ro("pieces", [](const PyCatalogue& c) {
        nb::list l;
        for (const auto& p : c.catalogue.pieces) {
          nb::dict d;
          d["tensor"] = nb::str(p.tensor.c_str(), p.tensor.size());
          d["offset"] = nb::tuple(nb::cast(p.offset));
          d["global_shape"] = nb::tuple(nb::cast(p.global));
          l.append(d);
        }
        return l;
      }, "Per tensor entry, where it lies in its tensor (opened with pieces=True from a "
         "directory of pieces): {tensor, offset, global_shape}; else empty.")
      .def_prop_ro("total_bytes", [](const PyCatalogue& c) { return c.catalogue.total_bytes(); },
                   "Sum of all tensor sizes, bytes.");

  nb::class_<PyCancel>(m, "Cancel",
                      "A request to stop a load (LoadHandle.cancel()): set from any thread, "
                      "read by the load every 50 ms.")
      .def(nb::init<>())
      .def("cancel", [](PyCancel& c) { c.requested.store(true); },
           "Requests the stop; the load then raises Error 130 within moments.")
      .def_prop_ro("requested", [](const PyCancel& c) { return c.requested.load(); },
                   "Whether cancel() was called.");

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
      [](const nb::bytes& path_bytes, bool pieces) {
        PyCatalogue c;
        const std::string path = fs_path(path_bytes);
        {
          nb::gil_scoped_release release;
          c.catalogue = open_checkpoint(path, pieces ? CheckpointPieces::separate
                                                     : CheckpointPieces::refuse);
        }
        return c;
      },
      "path"_a, "pieces"_a = false,
      "Opens and validates a checkpoint's headers (weightcast::open_checkpoint); pieces: a "
      "directory of tensor pieces opens as CheckpointPieces::separate.");

  nb::class_<PySettings>(m, "Settings",
                         "A call's configuration, read once: a config file's keys, then the "
                         "keywords over them (each the override of its config key).");
  m.def(
      "settings",
      [](std::optional<nb::bytes> config, const nb::dict& overrides, const nb::dict& group) {
        PyOptions o{config ? std::optional<std::string>(fs_path(*config)) : std::nullopt, {},
                    {}};
        for (const auto& [key, value] : overrides) {
          o.overrides.emplace_back(nb::cast<std::string>(key), nb::cast<std::string>(value));
        }
        for (const auto& [key, value] : group) {
          o.group_overrides.emplace_back(nb::cast<std::string>(key),
                                         nb::cast<std::string>(value));
        }
        return PySettings{effective_config(o)};
      },
      "config"_a.none(), "overrides"_a, "group"_a = nb::dict(),
      "Reads the config file (if any) once, then each override (config key -> the text of its "
      "value, in the dict's order) over it: the config's rules and messages (Error, status "
      "78, 'keyword key=value: ' and the reason); then group's (keys a torch process group "
      "gives), recorded as set by \"torch.distributed's process group\".");

  m.def(
      "explicit_keys",
      [](const PySettings& settings) {
        nb::dict d;
        for (const auto& [key, where] : settings.config.set_at) d[key.c_str()] = where;
        return d;
      },
      "settings"_a,
      "The config keys the settings set (from the file or an override), each with where: "
      "'x.yaml:7' or the override's origin; a key left at its default is absent.");

  m.def(
      "load",
      [](const PyCatalogue& catalogue, const std::string& device, int ordinal,
         const PySettings& settings, nb::object progress, double progress_interval_s,
         std::optional<std::uintptr_t> cuda_stream, const PyCancel* cancel) {
        return py_load(catalogue, device, ordinal, settings.config, cuda_stream,
                       std::move(progress), progress_interval_s, cancel);
      },
      "catalogue"_a, "device"_a, "ordinal"_a, "settings"_a, "progress"_a.none(),
      "progress_interval_s"_a, "cuda_stream"_a.none() = nb::none(),
      "cancel"_a.none() = nb::none(),
      "Loads a catalogue into a host or CUDA arena on this process (world size 1); the load "
      "writes after the work queued on cuda_stream (a cudaStream_t as an int: 0 is CUDA's "
      "default stream, ordered like any other; None: no stream) and that stream waits for the "
      "load's writes. cudaStreamPerThread (2) is refused (78). cancel: a Cancel that stops the "
      "load (130) once set.");

  m.def(
      "run_job",
      [](const nb::bytes& checkpoint, const std::string& device, int ordinal,
         const PySettings& settings, std::optional<std::string> placement,
         std::optional<int> rendezvous_port, nb::object plan, nb::object progress,
         double progress_interval_s, bool alone, std::optional<std::uintptr_t> cuda_stream,
         bool pieces, const PyCancel* cancel) {
        return py_run_job(fs_path(checkpoint), device, ordinal, settings.config, cuda_stream,
                          std::move(placement), rendezvous_port, std::move(plan),
                          std::move(progress), progress_interval_s, alone, pieces, cancel);
      },
      "checkpoint"_a, "device"_a, "ordinal"_a, "settings"_a, "placement"_a.none(),
      "rendezvous_port"_a.none(), "plan"_a.none(), "progress"_a.none(), "progress_interval_s"_a,
      "alone"_a = false, "cuda_stream"_a.none() = nb::none(), "pieces"_a = false,
      "cancel"_a.none() = nb::none(),
      "This rank's part of a load on every rank of the world (weightcast::run_job); rank 0 "
      "alone reads the checkpoint. cuda_stream: as for load. pieces: a directory of tensor "
      "pieces opens as CheckpointPieces::separate (the DCP reader's). cancel: as for load; "
      "every rank ends with this rank's message.");
  m.def("after_fork_in_child", [] { JobThread::get().after_fork_in_child(); },
        "Forgets the parent's job thread and MPI session in a forked child (os.register_at_fork).");
  m.def("shutdown", [] {
        nb::gil_scoped_release release;
        JobThread::get().shutdown();
      },
      "Finalises MPI if weightcast initialised it and ends the job thread (atexit).");

  const auto world_dict = [](const Config& config) {
    const World w = detect_world(config);
    nb::dict d;
    d["rank"] = w.rank;
    d["world_size"] = w.world_size;
    d["local_rank"] = w.local_rank;
    d["source"] = std::string(to_string(w.source));
    d["describe"] = w.describe();
    return d;
  };
  m.def(
      "detect_world",
      [world_dict](const PySettings& settings) { return world_dict(settings.config); },
      "settings"_a,
      "This process's world: the settings' world.* keys, else torchrun, Slurm, Open MPI.");
  m.def(
      "detect_world",
      [world_dict](std::optional<nb::bytes> config) {
        return world_dict(config ? load_config(fs_path(*config), {}) : Config{});
      },
      "config"_a.none(),
      "This process's world: the config's world.* keys, else torchrun, Slurm, Open MPI.");
  m.def(
      "config_device",
      [](const PySettings& settings) { return std::string(to_string(settings.config.device)); },
      "settings"_a, "The `device` key of the settings' config: auto, host or cuda.");
  m.def(
      "check_setting",
      [](const std::string& key, const std::string& value) {
        (void)load_config(std::string(), {key + "=" + value}, "keyword");
      },
      "key"_a, "value"_a,
      "Checks one config key's value as a keyword override: the config's rule and message "
      "(Error, status 78, 'keyword key=value: ' and the reason).");
  m.def(
      "setting_table",
      [] {
        nb::list table;
        for (const Setting& s : settings()) table.append(setting_dict(s));
        return table;
      },
      "Every config key of the settings registry (core/settings.hpp), as dicts: name, type, "
      "default (as the config spells it), min, max (as the config spells them; None where "
      "unbounded), spellings (a choice's, printed ones first), what, doc.");
  m.def(
      "device_kind",
      [](const std::string& text) -> std::optional<std::string> {
        const auto kind = device_kind(text);
        if (!kind) return std::nullopt;
        return std::string(to_string(*kind));
      },
      "text"_a,
      "The device kind ('host' or 'cuda') a device name means, exactly as spelt: the config's "
      "spellings and torch's 'cpu'; None for any other ('auto' too).");
  m.def("cuda_device_count", &cuda_device_count,
        "CUDA devices this process can use; 0 without CUDA in the build or a driver.");
  m.def("set_cuda_library_dirs", &set_cuda_library_dirs, "dirs"_a,
        "Folders to look in for the CUDA runtime and NCCL before the system's (torch's "
        "nvidia-* wheels); only before the first CUDA use. Does nothing without CUDA.");
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
