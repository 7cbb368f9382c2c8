#include "weightcast/plan/plan.hpp"

#include "weightcast/core/units.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

namespace weightcast {

namespace {

constexpr std::uint64_t max_u64 = std::numeric_limits<std::uint64_t>::max();

// max_plan_chunks' documented cost (plan.hpp, README): 88 bytes of plan per chunk.
static_assert(sizeof(Chunk) + sizeof(Piece) <= 88);
static_assert(max_plan_tensors + max_plan_chunks <= 0xFFFF'FFFFull);

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
  return b > max_u64 - a ? max_u64 : a + b;
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return a / b + (a % b != 0); }

// Calls visit(new_run, bytes) for every tensor with bytes, in plan order. A run is a stretch
// of contiguous bytes of one shard: make_plan starts a new chunk exactly where a run starts or
// the open chunk is full, so a run of r bytes makes ceil(r / chunk_size) chunks. In a valid
// catalogue each shard's data is one run.
template <typename Visit>
void for_each_run_tensor(const Catalogue& catalogue, Visit&& visit) {
  bool first = true;
  std::uint32_t shard = 0;
  std::uint64_t end = 0;  // file offset just past the previous tensor with bytes
  for (const TensorInfo& tensor : catalogue.tensors) {
    if (tensor.bytes == 0) continue;
    WEIGHTCAST_EXPECT(tensor.bytes <= max_u64 - tensor.file_offset, Errc::internal,
                      fmt::format("tensor '{}': {} bytes at offset {} end past 2^64", tensor.name,
                                  tensor.bytes, tensor.file_offset));
    visit(first || tensor.shard != shard || tensor.file_offset != end, tensor.bytes);
    first = false;
    shard = tensor.shard;
    end = tensor.file_offset + tensor.bytes;
  }
}

// A chunk size outside the setting's bounds, in the config's words for the same value.
// `plan_size` is also asked about larger sizes (`min_chunk_bytes` searches up to 2^64 - 1),
// so it checks the least only (@p whole_range false).
void refuse_bad_chunk_size(std::uint64_t chunk_bytes, bool whole_range) {
  const auto least = static_cast<std::uint64_t>(setting::chunk_size.min);
  const bool fits = whole_range ? setting::chunk_size.admits(chunk_bytes) : chunk_bytes >= least;
  WEIGHTCAST_EXPECT(fits, Errc::config,
                    fmt::format("chunk_size: {}",
                                out_of_range(setting::chunk_size,
                                             fmt::format("'{}'", print_size(chunk_bytes)))));
}

[[noreturn]] void refuse_chunk_count(const Catalogue& catalogue, std::uint64_t chunk_bytes,
                                     std::uint64_t chunks) {
  const std::uint64_t total = catalogue.total_bytes();
  std::string message = fmt::format(
      "chunk_size {} ({}) would split the checkpoint's {} bytes ({}) of tensor data into {} "
      "chunks, over the limit of {} chunks per plan (every rank holds the plan in memory); ",
      chunk_bytes, format_bytes(chunk_bytes), total, format_bytes(total), chunks,
      max_plan_chunks);
  if (const std::uint64_t fits = min_chunk_bytes(catalogue); fits != 0) {
    message += fmt::format("set chunk_size to at least {} ({})", fits, format_bytes(fits));
  } else {
    message += fmt::format("no chunk_size fits: the tensor data lies in {} shards, each needing "
                           "a chunk of its own",
                           plan_size(catalogue, max_u64).chunks);
  }
  throw Error(Errc::config, message);
}

}  // namespace

ArenaLayout layout_arena(const Catalogue& catalogue, std::uint64_t alignment) {
  WEIGHTCAST_EXPECT(alignment != 0 && (alignment & (alignment - 1)) == 0, Errc::internal,
                    fmt::format("arena alignment {} is not a power of two", alignment));
  ArenaLayout layout;
  layout.alignment = alignment;
  layout.tensor_offsets.reserve(catalogue.tensors.size());
  std::uint64_t offset = 0;
  for (const auto& tensor : catalogue.tensors) {
    std::uint64_t aligned = (offset + alignment - 1) & ~(alignment - 1);
    WEIGHTCAST_EXPECT(aligned >= offset && aligned + tensor.bytes >= aligned, Errc::internal,
                      fmt::format("arena size overflows 64 bits at tensor '{}'", tensor.name));
    layout.tensor_offsets.push_back(aligned);
    offset = aligned + tensor.bytes;
  }
  layout.arena_bytes = offset;
  return layout;
}

PlanSize plan_size(const Catalogue& catalogue, std::uint64_t chunk_bytes) {
  refuse_bad_chunk_size(chunk_bytes, false);
  PlanSize size;
  std::uint64_t run_bytes = 0;  // bytes of the current run before this tensor
  for_each_run_tensor(catalogue, [&](bool new_run, std::uint64_t bytes) {
    if (new_run) {
      size.chunks = saturating_add(size.chunks, ceil_div(run_bytes, chunk_bytes));
      run_bytes = 0;
    }
    // The tensor covers [run_bytes, run_bytes + bytes) of its run (no overflow: that is its
    // file range less the run's first offset), one piece per chunk it touches.
    const std::uint64_t end = run_bytes + bytes;
    size.pieces = saturating_add(size.pieces, (end - 1) / chunk_bytes - run_bytes / chunk_bytes + 1);
    run_bytes = end;
  });
  size.chunks = saturating_add(size.chunks, ceil_div(run_bytes, chunk_bytes));
  return size;
}

std::uint64_t min_chunk_bytes(const Catalogue& catalogue, std::uint64_t max_chunks) {
  WEIGHTCAST_EXPECT(max_chunks >= 1, Errc::internal, "min_chunk_bytes: a limit of 0 chunks");
  std::vector<std::uint64_t> runs;  // bytes per run: one per shard in a valid catalogue
  for_each_run_tensor(catalogue, [&](bool new_run, std::uint64_t bytes) {
    if (new_run) runs.push_back(0);
    runs.back() += bytes;
  });
  if (runs.empty()) return 1;
  if (runs.size() > max_chunks) return 0;
  const auto chunks = [&](std::uint64_t chunk_bytes) {
    std::uint64_t n = 0;
    for (std::uint64_t r : runs) n = saturating_add(n, ceil_div(r, chunk_bytes));
    return n;
  };
  // The count falls as chunk_size grows and is runs.size() at the largest run: bisect.
  std::uint64_t low = 1;
  std::uint64_t high = *std::max_element(runs.begin(), runs.end());
  while (low < high) {
    const std::uint64_t mid = low + (high - low) / 2;
    if (chunks(mid) <= max_chunks) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return low;
}

Plan make_plan(const Catalogue& catalogue, const ArenaLayout& layout,
               std::uint64_t chunk_bytes) {
  refuse_bad_chunk_size(chunk_bytes, true);
  WEIGHTCAST_EXPECT(layout.tensor_offsets.size() == catalogue.tensors.size(), Errc::internal,
                    "arena layout does not match the catalogue");
  WEIGHTCAST_EXPECT(catalogue.tensors.size() <= max_plan_tensors, Errc::invalid_checkpoint,
                    fmt::format("the checkpoint has {} tensors, more than the {} weightcast can "
                                "plan",
                                catalogue.tensors.size(), max_plan_tensors));
  // Count before allocating: the plan is host memory on every rank, ~88 bytes per chunk.
  const PlanSize size = plan_size(catalogue, chunk_bytes);
  if (size.chunks > max_plan_chunks) refuse_chunk_count(catalogue, chunk_bytes, size.chunks);
  // pieces < nonzero-size tensors + chunks ≤ 2^32 - 1 within the two limits above; checked
  // anyway so that no change to them can wrap `first_piece` or `piece_count` silently.
  WEIGHTCAST_EXPECT(size.pieces <= 0xFFFF'FFFFull, Errc::internal,
                    fmt::format("the plan would have {} pieces, more than 32-bit indices hold",
                                size.pieces));
  Plan plan;
  plan.chunks.reserve(size.chunks);
  plan.pieces.reserve(size.pieces);
  plan.chunk_bytes = chunk_bytes;
  plan.tensor_piece_counts.assign(catalogue.tensors.size(), 0);

  Chunk* open = nullptr;  // the chunk being filled, if any
  for (std::uint32_t t = 0; t < catalogue.tensors.size(); ++t) {
    const TensorInfo& tensor = catalogue.tensors[t];
    std::uint64_t done = 0;
    while (done < tensor.bytes) {
      const std::uint64_t file_offset = tensor.file_offset + done;
      const std::uint64_t arena_offset = layout.tensor_offsets[t] + done;
      // A new chunk starts at a shard change, when the open one is full, or where the bytes
      // are not contiguous in the file (never within a valid shard, which has no holes).
      if (open == nullptr || open->shard != tensor.shard || open->bytes == chunk_bytes ||
          open->file_offset + open->bytes != file_offset) {
        plan.chunks.push_back(Chunk{tensor.shard, file_offset, 0, arena_offset, true,
                                    static_cast<std::uint32_t>(plan.pieces.size()), 0});
        open = &plan.chunks.back();
      }
      const std::uint64_t take = std::min(tensor.bytes - done, chunk_bytes - open->bytes);
      if (arena_offset != open->arena_offset + open->bytes) open->arena_contiguous = false;
      plan.pieces.push_back(Piece{t, open->bytes, done, arena_offset, take});
      ++open->piece_count;
      ++plan.tensor_piece_counts[t];
      open->bytes += take;
      plan.total_bytes += take;
      done += take;
    }
  }
  WEIGHTCAST_EXPECT(plan.chunks.size() == size.chunks && plan.pieces.size() == size.pieces,
                    Errc::internal,
                    fmt::format("plan of {} chunks and {} pieces, counted {} and {}",
                                plan.chunks.size(), plan.pieces.size(), size.chunks, size.pieces));
  return plan;
}

namespace {

std::unordered_map<std::string_view, std::uint32_t> tensor_index(const Catalogue& catalogue) {
  std::unordered_map<std::string_view, std::uint32_t> index;
  index.reserve(catalogue.tensors.size());
  for (std::uint32_t t = 0; t < catalogue.tensors.size(); ++t) {
    index.emplace(catalogue.tensors[t].name, t);
  }
  return index;
}

}  // namespace

Plan make_placed_plan(const Catalogue& catalogue, std::span<const RankWants> wants,
                      std::uint64_t chunk_bytes, int keep_rank) {
  Plan plan = make_plan(catalogue, layout_arena(catalogue), chunk_bytes);
  const auto index = tensor_index(catalogue);
  // Per tensor, its receivers: (rank, want index) and the want's runs in the tensor's bytes.
  struct Receiver {
    std::int32_t rank;
    std::uint32_t want;
    detail::ShardRuns runs;
  };
  std::vector<std::vector<Receiver>> receivers(catalogue.tensors.size());
  std::vector<std::uint32_t> whole_count(catalogue.tensors.size(), 0);
  for (std::size_t r = 0; r < wants.size(); ++r) {
    for (std::uint32_t w = 0; w < wants[r].tensors.size(); ++w) {
      const TensorWant& want = wants[r].tensors[w];
      const auto found = index.find(want.tensor);
      WEIGHTCAST_EXPECT(found != index.end(), Errc::internal,
                        fmt::format("make_placed_plan: rank {} wants unknown tensor '{}' (not "
                                    "validated)",
                                    r, want.tensor));
      const TensorInfo& tensor = catalogue.tensors[found->second];
      if (wants_whole(tensor, want)) ++whole_count[found->second];
      receivers[found->second].push_back(
          Receiver{static_cast<std::int32_t>(r), w, detail::ShardRuns(tensor, want)});
    }
  }
  plan.chunk_broadcast.assign(plan.chunks.size(), 0);
  plan.chunk_first_delivery.assign(plan.chunks.size() + 1, 0);
  for (std::size_t c = 0; c < plan.chunks.size(); ++c) {
    const Chunk& chunk = plan.chunks[c];
    plan.chunk_first_delivery[c] = plan.deliveries.size();
    bool broadcast = wants.size() > 0;
    for (std::uint32_t p = 0; p < chunk.piece_count && broadcast; ++p) {
      broadcast = whole_count[plan.pieces[chunk.first_piece + p].tensor] == wants.size();
    }
    plan.chunk_broadcast[c] = broadcast ? 1 : 0;
    if (broadcast) continue;
    for (std::uint32_t p = chunk.first_piece; p < chunk.first_piece + chunk.piece_count; ++p) {
      const Piece& piece = plan.pieces[p];
      for (const Receiver& receiver : receivers[piece.tensor]) {
        if (keep_rank >= 0 && receiver.rank != keep_rank) continue;
        const std::uint64_t begin = receiver.runs.local_before(piece.tensor_offset);
        const std::uint64_t end = receiver.runs.local_before(piece.tensor_offset + piece.bytes);
        if (end <= begin) continue;
        const std::uint64_t run = receiver.runs.run_bytes();
        const std::uint64_t runs = (end - 1) / run - begin / run + 1;
        plan.deliveries.push_back(
            Delivery{begin, end - begin, p, receiver.want, receiver.rank,
                     static_cast<std::uint32_t>(std::min<std::uint64_t>(runs, 0xFFFF'FFFFu))});
      }
    }
  }
  plan.chunk_first_delivery.back() = plan.deliveries.size();
  return plan;
}

WantLayout layout_wants(const Catalogue& catalogue, const RankWants& wants,
                        std::uint64_t alignment) {
  WEIGHTCAST_EXPECT(alignment != 0 && (alignment & (alignment - 1)) == 0, Errc::internal,
                    fmt::format("arena alignment {} is not a power of two", alignment));
  const auto index = tensor_index(catalogue);
  WantLayout layout;
  layout.offsets.reserve(wants.tensors.size());
  std::uint64_t offset = 0;
  for (const TensorWant& want : wants.tensors) {
    const auto found = index.find(want.tensor);
    WEIGHTCAST_EXPECT(found != index.end(), Errc::config,
                      fmt::format("placement: tensor '{}': no tensor of that name in the "
                                  "checkpoint",
                                  want.tensor));
    if (want.destination.in_place || want.destination.data != nullptr) {
      layout.offsets.push_back(no_arena_offset);
      continue;
    }
    const std::uint64_t bytes = destination_bytes(catalogue.tensors[found->second], want);
    const std::uint64_t aligned = (offset + alignment - 1) & ~(alignment - 1);
    WEIGHTCAST_EXPECT(aligned >= offset && aligned + bytes >= aligned, Errc::internal,
                      fmt::format("arena size overflows 64 bits at tensor '{}'", want.tensor));
    layout.offsets.push_back(aligned);
    offset = aligned + bytes;
  }
  layout.arena_bytes = offset;
  return layout;
}

}  // namespace weightcast
