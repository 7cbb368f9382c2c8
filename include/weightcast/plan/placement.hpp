/**
 * @file placement.hpp
 * @brief Placement: for every rank, which part of each tensor it receives and where it lands.
 *
 * A rank's *wants* name, per tensor, a local shard (torch DTensor's meaning: an offset and a
 * shape per dim, the rank's `to_local()` slice of the global tensor) and a destination (the
 * arena weightcast allocates, or the caller's own memory, optionally cast to another dtype at
 * the receiver). A tensor a rank does not name, it does not receive.
 *
 * Wants come from a `PlacementSpec` (the config's `placement:` mode and rules, resolved by
 * `resolve_placement`) or straight from the caller (in-place destinations, e.g. a trainer's
 * FSDP2 parameters). Every rank sends its wants to rank 0 (`encode_wants`), which checks
 * them all against the catalogue (`validate_wants`) and plans the delivery
 * (`make_placed_plan`, plan.hpp). Fused tensors (a QKV or gate_up projection stored as one
 * tensor and split by the model) are out of scope: a rule slices a stored tensor as stored.
 *
 * Local bytes: a local shard's bytes are its elements in row-major order, contiguous, in the
 * checkpoint's dtype on the wire (and in the destination's dtype once landed).
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/format/dtype.hpp"
#include "weightcast/core/memory_kind.hpp"
#include "weightcast/core/settings.hpp"  // PlacementMode, the `placement:` setting

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast {

/// @return "replicate" or "fsdp".
std::string_view to_string(PlacementMode mode) noexcept;

/// One rule of a placement: tensors whose name matches `pattern` are placed by `action`.
struct PlacementRule {
  enum class Action : std::uint8_t {
    replicate,  ///< Whole on every rank.
    shard,      ///< Split along `dim` (`chunk_rows`) over `ranks` (or each group of `group`).
    skip,       ///< On no rank.
    ranks,      ///< Whole on the ranks listed in `ranks` only (e.g. a pipeline stage's layers).
  };
  /// A shell glob over the whole tensor name (`fnmatch` without flags: `*` also matches `.`),
  /// e.g. `model.layers.*.self_attn.o_proj.weight`.
  std::string pattern;
  Action action = Action::replicate;
  /// `shard`: the dimension split, 0 ≤ dim < the tensor's rank (0-dim tensors go whole).
  std::uint32_t dim = 0;
  /// `shard`: the ranks the tensor is split over, in shard order (empty: every rank, or every
  /// rank of each group); the others receive nothing of it. `ranks`: the receiving ranks.
  std::vector<int> ranks;
  /// `shard`: split over consecutive groups of this many ranks, each group holding the whole
  /// tensor (tensor parallel inside data parallel: rank r is shard r % group of group
  /// r / group); 0 or 1 of `world size`: one group. The world size must be a multiple.
  std::uint32_t group = 0;
};

/// A placement as the config states it: a default mode and rules (first match wins).
struct PlacementSpec {
  PlacementMode mode = PlacementMode::replicate;
  std::vector<PlacementRule> rules;
  /// @return true when this is today's behaviour: every tensor whole on every rank.
  [[nodiscard]] bool replicates_all() const noexcept {
    return mode == PlacementMode::replicate && rules.empty();
  }
};

/// Where a rank's local shard of one tensor lands.
struct TensorDestination {
  /// Null: in the arena weightcast allocates (`LoadResult`). Else the caller's memory, host or
  /// device (`memory`), contiguous, holding the local shard in row-major order; it must stay
  /// valid and untouched until the load returns.
  std::byte* data = nullptr;
  /// Bytes available at `data` (in-place only); must be ≥ the local shard's bytes in the
  /// destination dtype. Ignored for the arena.
  std::uint64_t capacity_bytes = 0;
  /// Whether `data` is host or device memory; must be the load's device's kind
  /// (`Arena::kind()`: `host` for `device: host`, `cuda` for a CUDA device).
  MemoryKind memory = MemoryKind::host;
  /// A dtype to cast to at the receiver, or nullopt for the checkpoint's dtype. Supported:
  /// F32 from BF16 or F16 (exact), BF16 or F16 from F32 (round to nearest even; NaN stays
  /// NaN), into host memory. The bytes travel in the checkpoint's dtype.
  std::optional<Dtype> dtype;
  /// True when the destination is the caller's memory (set by `encode_wants`' decoder for a
  /// peer's in-place want, whose pointer stays on that rank).
  bool in_place = false;
};

/// What one rank wants of one tensor.
struct TensorWant {
  std::string tensor;                 ///< The tensor's name in the checkpoint.
  /// The local shard: index of its first element per dim, and its extent per dim (torch
  /// DTensor `compute_local_shape_and_global_offset`). Both empty: the whole tensor.
  /// Otherwise both have the tensor's rank and offset[d] + shape[d] ≤ the global shape[d].
  std::vector<std::uint64_t> offset;
  std::vector<std::uint64_t> shape;
  TensorDestination destination;
};

/// One rank's wants, in any order; each tensor at most once.
struct RankWants {
  std::vector<TensorWant> tensors;
};

/**
 * @brief torch.chunk's rows for @p part of @p parts: with c = ⌈n / parts⌉, rows
 *        [min(n, part·c), min(n, (part+1)·c)) — trailing parts may get fewer or none
 *        (n = 5, parts = 4: 2, 2, 1, 0), as FSDP2's `Shard(0)` splits a parameter.
 * @return {first row, row count}.
 */
