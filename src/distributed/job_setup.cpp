// What a job settles before its load: its world, its transport (`resolve_transport`), and the
// settings every rank must share.
#include "weightcast/distributed/detail/job_setup.hpp"

#include "weightcast/config/launch_options.hpp"
#include "weightcast/control/world.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/core/units.hpp"
#include "weightcast/transport/transport.hpp"
#include "weightcast/transport/transport_mpi.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <string_view>
#include <vector>

namespace weightcast {

namespace detail {

World resolve_world(const JobOptions& options) {
  World world = options.world ? *options.world : detect_world(WorldRequest{});
  if (!options.mpi_communicator && !options.nccl_communicator) return world;
  // The communicator is the data plane: its rank and size are the job's (a communicator
  // split from the launcher's world has its own).
  const bool mpi = options.mpi_communicator.has_value();
  const auto [rank, size] = mpi ? mpi_rank_and_size(*options.mpi_communicator)
                                : nccl_rank_and_size(*options.nccl_communicator);
  if (world.rank == rank && world.world_size == size) return world;
  if (options.world) {
    throw Error(Errc::config,
                fmt::format("transport {0}: the communicator handed in (JobOptions::"
                            "{0}_communicator) has this process as rank {1} of {2}, but "
                            "JobOptions::world says rank {3} of {4}; leave world unset to take "
                            "the communicator's",
                            mpi ? "mpi" : "nccl", rank, size, world.rank, world.world_size));
  }
  world.rank = rank;
  world.world_size = size;
  world.source = WorldSource::communicator;
  return world;
}

// One `key: value` per line: the plan (chunk_size; tensor_alignment, which decides where
// tensors sit in the arena and so which arena ranges a chunk's broadcast covers), the data
// plane (device kind, transport) and the verdict (verify). Ranks can be started with
// different configs (MPMD, a config per node) or entry points (the Python package and a C++
// embedder align differently); a plan that differs between ranks makes the broadcasts
// disagree on their sizes, which MPI does not detect (wrong bytes, or a hang).
std::string shared_settings(std::uint64_t chunk_bytes, std::uint64_t tensor_alignment,
                            bool host_device, TransportKind transport, Verify verify) {
  return fmt::format(
      "chunk_size: {}\ntensor_alignment: {} B\ndevice: {}\ntransport: {}\nverify: {}\n",
      format_bytes(chunk_bytes) + fmt::format(" ({} B)", chunk_bytes), tensor_alignment,
      host_device ? "host" : "cuda", to_string(transport), to_string(verify));
}

std::uint64_t planned_tensor_alignment(std::uint64_t asked, bool host_device) {
  return host_device ? asked : std::max(asked, setting::tensor_alignment_cuda);
}

// Ranks other than 0: this rank's shared settings against rank 0's.
// @throws Error `config` (78) naming the first setting that differs and both values.
void check_shared_settings(const std::string& mine, const std::string& root) {
  auto lines = [](std::string_view text) {
    std::vector<std::string_view> out;
    while (!text.empty()) {
      const auto end = text.find('\n');
      out.push_back(text.substr(0, end));
      text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    }
    return out;
  };
  const auto a = lines(mine);
  const auto b = lines(root);
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string_view m = i < a.size() ? a[i] : "";
    const std::string_view r = i < b.size() ? b[i] : "";
    if (m == r) continue;
    const auto colon = m.find(':');
    const std::string_view key = m.substr(0, colon);
    throw Error(Errc::config,
                fmt::format("{} differs between ranks: this rank has{}, rank 0 has{}; every rank "
                            "must use the same (set it alike in every rank's config)",
                            key, m.substr(colon + 1),
                            r.substr(std::min(r.size(), r.find(':') + 1))));
  }
}

}  // namespace detail

// A world that mpirun (or a PMIx launcher) started, or MPI that the caller has
// initialised, is an MPI world; a torchrun or local-spawner world is not, and MPI_Init_thread
// there would make a singleton world of one rank (MPI 4.0 §11.2).
bool mpi_world_present() noexcept {
  return mpi_compiled_in() && (mpi_initialized() || started_by_mpi_launcher());
}

TransportKind resolve_transport(TransportKind asked, bool host_device, int world_size,
                                bool mpi_world) {
  if (world_size <= 1) {
    switch (asked) {
      case TransportKind::mpi:
      case TransportKind::nccl:
      case TransportKind::tcp:
      case TransportKind::shm:
        throw Error(Errc::config,
                    fmt::format("transport: {}: this is a world of one rank, so there is no "
                                "other rank to broadcast to; use transport: local or auto, or "
                                "start several ranks (weightcast launch -n N, mpirun, torchrun)",
                                to_string(asked)));
      case TransportKind::automatic:
      case TransportKind::local:
        return TransportKind::local;
    }
    return TransportKind::local;
  }
  switch (asked) {
    case TransportKind::local:
      throw Error(Errc::config,
                  fmt::format("transport: local moves no bytes between processes; a world of {} "
                              "ranks needs transport tcp or mpi (device host) or nccl (device "
                              "cuda)",
                              world_size));
    case TransportKind::mpi:
      WEIGHTCAST_EXPECT(host_device, Errc::config,
                        "transport: mpi broadcasts host memory, but the device is cuda (set "
                        "device: host, or transport: nccl)");
      return TransportKind::mpi;
    case TransportKind::tcp:
      WEIGHTCAST_EXPECT(host_device, Errc::config,
                        "transport: tcp sends host memory, but the device is cuda (set "
                        "device: host, or transport: nccl)");
      return TransportKind::tcp;
    case TransportKind::nccl:
      WEIGHTCAST_EXPECT(!host_device, Errc::config,
                        "transport: nccl broadcasts GPU memory, but the device is host (set "
                        "device: cuda or auto on a GPU machine, or transport: tcp or mpi)");
      return TransportKind::nccl;
    case TransportKind::shm:
      // Host or cuda: on a GPU each rank copies its boxes out of the shared ring with its
      // own cudaMemcpyAsync (the ring page-locked in every process).
      return TransportKind::shm;
    case TransportKind::automatic:
      // MPI only where it has a world to join: a torchrun or local-spawner world has none,
      // and the tcp transport needs nothing but the rendezvous's address.
      if (!host_device) return TransportKind::nccl;
      return mpi_world ? TransportKind::mpi : TransportKind::tcp;
  }
  return TransportKind::tcp;
}

}  // namespace weightcast
