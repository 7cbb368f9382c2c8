#include "weightcast/pipeline/digest.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <fmt/core.h>
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>) && \
  !defined(WEIGHTCAST_XXHASH_NO_DISPATCH)
// libxxhash's runtime dispatch (Debian builds it into the shared library): the XXH3 calls
// below become their `_dispatch` forms, which use AVX2 or AVX-512 where the CPU has them; the
// digests are the same, and they are faster than the SSE2 default (bench/RESULTS.md;
// build/xxh3_bench measures both). Debian's static libxxhash.a has no dispatch: the
// self-contained build (cmake/weightcastSelfContained.cmake) defines
// WEIGHTCAST_XXHASH_NO_DISPATCH and uses the plain entry points.
#include <xxh_x86dispatch.h>
#endif

#include <memory>

namespace weightcast {

std::uint64_t xxh3_64(const void* data, std::size_t bytes) noexcept {
  return XXH3_64bits(data, bytes);
}

std::string digest_hex(std::uint64_t digest) { return fmt::format("{:016x}", digest); }

std::vector<std::uint64_t> tensor_digests(const LoadResult& result) {
  // `destination: discard`: the digests were taken as the bytes streamed past.
  if (!result.digests.empty() || result.catalogue.tensors.empty()) return result.digests;
  // A discarded load that hashed nothing (`verify: none`) has no bytes to hash.
  if (result.arena->data() == nullptr && result.catalogue.total_bytes() > 0) return {};
  std::vector<std::uint64_t> digests;
  digests.reserve(result.catalogue.tensors.size());
  if (result.arena->kind() == MemoryKind::host) {
    for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
      const TensorView view = result.tensor(i);
      digests.push_back(xxh3_64(view.data, view.info->bytes));
    }
    return digests;
  }
  // Device memory: stream each tensor through the arena's pinned bounce buffer. The
  // streaming XXH3 state gives the same digest as the one-shot form over the same bytes.
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                   &XXH3_freeState);
  WEIGHTCAST_EXPECT(state != nullptr, Errc::internal, "XXH3_createState: out of memory");
  for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
    const TensorInfo& tensor = result.catalogue.tensors[i];
    XXH3_64bits_reset(state.get());
    result.arena->read_back(tensor.bytes == 0 ? 0 : result.layout.tensor_offsets.at(i),
                            tensor.bytes, [&](const std::byte* data, std::size_t bytes) {
                              XXH3_64bits_update(state.get(), data, bytes);
                            });
    digests.push_back(XXH3_64bits_digest(state.get()));
  }
  return digests;
}

struct StreamingDigests::State {
  XXH3_state_t* xxh = XXH3_createState();
  State() {
    WEIGHTCAST_EXPECT(xxh != nullptr, Errc::internal, "XXH3_createState: out of memory");
    XXH3_64bits_reset(xxh);
  }
  ~State() { XXH3_freeState(xxh); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
};

StreamingDigests::StreamingDigests(std::size_t tensors)
    : _digests(tensors, XXH3_64bits(nullptr, 0)), _open(tensors) {}
StreamingDigests::~StreamingDigests() = default;
StreamingDigests::StreamingDigests(StreamingDigests&&) noexcept = default;
StreamingDigests& StreamingDigests::operator=(StreamingDigests&&) noexcept = default;

void StreamingDigests::update(std::uint32_t tensor, const void* data, std::size_t bytes) {
  auto& state = _open.at(tensor);
  if (!state) state = std::make_unique<State>();
  XXH3_64bits_update(state->xxh, data, bytes);
}

void StreamingDigests::finish(std::uint32_t tensor) {
  auto& state = _open.at(tensor);
  if (!state) return;  // no bytes: keeps the digest of the empty input
  _digests[tensor] = XXH3_64bits_digest(state->xxh);
  state.reset();
}

}  // namespace weightcast
