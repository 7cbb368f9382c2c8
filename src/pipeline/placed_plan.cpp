// A placed load's plan: its placement checked against the catalogue, the device and the
// transport, then the plan, the arena and where each of this rank's wants lands.
#include "weightcast/pipeline/detail/placed_plan.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <string_view>
#include <unordered_map>

namespace weightcast::detail {

Plan plan_placed_load(LoadResult& result, Device& device, Transport& transport,
                      const LoadOptions& options) {
  const LoadPlacement& placement = *options.placement;
  const int rank = transport.rank();
  WEIGHTCAST_EXPECT(options.destination != Destination::discard, Errc::config,
                    "destination: discard keeps nothing; it cannot be combined with a placement");
  WEIGHTCAST_EXPECT(placement.all.size() == static_cast<std::size_t>(transport.world_size()) &&
                        placement.all[rank].tensors.size() == placement.mine.tensors.size(),
                    Errc::internal,
                    fmt::format("LoadPlacement: wants of {} ranks for a world of {}, this rank's "
                                "{} against {}",
                                placement.all.size(), transport.world_size(),
                                placement.mine.tensors.size(),
                                placement.all.size() > static_cast<std::size_t>(rank)
                                    ? placement.all[rank].tensors.size()
                                    : 0));
  std::vector<RankWants> checked = placement.all;
  checked[rank] = placement.mine;
  validate_wants(result.catalogue, checked);
  for (const TensorWant& want : placement.mine.tensors) {
    const TensorDestination& d = want.destination;
    WEIGHTCAST_EXPECT(!d.in_place || d.data != nullptr, Errc::config,
                      fmt::format("placement: rank {}: tensor '{}': destination.data: null for "
                                  "an in-place destination",
                                  rank, want.tensor));
    const MemoryKind device_memory =
        device.name() == "host" ? MemoryKind::host : MemoryKind::cuda;
    WEIGHTCAST_EXPECT(d.data == nullptr || d.memory == device_memory, Errc::config,
                      fmt::format("placement: rank {}: tensor '{}': destination.memory: {} "
                                  "memory, but the load's device is {}",
                                  rank, want.tensor,
                                  d.memory == MemoryKind::host ? "host" : "device",
                                  device.name()));
    WEIGHTCAST_EXPECT(d.data == nullptr || d.memory == MemoryKind::host ||
                          transport.world_size() == 1 || transport.name() == "nccl",
                      Errc::config,
                      fmt::format("placement: rank {}: tensor '{}': destination.memory: device "
                                  "memory, which transport {} cannot receive into",
                                  rank, want.tensor, transport.name()));
  }
  if (device.name() != "host") {
    // A cast runs on the host (cast_into); an arena want's destination is the device's.
    std::unordered_map<std::string_view, Dtype> dtypes;
    for (const TensorInfo& t : result.catalogue.tensors) dtypes.emplace(t.name, t.dtype);
    for (const TensorWant& want : placement.mine.tensors) {
      const auto& cast = want.destination.dtype;
      WEIGHTCAST_EXPECT(!cast || *cast == dtypes.at(want.tensor), Errc::config,
                        fmt::format("placement: rank {}: tensor '{}': destination.dtype: a cast "
                                    "from {} to {} happens in host memory; the load's device "
                                    "is {}",
                                    rank, want.tensor, dtype_name(dtypes.at(want.tensor)),
                                    dtype_name(*cast), device.name()));
    }
  }
  Plan plan = make_placed_plan(result.catalogue, placement.all, options.chunk_bytes,
                               rank == 0 ? -1 : rank);
  const WantLayout layout =
      layout_wants(result.catalogue, placement.mine, options.tensor_alignment);
  result.arena = device.allocate_arena(layout.arena_bytes);
  result.placed = true;
  result.wants = placement.mine;
  std::unordered_map<std::string_view, std::uint32_t> index_of;
  index_of.reserve(result.catalogue.tensors.size());
  for (std::uint32_t t = 0; t < result.catalogue.tensors.size(); ++t) {
    index_of.emplace(result.catalogue.tensors[t].name, t);
  }
  result.want_tensors.reserve(result.wants.tensors.size());
  for (const TensorWant& want : result.wants.tensors) {
    result.want_tensors.push_back(index_of.at(want.tensor));  // validate_wants found each
  }
  for (std::size_t w = 0; w < layout.offsets.size(); ++w) {
    const TensorDestination& d = placement.mine.tensors[w].destination;
    if (layout.offsets[w] == no_arena_offset) {
      result.want_data.push_back(d.data);
    } else {
      result.want_data.push_back(result.arena->data() == nullptr
                                     ? nullptr
                                     : result.arena->data() + layout.offsets[w]);
    }
  }
  return plan;
}

}  // namespace weightcast::detail
