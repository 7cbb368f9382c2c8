// The load's results and options: checking LoadOptions, a LoadResult's views and digests, and
// the loads that open their own checkpoint (the pipeline itself: pipeline/detail/pipeline.hpp).
#include "weightcast/pipeline/loader.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/digest.hpp"

#include <fmt/core.h>

#include <bit>
#include <limits>
#include <utility>

namespace weightcast {

void check_destination(Destination destination, int world_size) {
  // Discarding keeps nothing, so there is nothing for other ranks to receive either.
  WEIGHTCAST_EXPECT(destination != Destination::discard || world_size == 1, Errc::config,
                    fmt::format("destination: discard: needs world size 1 (got {}); it checks "
                                "and times rank 0's reads only",
                                world_size));
}

void check_load_options(const LoadOptions& options) {
  // The config's own bounds and message (the settings registry), for an embedder that sets
  // LoadOptions directly: the value is shown as the config would spell it.
  auto in_range = [](std::string_view field, const Setting& setting, auto value) {
    if (setting.admits(value)) return;
    const std::string spelled =
        std::cmp_greater(value, std::numeric_limits<std::int64_t>::max())
            ? fmt::format("{}", value)
            : spell(setting, static_cast<std::int64_t>(value));
    throw Error(Errc::config, fmt::format("LoadOptions::{}: {}: {}", field, setting.name,
                                          out_of_range(setting, fmt::format("'{}'", spelled))));
  };
  in_range("chunk_bytes", setting::chunk_size, options.chunk_bytes);
  in_range("buffer_depth", setting::buffer_depth, std::uint64_t{options.buffer_depth});
  in_range("io_depth", setting::io_depth, std::uint64_t{options.io_depth});
  in_range("timeout", setting::timeout, std::int64_t{options.timeout.count()});
  WEIGHTCAST_EXPECT(options.tensor_alignment >= 1 &&
                        options.tensor_alignment <= setting::tensor_alignment_max,
                    Errc::config,
                    fmt::format("LoadOptions::tensor_alignment is {}: must be 1 to {}",
                                options.tensor_alignment, setting::tensor_alignment_max));
  WEIGHTCAST_EXPECT(std::has_single_bit(options.tensor_alignment), Errc::config,
                    fmt::format("LoadOptions::tensor_alignment is {}: must be a power of two",
                                options.tensor_alignment));
  WEIGHTCAST_EXPECT(options.cuda_stream.kind() != CallerStream::Kind::per_thread_default,
                    Errc::config,
                    "LoadOptions::cuda_stream is cudaStreamPerThread, the default stream of "
                    "whichever thread uses it, and the load orders itself from its own thread: "
                    "pass the handle of a created stream, or CUDA's default stream (0)");
}

TensorView LoadResult::tensor(std::size_t index) const {
  const TensorInfo& info = catalogue.tensors.at(index);
  // A discarded load has no arena: its views have no data.
  std::byte* data = info.bytes == 0 || arena->data() == nullptr
                        ? nullptr
                        : arena->data() + layout.tensor_offsets.at(index);
  return TensorView{&info, data, arena->kind()};
}

std::string_view to_string(Stage stage) noexcept {
  switch (stage) {
    case Stage::read: return "read";
    case Stage::upload: return "upload";
    case Stage::broadcast: return "broadcast";
  }
  return "read";
}

TensorView LoadResult::local(std::size_t index) const {
  const TensorWant& want = wants.tensors.at(index);
  // By index: a search by name for each want would make N wants cost O(N²).
  const TensorInfo& info = catalogue.tensors.at(want_tensors.at(index));
  const MemoryKind memory = want.destination.data != nullptr ? want.destination.memory
                                                             : arena->kind();
  return TensorView{&info, want_data.at(index), memory, &want};
}

std::vector<std::uint64_t> local_digests(const LoadResult& result) {
  std::vector<std::uint64_t> digests;
  digests.reserve(result.wants.tensors.size());
  for (std::size_t w = 0; w < result.wants.tensors.size(); ++w) {
    const TensorView view = result.local(w);
    const TensorWant& want = *view.want;
    const bool cast = want.destination.dtype && *want.destination.dtype != view.info->dtype;
    const std::uint64_t bytes = local_bytes(*view.info, want);
    const bool hashed = w < result.received_hashed.size() && result.received_hashed[w] != 0;
    if (hashed || cast) {
      digests.push_back(result.received_digests.at(w));
    } else if (want.destination.data != nullptr && view.memory != MemoryKind::host) {
      // Device memory outside the arena is hashed only as it lands, and only with expected
      // digests (`verify: digest`).
      throw Error(Errc::usage,
                  fmt::format("local_digests: tensor '{}' landed in device memory outside the "
                              "arena, which is hashed only as it lands, for a load with "
                              "LoadPlacement::expect_digests (verify: digest)",
                              want.tensor));
    } else if (want.destination.data != nullptr || bytes == 0) {
      digests.push_back(xxh3_64(view.data, bytes));
    } else {
      StreamingDigests one(1);
      result.arena->read_back(static_cast<std::uint64_t>(view.data - result.arena->data()),
                              bytes, [&](const std::byte* data, std::size_t n) {
                                one.update(0, data, n);
                              });
      one.finish(0);
      digests.push_back(one.digests()[0]);
    }
  }
  return digests;
}

std::optional<TensorView> LoadResult::find(std::string_view name) const {
  for (std::size_t w = 0; w < wants.tensors.size(); ++w) {
    if (wants.tensors[w].tensor == name) return local(w);
  }
  if (placed) return std::nullopt;
  for (std::size_t i = 0; i < catalogue.tensors.size(); ++i) {
    if (catalogue.tensors[i].name == name) return tensor(i);
  }
  return std::nullopt;
}

LoadResult load(const std::filesystem::path& checkpoint, const LoadOptions& options) {
  auto device = make_host_device();
  auto transport = make_local_transport();
  return load(open_checkpoint(checkpoint), *device, *transport, options);
}

std::future<LoadResult> load_async(std::filesystem::path checkpoint, LoadOptions options) {
  return std::async(std::launch::async,
                    [checkpoint = std::move(checkpoint), options = std::move(options)] {
                      return load(checkpoint, options);
                    });
}

}  // namespace weightcast
