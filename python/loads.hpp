// The loads the module runs: one on this process (`load`) and this rank's part of a job on
// every rank of a world (`run_job`), from the Python keywords.
#pragma once

#include "options.hpp"
#include "py_types.hpp"

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>

namespace weightcast::python {

/// Loads @p catalogue into a host or CUDA arena on this process (world size 1), on a thread
/// of its own while this one runs Python's signal handlers (job_thread.hpp). @p progress, when
/// not None, is called as progress(bytes_done, bytes_total, chunks_done, chunks_total,
/// seconds, shard) at most every @p progress_interval_s seconds and after the last chunk.
/// @p config: the call's (`PySettings`); @p cuda_stream the caller's (torch's current
/// stream's `cudaStream_t`; 0 is CUDA's default stream), nullopt for none:
/// LoadOptions::cuda_stream. @p cancel, when not null, stops the load once set (the load then
/// raises `interrupted`, 130); Python owns it for the call.
PyLoadResult py_load(const PyCatalogue& catalogue, const std::string& device_kind,
                     int device_ordinal, const Config& config, std::optional<std::uintptr_t> cuda_stream,
                     nb::object progress, double progress_interval_s,
                     const PyCancel* cancel = nullptr);

/// One rank's part of a job (weightcast::run_job), from the Python keywords.
///
/// @p plan, when not None, is called on every rank once the catalogue is known (on the job
/// thread, with the GIL), as plan(catalogue, rank, world_size): it may raise (a
/// `weightcast.Error` ends every rank with its status and message), and returns None (each
/// rank receives what `placement` gives it, in the arena) or this rank's wants (in place).
/// @p pieces: rank 0 opens a directory of tensor pieces as `CheckpointPieces::separate`.
/// @p cancel: as for py_load; on several ranks every rank ends with this rank's message.
PyLoadResult py_run_job(const std::string& checkpoint, const std::string& device_kind,
                        int device_ordinal, const Config& settings, std::optional<std::uintptr_t> cuda_stream,
                        std::optional<std::string> placement,
                        std::optional<int> rendezvous_port, nb::object plan,
                        nb::object progress, double progress_interval_s, bool alone,
                        bool pieces = false, const PyCancel* cancel = nullptr);

}  // namespace weightcast::python
