#include "weightcast/distributed/placement_agreement.hpp"

#include "weightcast/control/control_plane.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <cstring>

namespace weightcast {

namespace {

// The wants travel in a REPORT frame (the control plane's peer-to-rank-0 message): its
// digests carry the encoded bytes, 8 to a digest, after one holding their length.
std::vector<std::uint64_t> pack(const std::string& bytes) {
  std::vector<std::uint64_t> words(1 + (bytes.size() + 7) / 8, 0);
  words[0] = bytes.size();
  if (!bytes.empty()) std::memcpy(words.data() + 1, bytes.data(), bytes.size());
  return words;
}

std::string unpack(const std::vector<std::uint64_t>& words, int rank) {
  const std::string what = fmt::format("placement wants from rank {}", rank);
  if (words.empty() || words[0] > (words.size() - 1) * 8) {
    throw Error(Errc::unavailable, what + ": malformed (its length does not match)");
  }
  std::string bytes(words[0], '\0');
  if (!bytes.empty()) std::memcpy(bytes.data(), words.data() + 1, bytes.size());
  return bytes;
}

bool replicates_whole(const Catalogue& catalogue, const std::vector<RankWants>& all) {
  for (const RankWants& rank : all) {
    if (rank.tensors.size() != catalogue.tensors.size()) return false;
    for (std::size_t t = 0; t < rank.tensors.size(); ++t) {
      const TensorWant& want = rank.tensors[t];
      // Catalogue order, whole, in the arena, no cast: the legacy layout exactly.
      if (want.tensor != catalogue.tensors[t].name ||
          !wants_whole(catalogue.tensors[t], want) || want.destination.in_place ||
          want.destination.data != nullptr ||
          (want.destination.dtype && *want.destination.dtype != catalogue.tensors[t].dtype)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace

std::shared_ptr<const LoadPlacement> agree_placement(ControlPlane& control,
                                                     const Catalogue& catalogue,
                                                     RankWants mine, bool expect_digests) {
  const int rank = control.rank();
  const int world = control.world_size();
  auto placement = std::make_shared<LoadPlacement>();
  placement->expect_digests = expect_digests;
  if (world <= 1) {
    placement->all = {mine};  // load() checks it against the catalogue
  } else if (rank != 0) {
    const std::vector<RankWants> one{mine};
    RankReport report;
    report.digests = pack(encode_wants(one));
    control.gather(std::move(report));
    placement->all = decode_wants(control.share({}), "placement wants from rank 0");
    WEIGHTCAST_EXPECT(placement->all.size() == static_cast<std::size_t>(world) &&
                          placement->all[rank].tensors.size() == mine.tensors.size(),
                      Errc::unavailable,
                      fmt::format("placement wants from rank 0: {} ranks' wants for a world of "
                                  "{}",
                                  placement->all.size(), world));
  } else {
    RankReport report;
    report.digests = pack(encode_wants(std::vector<RankWants>{mine}));
    const std::vector<RankReport> reports = control.gather(std::move(report));
    placement->all.resize(world);
    placement->all[0] = mine;
    for (int r = 1; r < world; ++r) {
      auto decoded = decode_wants(unpack(reports.at(r).digests, r),
                                  fmt::format("placement wants from rank {}", r));
      if (decoded.size() != 1) {
        throw Error(Errc::unavailable,
                    fmt::format("placement wants from rank {}: {} ranks' wants, expected one",
                                r, decoded.size()));
      }
      placement->all[r] = std::move(decoded[0]);
    }
    validate_wants(catalogue, placement->all);
    control.share(encode_wants(placement->all));
  }
  placement->mine = std::move(mine);
  if (replicates_whole(catalogue, placement->all)) return nullptr;
  return placement;
}

}  // namespace weightcast
