// Rank 0's verdict on a placed load: each rank's digests of its local shards against what it
// should have, hashed by rank 0 as the bytes passed, or, with local reads over the node ring,
// by the rank itself as it read them from the files (its report's `expected`).
#include "weightcast/distributed/detail/job_verdict.hpp"

#include <catch2/catch.hpp>

using namespace weightcast;
using namespace weightcast::detail;
using Catch::Matchers::Contains;

namespace {

LoadPlacement placement_of(std::vector<std::vector<std::string>> wants) {
  LoadPlacement placement;
  for (const auto& rank : wants) {
    RankWants r;
    for (const auto& name : rank) {
      TensorWant want;
      want.tensor = name;
      r.tensors.push_back(want);
    }
    placement.all.push_back(r);
  }
  placement.expect_digests = true;
  return placement;
}

}  // namespace

TEST_CASE("verdict: with local reads each rank's digests are judged against its own expected "
          "ones",
          "[verdict][local_reads]") {
  // Rank 0's row only: the others hashed their own.
  const LoadPlacement placement = placement_of({{"a", "b"}, {"a", "c"}, {}});
  const std::vector<std::vector<std::uint64_t>> rank0_row = {{1, 2}};
  std::vector<RankReport> reports = {{0, 8, 0.1, {1, 2}, {}},
                                     {1, 8, 0.1, {3, 4}, {3, 4}},
                                     {2, 0, 0.1, {}, {}}};  // no wants: nothing to compare
  const Verdict good = judge_placed(reports, placement, rank0_row, Verify::digest, true);
  CHECK(good.status == 0);
  CHECK_THAT(good.message, Contains("bit-exact") &&
                               Contains("matches the bytes it read from the files"));

  reports[1].digests[1] = 5;
  const Verdict bad = judge_placed(reports, placement, rank0_row, Verify::digest, true);
  CHECK(bad.status == 70);
  CHECK_THAT(bad.message, Contains("1 local shard mismatch against the files' bytes") &&
                              Contains("rank 1: tensor 'c'") &&
                              Contains("the files held bytes of xxh3"));

  // A rank with wants that sent none of its expected digests is a mismatch, not a pass.
  reports[1].digests[1] = 4;
  reports[1].expected.clear();
  const Verdict missing = judge_placed(reports, placement, rank0_row, Verify::digest, true);
  CHECK(missing.status == 70);
  CHECK_THAT(missing.message, Contains("rank 1 sent no digests of the bytes it read itself"));

  // Through the ring rank 0 has every rank's row.
  reports[1].expected.clear();
  const Verdict ring =
      judge_placed(reports, placement, {{1, 2}, {3, 4}, {}}, Verify::digest, false);
  CHECK(ring.status == 0);
  CHECK_THAT(ring.message, Contains("matches the bytes rank 0 sent it"));
  reports[1].expected = {3};
  const Verdict short_list =
      judge_placed(reports, placement, {{1, 2}, {3, 4}, {}}, Verify::digest, true);
  CHECK(short_list.status == 70);
  CHECK_THAT(short_list.message, Contains("rank 1 reported 2 digests (and 1 of the bytes it "
                                          "should have) for its 2 local shards"));
}