struct RowRange {
  std::uint64_t begin = 0;  ///< First row.
  std::uint64_t count = 0;  ///< Rows.
};
RowRange chunk_rows(std::uint64_t n, std::uint32_t parts, std::uint32_t part) noexcept;

/**
 * @brief This rank's wants under @p spec: for each catalogue tensor (catalogue order) the
 *        first matching rule, else the mode; destinations in the arena, no cast.
 * @param rank 0 ≤ rank < @p world_size.
 * @throws Error `config` (78) naming the rule (its index and pattern) and the tensor when a
 *         rule cannot apply: `shard` dim ≥ the tensor's rank, a rank in `ranks` outside the
 *         world, a repeated rank, `group` that does not divide the world size, or `ranks` and
 *         `group` together.
 */
RankWants resolve_placement(const PlacementSpec& spec, const Catalogue& catalogue, int rank,
                            int world_size);

/**
 * @brief Checks every rank's wants against the catalogue, on rank 0.
 * @param wants indexed by rank.
 * @throws Error `config` (78), one message naming the rank, the tensor and the key
 *         (`tensor`, `offset`, `shape`, `destination.capacity_bytes`, `destination.dtype`,
 *         `destination.memory`) for: an unknown tensor name, offset and shape of the wrong
 *         number of dims, a slice outside the tensor, a destination smaller than the local
 *         shard, an unsupported cast (or a cast into device memory), a tensor asked twice by
 *         one rank; `invalid_checkpoint` (65) when a slice of a sub-byte dtype (F4, F6_*)
 *         does not begin and end on whole bytes (the checkpoint's packing cannot be split).
 */
void validate_wants(const Catalogue& catalogue, std::span<const RankWants> wants);

/// @return the local shard's elements (the product of its shape; 1 for a 0-dim tensor).
std::uint64_t local_elements(const TensorInfo& tensor, const TensorWant& want);
/// @return the local shard's bytes in the checkpoint's dtype. Call after `validate_wants`.
std::uint64_t local_bytes(const TensorInfo& tensor, const TensorWant& want);
/// @return the local shard's bytes in the destination's dtype (the bytes that land).
std::uint64_t destination_bytes(const TensorInfo& tensor, const TensorWant& want);
/// @return the local shard's shape (the global shape when the want is whole).
std::vector<std::uint64_t> local_shape(const TensorInfo& tensor, const TensorWant& want);
/// @return the local shard's offset per dim (zeros when the want is whole).
std::vector<std::uint64_t> local_offset(const TensorInfo& tensor, const TensorWant& want);
/// @return true when @p want is the whole tensor (no slice, or a slice covering it).
bool wants_whole(const TensorInfo& tensor, const TensorWant& want);

