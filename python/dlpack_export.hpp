// DLPack export: a load's tensors handed to Python as DLPack tensors that view its arena, one
// capsule owning the arena so that it lives exactly as long as the tensors.
#pragma once

#include "py_types.hpp"

#include <nanobind/nanobind.h>

#include <atomic>

namespace weightcast::python {

// Arenas owned by live capsules: tensors handed out keep one capsule alive (tests read this
// to check that the arena goes exactly when its last tensor does).
extern std::atomic<long> live_arenas;

/// The tensors of @p r as (name, dtype, tensor) with one capsule owning the arena; the
/// result gives up its own reference, so the arena lives exactly as long as the tensors.
nb::list py_tensors(PyLoadResult& r);

}  // namespace weightcast::python
