#include "weightcast/plan.hpp"

#include "weightcast/config.hpp"
#include "weightcast/error.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <limits>

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
  WEIGHTCAST_EXPECT(chunk_bytes > 0, Errc::config, "chunk_size must be greater than 0");
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
  WEIGHTCAST_EXPECT(chunk_bytes > 0, Errc::config, "chunk_size must be greater than 0");
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

}  // namespace weightcast