/**
 * @brief Encodes every rank's wants (or one rank's) for the control plane; pointers stay
 *        local (a decoded in-place want has `in_place` set and a null `data`).
 *
 * No limit of its own: a want is its tensor's name and 31 bytes, 16 more per dimension of a
 * slice, so a checkpoint of many tensors on a few ranks encodes to more than one control
 * frame carries; such bytes travel in pieces (ControlPlane::share, ControlPlane::gather).
 */
std::string encode_wants(std::span<const RankWants> wants);

/**
 * @brief Decodes what `encode_wants` wrote, of any length, checking every count against the
 *        bytes left before allocating (safe on any input: what it allocates is bounded by
 *        @p bytes).
 * @param what names the payload in messages, e.g. "wants from rank 2".
 * @throws Error `unavailable` (69) naming @p what and the field on any malformed input.
 */
std::vector<RankWants> decode_wants(std::string_view bytes, std::string_view what);

/// @return true when @p to can be cast to at the receiver from @p from (see
///         `TensorDestination::dtype`), or @p from == @p to.
bool cast_supported(Dtype from, Dtype to) noexcept;

/**
 * @brief Converts @p elements elements at @p source (dtype @p from) into @p target (dtype
 *        @p to), host memory; BF16/F16 → F32 exactly, F32 → BF16/F16 rounding to nearest even
 *        (overflow to ±inf, NaN kept NaN with its sign). Unaligned pointers are fine.
 * @throws Error `config` (78) when `cast_supported(from, to)` is false.
 */
void cast_elements(Dtype from, Dtype to, const std::byte* source, std::byte* target,
                   std::uint64_t elements);

namespace detail {

/**
 * @brief The byte runs of a local shard in its tensor's row-major bytes: `runs()` runs of
 *        `run_bytes()` each, in file order; local byte l is tensor byte
 *        `tensor_offset(l)` for l inside a run.
 */
class ShardRuns {
 public:
  ShardRuns(const TensorInfo& tensor, const TensorWant& want);
  /// @return bytes per run (the local bytes when the shard is one run).
  [[nodiscard]] std::uint64_t run_bytes() const noexcept { return _run_bytes; }
  /// @return the number of runs (0 for an empty shard).
  [[nodiscard]] std::uint64_t runs() const noexcept { return _runs; }
  /// @return the local shard's bytes.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return _run_bytes * _runs; }
  /// @return the tensor byte offset of run @p run's first byte.
  [[nodiscard]] std::uint64_t run_start(std::uint64_t run) const noexcept;
  /// @return how many local bytes lie before tensor byte @p tensor_byte (0 ≤ it ≤ bytes).
  [[nodiscard]] std::uint64_t local_before(std::uint64_t tensor_byte) const noexcept;
  /**
   * @brief Calls `copy(tensor_byte, local_byte, bytes)` for each stretch of local bytes
   *        [@p local_begin, @p local_end), in order.
   */
  template <typename Copy>
  void for_each_stretch(std::uint64_t local_begin, std::uint64_t local_end, Copy&& copy) const {
    std::uint64_t l = local_begin;
    while (l < local_end) {
      const std::uint64_t run = l / _run_bytes;
      const std::uint64_t within = l % _run_bytes;
      const std::uint64_t take = std::min(_run_bytes - within, local_end - l);
      copy(run_start(run) + within, l, take);
      l += take;
    }
  }

 private:
  // Dims [0, _k) are the outer dims iterated run by run; dim _k is the run's own dim.
  std::vector<std::uint64_t> _extent;  // global extent per dim 0.._k
  std::vector<std::uint64_t> _begin;   // local offset per dim 0.._k
  std::vector<std::uint64_t> _count;   // local extent per dim 0.._k
  std::vector<std::uint64_t> _stride;  // bytes per index of each dim 0.._k
  std::uint64_t _run_bytes = 0;
  std::uint64_t _runs = 0;
};

}  // namespace detail

}  // namespace weightcast
