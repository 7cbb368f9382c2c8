#include "weightcast/plan/placement.hpp"

#include "weightcast/core/detail/wire.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <fnmatch.h>
#include <unordered_map>
#include <unordered_set>

namespace weightcast {

namespace {

constexpr std::uint32_t wants_magic = 0x544E5757;  // "WWNT" little-endian
constexpr std::uint32_t wants_version = 1;

std::string rule_name(std::size_t index, const PlacementRule& rule) {
  return fmt::format("placement rule {} (pattern '{}')", index + 1, rule.pattern);
}

// The rule's own consistency, before any tensor: the same message whatever matches it.
void check_rule(std::size_t index, const PlacementRule& rule, int world_size) {
  std::unordered_set<int> seen;
  for (int r : rule.ranks) {
    WEIGHTCAST_EXPECT(r >= 0 && r < world_size, Errc::config,
                      fmt::format("{}: ranks: rank {} is outside the world of {} ranks",
                                  rule_name(index, rule), r, world_size));
    WEIGHTCAST_EXPECT(seen.insert(r).second, Errc::config,
                      fmt::format("{}: ranks: rank {} is listed twice", rule_name(index, rule),
                                  r));
  }
  if (rule.action == PlacementRule::Action::ranks) {
    WEIGHTCAST_EXPECT(!rule.ranks.empty(), Errc::config,
                      fmt::format("{}: ranks: lists no rank (use skip for none)",
                                  rule_name(index, rule)));
  }
  if (rule.action == PlacementRule::Action::shard && rule.group > 1) {
    WEIGHTCAST_EXPECT(rule.ranks.empty(), Errc::config,
                      fmt::format("{}: shard: give ranks or group, not both",
                                  rule_name(index, rule)));
    WEIGHTCAST_EXPECT(static_cast<std::uint64_t>(world_size) % rule.group == 0, Errc::config,
                      fmt::format("{}: shard: group {} does not divide the world size {}",
                                  rule_name(index, rule), rule.group, world_size));
  }
}

TensorWant whole(const TensorInfo& tensor) {
  TensorWant want;
  want.tensor = tensor.name;
  return want;
}

// Rows [chunk_rows) of `dim` of @p tensor, the rest whole.
TensorWant sharded(const TensorInfo& tensor, std::uint32_t dim, std::uint32_t parts,
                   std::uint32_t part) {
  if (tensor.shape.empty()) return whole(tensor);  // 0-dim: whole on every rank (FSDP2)
  TensorWant want = whole(tensor);
  want.offset.assign(tensor.shape.size(), 0);
  want.shape = tensor.shape;
  const RowRange rows = chunk_rows(tensor.shape[dim], parts, part);
  want.offset[dim] = rows.begin;
  want.shape[dim] = rows.count;
  return want;
}

std::string dims_text(const std::vector<std::uint64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

[[noreturn]] void refuse(int rank, const TensorWant& want, std::string_view key,
                         const std::string& why, Errc code = Errc::config) {
  throw Error(code, fmt::format("placement: rank {}: tensor '{}': {}: {}", rank, want.tensor,
                                key, why));
}

std::uint32_t dtype_bytes(Dtype dtype) { return dtype_bits(dtype) / 8; }

}  // namespace

std::string_view to_string(PlacementMode mode) noexcept {
  return choice_name(setting::placement, static_cast<int>(mode));
}

RowRange chunk_rows(std::uint64_t n, std::uint32_t parts, std::uint32_t part) noexcept {
  if (parts == 0 || n == 0) return {std::min<std::uint64_t>(n, 0), 0};
  const std::uint64_t c = n / parts + (n % parts != 0);
  const std::uint64_t begin = std::min<std::uint64_t>(n, c * part);
  const std::uint64_t end = std::min<std::uint64_t>(n, c * (std::uint64_t{part} + 1));
  return {begin, end - begin};
}

RankWants resolve_placement(const PlacementSpec& spec, const Catalogue& catalogue, int rank,
                            int world_size) {
  WEIGHTCAST_EXPECT(world_size >= 1 && rank >= 0 && rank < world_size, Errc::internal,
                    fmt::format("resolve_placement: rank {} of {}", rank, world_size));
  for (std::size_t i = 0; i < spec.rules.size(); ++i) check_rule(i, spec.rules[i], world_size);
  RankWants wants;
  const auto world = static_cast<std::uint32_t>(world_size);
  const auto me = static_cast<std::uint32_t>(rank);
  for (const TensorInfo& tensor : catalogue.tensors) {
    const PlacementRule* rule = nullptr;
    std::size_t index = 0;
    for (; index < spec.rules.size(); ++index) {
      if (::fnmatch(spec.rules[index].pattern.c_str(), tensor.name.c_str(), 0) == 0) {
        rule = &spec.rules[index];
        break;
      }
    }
    if (rule == nullptr) {
      if (spec.mode == PlacementMode::replicate) {
        wants.tensors.push_back(whole(tensor));
      } else {
        wants.tensors.push_back(sharded(tensor, 0, world, me));
      }
      continue;
    }
    switch (rule->action) {
      case PlacementRule::Action::replicate:
        wants.tensors.push_back(whole(tensor));
        break;
      case PlacementRule::Action::skip:
        break;
      case PlacementRule::Action::ranks:
        if (std::find(rule->ranks.begin(), rule->ranks.end(), rank) != rule->ranks.end()) {
          wants.tensors.push_back(whole(tensor));
        }
        break;
      case PlacementRule::Action::shard: {
        WEIGHTCAST_EXPECT(tensor.shape.empty() || rule->dim < tensor.shape.size(), Errc::config,
                          fmt::format("{}: shard: dim {} is out of range for tensor '{}' of "
                                      "shape {} ({} dims)",
                                      rule_name(index, *rule), rule->dim, tensor.name,
                                      dims_text(tensor.shape), tensor.shape.size()));
        if (rule->group > 1) {
          wants.tensors.push_back(sharded(tensor, rule->dim, rule->group, me % rule->group));
        } else if (!rule->ranks.empty()) {
          const auto at = std::find(rule->ranks.begin(), rule->ranks.end(), rank);
          if (at == rule->ranks.end()) break;
          wants.tensors.push_back(
              sharded(tensor, rule->dim, static_cast<std::uint32_t>(rule->ranks.size()),
                      static_cast<std::uint32_t>(at - rule->ranks.begin())));
        } else {
          wants.tensors.push_back(sharded(tensor, rule->dim, world, me));
        }
        break;
      }
    }
  }
  return wants;
}

bool wants_whole(const TensorInfo& tensor, const TensorWant& want) {
  if (want.offset.empty() && want.shape.empty()) return true;
  for (std::size_t d = 0; d < tensor.shape.size(); ++d) {
    if (want.offset[d] != 0 || want.shape[d] != tensor.shape[d]) return false;
  }
  return true;
}

std::vector<std::uint64_t> local_shape(const TensorInfo& tensor, const TensorWant& want) {
  return want.shape.empty() && want.offset.empty() ? tensor.shape : want.shape;
}

std::vector<std::uint64_t> local_offset(const TensorInfo& tensor, const TensorWant& want) {
  return want.offset.empty() && want.shape.empty()
             ? std::vector<std::uint64_t>(tensor.shape.size(), 0)
             : want.offset;
}

std::uint64_t local_elements(const TensorInfo& tensor, const TensorWant& want) {
  std::uint64_t n = 1;
  for (std::uint64_t d : local_shape(tensor, want)) n *= d;
  return n;
}

std::uint64_t local_bytes(const TensorInfo& tensor, const TensorWant& want) {
  if (wants_whole(tensor, want)) return tensor.bytes;
  return static_cast<std::uint64_t>(
      static_cast<unsigned __int128>(local_elements(tensor, want)) * dtype_bits(tensor.dtype) /
      8);
}

std::uint64_t destination_bytes(const TensorInfo& tensor, const TensorWant& want) {
  if (!want.destination.dtype || *want.destination.dtype == tensor.dtype) {
    return local_bytes(tensor, want);
  }
  return local_elements(tensor, want) * dtype_bytes(*want.destination.dtype);
}

bool cast_supported(Dtype from, Dtype to) noexcept {
  if (from == to) return true;
  if (to == Dtype::F32) return from == Dtype::BF16 || from == Dtype::F16;
  if (from == Dtype::F32) return to == Dtype::BF16 || to == Dtype::F16;
  return false;
}

void validate_wants(const Catalogue& catalogue, std::span<const RankWants> wants) {
  std::unordered_map<std::string_view, std::size_t> index;
  index.reserve(catalogue.tensors.size());
  for (std::size_t t = 0; t < catalogue.tensors.size(); ++t) {
    index.emplace(catalogue.tensors[t].name, t);
  }
  for (std::size_t r = 0; r < wants.size(); ++r) {
    const int rank = static_cast<int>(r);
    std::unordered_set<std::string_view> asked;
    for (const TensorWant& want : wants[r].tensors) {
      const auto found = index.find(want.tensor);
      if (found == index.end()) {
        refuse(rank, want, "tensor", "no tensor of that name in the checkpoint");
      }
      if (!asked.insert(want.tensor).second) {
        refuse(rank, want, "tensor", "asked for twice by this rank");
      }
      const TensorInfo& tensor = catalogue.tensors[found->second];
      const std::size_t dims = tensor.shape.size();
      if (!(want.offset.empty() && want.shape.empty())) {
        if (want.offset.size() != dims) {
          refuse(rank, want, "offset",
                 fmt::format("{} has {} dims; the tensor has {} (shape {})",
                             dims_text(want.offset), want.offset.size(), dims,
                             dims_text(tensor.shape)));
        }
        if (want.shape.size() != dims) {
          refuse(rank, want, "shape",
                 fmt::format("{} has {} dims; the tensor has {} (shape {})",
                             dims_text(want.shape), want.shape.size(), dims,
                             dims_text(tensor.shape)));
        }
        for (std::size_t d = 0; d < dims; ++d) {
          if (want.offset[d] > tensor.shape[d] ||
              want.shape[d] > tensor.shape[d] - want.offset[d]) {
            refuse(rank, want, "offset",
                   fmt::format("slice offset {} + shape {} is outside the tensor's shape {} "
                               "(dim {})",
                               dims_text(want.offset), dims_text(want.shape),
                               dims_text(tensor.shape), d));
          }
        }
        // A sub-byte dtype packs elements across bytes: a slice must start and end on whole
        // bytes in every run (ShardRuns), so the bits of one index of its innermost sliced
        // dim must be whole bytes.
        if (dtype_bits(tensor.dtype) % 8 != 0 && !wants_whole(tensor, want) &&
            local_elements(tensor, want) != 0) {
          std::size_t k = dims;
          while (k > 0 && want.shape[k - 1] == tensor.shape[k - 1] && want.offset[k - 1] == 0) {
            --k;
          }
          unsigned __int128 inner_bits = dtype_bits(tensor.dtype);
          for (std::size_t d = k; d < dims; ++d) inner_bits *= tensor.shape[d];
          if (inner_bits % 8 != 0) {
            refuse(rank, want, "offset",
                   fmt::format("a slice of a {} tensor of shape {} at dim {} does not begin on "
                               "a whole byte ({} elements pack across bytes)",
                               dtype_name(tensor.dtype), dims_text(tensor.shape), k - 1,
                               dtype_name(tensor.dtype)),
                   Errc::invalid_checkpoint);
          }
        }
      }
      const TensorDestination& destination = want.destination;
      if (destination.dtype) {
        if (!cast_supported(tensor.dtype, *destination.dtype)) {
          refuse(rank, want, "destination.dtype",
                 fmt::format("cannot cast {} to {} (supported: BF16 or F16 to F32, F32 to BF16 "
                             "or F16)",
                             dtype_name(tensor.dtype), dtype_name(*destination.dtype)));
        }
        if (*destination.dtype != tensor.dtype && destination.memory != MemoryKind::host) {
          refuse(rank, want, "destination.memory",
                 fmt::format("a cast from {} to {} happens in host memory; the destination is "
                             "device memory",
                             dtype_name(tensor.dtype), dtype_name(*destination.dtype)));
        }
      }
      if (destination.in_place || destination.data != nullptr) {
        const std::uint64_t need = destination_bytes(tensor, want);
        if (destination.capacity_bytes < need) {
          refuse(rank, want, "destination.capacity_bytes",
                 fmt::format("{} bytes is too small for the local shard of shape {} ({}: {} "
                             "bytes)",
                             destination.capacity_bytes, dims_text(local_shape(tensor, want)),
                             dtype_name(destination.dtype.value_or(tensor.dtype)), need));
        }
      }
    }
  }
}

std::string encode_wants(std::span<const RankWants> wants) {
  detail::WireWriter out;
  out.put(wants_magic);
  out.put(wants_version);
  out.put(static_cast<std::uint32_t>(wants.size()));
  for (const RankWants& rank : wants) {
    out.put(static_cast<std::uint32_t>(rank.tensors.size()));
    for (const TensorWant& want : rank.tensors) {
      out.put_string(want.tensor);
      out.put(static_cast<std::uint32_t>(want.offset.size()));
      for (std::uint64_t v : want.offset) out.put(v);
      out.put(static_cast<std::uint32_t>(want.shape.size()));
      for (std::uint64_t v : want.shape) out.put(v);
      const TensorDestination& d = want.destination;
      out.put(static_cast<std::uint8_t>(d.in_place || d.data != nullptr));
      out.put(static_cast<std::uint8_t>(d.memory == MemoryKind::cuda));
      out.put(d.capacity_bytes);
      out.put(static_cast<std::uint8_t>(d.dtype ? 1 + static_cast<int>(*d.dtype) : 0));
    }
  }
  return std::move(out.bytes());
}

std::vector<RankWants> decode_wants(std::string_view bytes, std::string_view what) {
  detail::WireReader in(bytes, what);
  if (in.get<std::uint32_t>("magic") != wants_magic) in.fail("magic", "not placement wants");
  if (const auto v = in.get<std::uint32_t>("version"); v != wants_version) {
    in.fail("version", fmt::format("version {}, this build speaks {} (mixed weightcast builds?)",
                                   v, wants_version));
  }
  const auto ranks = in.get<std::uint32_t>("rank count");
  in.need_items(ranks, 4, "ranks");
  std::vector<RankWants> wants(ranks);
  for (RankWants& rank : wants) {
    const auto count = in.get<std::uint32_t>("want count");
    // name length, two dim counts, flags, capacity, dtype: at least 23 bytes each
    in.need_items(count, 4 + 4 + 4 + 1 + 1 + 8 + 1, "wants");
    rank.tensors.resize(count);
    for (TensorWant& want : rank.tensors) {
      want.tensor = in.get_string("tensor name");
      for (auto* dims : {&want.offset, &want.shape}) {
        // Any number, as the format and the catalogue's wire allow; bounded by the bytes left.
        const auto n = in.get<std::uint32_t>("dims");
        in.need_items(n, 8, "dims");
        dims->resize(n);
        for (std::uint64_t& v : *dims) v = in.get<std::uint64_t>("dim");
      }
      const auto in_place = in.get<std::uint8_t>("in place");
      const auto memory = in.get<std::uint8_t>("memory");
      if (in_place > 1 || memory > 1) in.fail("tensor '" + want.tensor + "'", "bad flags");
      want.destination.in_place = in_place == 1;
      want.destination.memory = memory == 1 ? MemoryKind::cuda : MemoryKind::host;
      want.destination.capacity_bytes = in.get<std::uint64_t>("capacity");
      const auto dtype = in.get<std::uint8_t>("dtype");
      if (dtype > dtype_count) {
        in.fail("tensor '" + want.tensor + "'", fmt::format("unknown dtype {}", dtype - 1));
      }
      if (dtype != 0) want.destination.dtype = static_cast<Dtype>(dtype - 1);
    }
  }
  if (in.left() != 0) in.fail("end", fmt::format("{} trailing bytes", in.left()));
  return wants;
}

namespace {

std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
std::uint16_t load_u16(const std::byte* p) {
  std::uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void store_u32(std::byte* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
void store_u16(std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); }

std::uint16_t f32_to_bf16(std::uint32_t bits) {
  if ((bits & 0x7FFF'FFFFu) > 0x7F80'0000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

}  // namespace

void cast_elements(Dtype from, Dtype to, const std::byte* source, std::byte* target,
                   std::uint64_t elements) {
  WEIGHTCAST_EXPECT(cast_supported(from, to), Errc::config,
                    fmt::format("cannot cast {} to {}", dtype_name(from), dtype_name(to)));
  if (from == to) {
    std::memcpy(target, source, elements * dtype_bits(from) / 8);
    return;
  }
  if (from == Dtype::BF16) {
    for (std::uint64_t i = 0; i < elements; ++i) {
      store_u32(target + 4 * i, std::uint32_t{load_u16(source + 2 * i)} << 16);
    }
  } else if (from == Dtype::F16) {
    // The compiler's _Float16 conversions are IEEE 754's (exact widening).
    for (std::uint64_t i = 0; i < elements; ++i) {
      const std::uint16_t h = load_u16(source + 2 * i);
      _Float16 half;
      std::memcpy(&half, &h, 2);
      const float f = static_cast<float>(half);
      std::memcpy(target + 4 * i, &f, 4);
    }
  } else if (to == Dtype::BF16) {
    for (std::uint64_t i = 0; i < elements; ++i) {
      store_u16(target + 2 * i, f32_to_bf16(load_u32(source + 4 * i)));
    }
  } else {
    // Narrowing float to _Float16 rounds to nearest even (the default rounding mode).
    for (std::uint64_t i = 0; i < elements; ++i) {
      float f;
      std::memcpy(&f, source + 4 * i, 4);
      const auto half = static_cast<_Float16>(f);
      std::memcpy(target + 2 * i, &half, 2);
    }
  }
}

namespace detail {

ShardRuns::ShardRuns(const TensorInfo& tensor, const TensorWant& want) {
  if (wants_whole(tensor, want)) {
    _run_bytes = tensor.bytes;
    _runs = tensor.bytes == 0 ? 0 : 1;
    return;
  }
  const std::size_t dims = tensor.shape.size();
  if (local_elements(tensor, want) == 0) return;  // an empty local shard: no run
  // The run's dim k is the last one the slice does not cover whole; dims after it fold in.
  std::size_t k = dims;
  while (k > 0 && want.shape[k - 1] == tensor.shape[k - 1] && want.offset[k - 1] == 0) --k;
  --k;  // not whole, so some dim is sliced
  std::uint64_t inner_bits = dtype_bits(tensor.dtype);
  for (std::size_t d = k + 1; d < dims; ++d) inner_bits *= tensor.shape[d];
  const std::uint64_t inner = inner_bits / 8;  // whole bytes (validate_wants)
  _extent.assign(tensor.shape.begin(), tensor.shape.begin() + k + 1);
  _begin.assign(want.offset.begin(), want.offset.begin() + k + 1);
  _count.assign(want.shape.begin(), want.shape.begin() + k + 1);
  _stride.assign(k + 1, 0);
  _stride[k] = inner;
  for (std::size_t d = k; d-- > 0;) _stride[d] = _stride[d + 1] * _extent[d + 1];
  _run_bytes = _count[k] * inner;
  _runs = 1;
  for (std::size_t d = 0; d < k; ++d) _runs *= _count[d];
}

std::uint64_t ShardRuns::run_start(std::uint64_t run) const noexcept {
  if (_stride.empty()) return 0;
  const std::size_t k = _stride.size() - 1;
  std::uint64_t start = _begin[k] * _stride[k];
  for (std::size_t d = k; d-- > 0;) {
    start += (_begin[d] + run % _count[d]) * _stride[d];
    run /= _count[d];
  }
  return start;
}

std::uint64_t ShardRuns::local_before(std::uint64_t tensor_byte) const noexcept {
  if (_stride.empty()) return std::min(tensor_byte, bytes());
  const std::size_t k = _stride.size() - 1;
  std::uint64_t result = 0;
  std::uint64_t rem = tensor_byte;
  std::uint64_t box = bytes();  // local bytes of the sub-box below the current dim
  for (std::size_t d = 0; d <= k; ++d) {
    box /= _count[d];  // local bytes per index of dim d
    const std::uint64_t q = rem / _stride[d];
    const std::uint64_t r = rem % _stride[d];
    const std::uint64_t below =
        q < _begin[d] ? 0 : std::min<std::uint64_t>(q - _begin[d], _count[d]);
    result += below * box;
    if (q < _begin[d] || q >= _begin[d] + _count[d]) return result;
    if (d == k) return result + r;
    rem = r;
  }
  return result;
}

}  // namespace detail

}  // namespace weightcast
