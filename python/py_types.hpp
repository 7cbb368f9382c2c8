// The extension's value types and path helpers, shared by its files: the catalogue and the
// load's result as Python holds them, and how paths and messages cross into Python.
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <nanobind/nanobind.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>

namespace weightcast::python {

namespace nb = nanobind;

// Paths cross as bytes (os.fsencode / os.fsdecode): a POSIX file name is any bytes, and a
// name that is not UTF-8 (str with surrogate escapes in Python) would not pass as a str.
inline std::string fs_path(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }

inline nb::str fs_str(const std::string& s) {
  return nb::steal<nb::str>(PyUnicode_DecodeFSDefaultAndSize(s.data(),
                                                             static_cast<Py_ssize_t>(s.size())));
}

// A message quotes paths, which need not be UTF-8; escape such bytes rather than fail.
inline nb::str message_str(const char* what) {
  return nb::steal<nb::str>(PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)),
                                                 "backslashreplace"));
}

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

/// A request to stop a load started by `load_async` or `load_into_async`
/// (LoadHandle.cancel()): set from any thread, read by run_interruptible every 50 ms. Python
/// owns it (the handle holds it), so it outlives the call that reads it.
struct PyCancel {
  std::atomic<bool> requested{false};
};

inline LoadResult& checked(const PyLoadResult& r) {
  if (!r.result) throw Error(Errc::internal, "weightcast: this LoadResult was already consumed");
  return *r.result;
}

}  // namespace weightcast::python
