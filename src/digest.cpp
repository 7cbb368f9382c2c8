#include "weightcast/digest.hpp"

#include "weightcast/error.hpp"
#include "weightcast/loader.hpp"

#include <fmt/core.h>
#include <xxhash.h>

namespace weightcast {

std::uint64_t xxh3_64(const void* data, std::size_t bytes) noexcept {
  return XXH3_64bits(data, bytes);
}

std::string digest_hex(std::uint64_t digest) { return fmt::format("{:016x}", digest); }

std::vector<std::uint64_t> tensor_digests(const LoadResult& result) {
  WEIGHTCAST_EXPECT(result.arena->kind() == MemoryKind::host, Errc::internal,
                    "tensor digests of a device arena are not supported yet");
  std::vector<std::uint64_t> digests;
  digests.reserve(result.catalogue.tensors.size());
  for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
    const TensorView view = result.tensor(i);
    digests.push_back(xxh3_64(view.data, view.info->bytes));
  }
  return digests;
}

}  // namespace weightcast
