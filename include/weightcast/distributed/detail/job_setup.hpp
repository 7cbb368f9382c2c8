/**
 * @file distributed/detail/job_setup.hpp
 * @brief What a job settles before its load: its world (the launcher's, or the communicator's
 *        handed in) and the settings every rank must share.
 */
#pragma once

#include "weightcast/control/world.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/distributed/job.hpp"

#include <cstdint>
#include <string>

namespace weightcast::detail {

/// @return `JobOptions::world`, else the launcher's (`detect_world`), with the rank and world
///         size of the communicator handed in (`mpi_communicator`, `nccl_communicator`) where
///         they differ (`WorldSource::communicator`).
/// @throws Error `config` (78) when `JobOptions::world` is set and the communicator disagrees;
///         as `detect_world` does.
World resolve_world(const JobOptions& options);

/// @return one `key: value` per line of what every rank must share: `chunk_size`, the
///         arena's `tensor_alignment` as the plan uses it (@p tensor_alignment: bytes, after
///         the cuda device's floor of 256), the device's kind, the transport and `verify`.
std::string shared_settings(std::uint64_t chunk_bytes, std::uint64_t tensor_alignment,
                            bool host_device, TransportKind transport, Verify verify);

/// @return the arena alignment a load on @p host_device plans with, bytes: @p asked
///         (`LoadOptions::tensor_alignment`), at least 256 on a cuda device (cudaMalloc's own
///         alignment, so every tensor view suits vectorised kernels).
std::uint64_t planned_tensor_alignment(std::uint64_t asked, bool host_device);

/// Ranks other than 0: this rank's shared settings (@p mine) against rank 0's (@p root).
/// @throws Error `config` (78) naming the first setting that differs and both values.
void check_shared_settings(const std::string& mine, const std::string& root);

}  // namespace weightcast::detail
