// Rank 0's verdict: every rank's digests against rank 0's own, or, for a placed load, against
// what rank 0 hashed of the bytes it sent each rank.
#include "weightcast/distributed/detail/job_verdict.hpp"

#include "weightcast/core/detail/plural.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/digest.hpp"

#include <fmt/core.h>

#include <string>

namespace weightcast::detail {

// digests took: rank 0's).
Verdict judge(const std::vector<RankReport>& reports, const Catalogue& catalogue, Verify verify,
              double seconds) {
  // Every rank has the same `verify` (check_shared_settings).
  if (verify == Verify::none) {
    return Verdict{0, fmt::format("{} × {} loaded, not compared (verify: none)",
                                  counted(reports.size(), "rank"),
                                  counted(catalogue.tensors.size(), "tensor"))};
  }
  const auto& mine = reports.at(0).digests;
  std::vector<std::string> mismatches;
  std::size_t count = 0;
  for (const RankReport& report : reports) {
    if (report.digests.size() != mine.size()) {
      ++count;
      mismatches.push_back(fmt::format("rank {} reported {} digests, rank 0 has {}", report.rank,
                                       report.digests.size(), mine.size()));
      continue;
    }
    for (std::size_t t = 0; t < mine.size(); ++t) {
      if (report.digests[t] == mine[t]) continue;
      if (++count <= 10) {
        mismatches.push_back(fmt::format("rank {}: tensor '{}' xxh3 {}, rank 0 has {}",
                                         report.rank, catalogue.tensors[t].name,
                                         digest_hex(report.digests[t]), digest_hex(mine[t])));
      }
    }
  }
  if (count == 0) {
    return Verdict{0, fmt::format("{} × {} bit-exact (XXH3-64 of every tensor "
                                  "matches rank 0's; hashing took {:.3f} s on rank 0)",
                                  counted(reports.size(), "rank"),
                                  counted(mine.size(), "tensor"), seconds)};
  }
  std::string message = fmt::format("{} against rank 0's bytes: ",
                                    counted(count, "tensor mismatch", "tensor mismatches"));
  for (std::size_t i = 0; i < mismatches.size(); ++i) {
    message += (i ? "; " : "") + mismatches[i];
  }
  return Verdict{exit_status(Errc::internal), message};
}

// Rank 0, a placed load: every rank's digests of its local shards against what rank 0 hashed
// of each rank's bytes as they passed through its staging ring, or, with local reads, what the
// rank hashed of the files' bytes as it read them (its report's `expected`).
Verdict judge_placed(const std::vector<RankReport>& reports, const LoadPlacement& placement,
                     const std::vector<std::vector<std::uint64_t>>& expected, Verify verify,
                     bool read_locally) {
  std::size_t wants = 0;
  for (const RankWants& r : placement.all) wants += r.tensors.size();
  if (verify == Verify::none) {
    return Verdict{0, fmt::format("{}, {} loaded, not compared (verify: none)",
                                  counted(reports.size(), "rank"),
                                  counted(wants, "local shard"))};
  }
  std::vector<std::string> mismatches;
  std::size_t count = 0;
  for (const RankReport& report : reports) {
    if (report.expected.empty() && static_cast<std::size_t>(report.rank) >= expected.size()) {
      if (placement.all.at(report.rank).tensors.empty()) continue;  // nothing to compare
      ++count;
      mismatches.push_back(fmt::format("rank {} sent no digests of the bytes it read itself",
                                       report.rank));
      continue;
    }
    const auto& mine = report.expected.empty() ? expected.at(report.rank) : report.expected;
    const std::size_t shards = placement.all.at(report.rank).tensors.size();
    if (report.digests.size() != shards || mine.size() != shards) {
      ++count;
      mismatches.push_back(fmt::format("rank {} reported {} digests (and {} of the bytes it "
                                       "should have) for its {} local shards",
                                       report.rank, report.digests.size(), mine.size(),
                                       shards));
      continue;
    }
    for (std::size_t w = 0; w < mine.size(); ++w) {
      if (report.digests[w] == mine[w]) continue;
      if (++count <= 10) {
        mismatches.push_back(fmt::format("rank {}: tensor '{}' (local shard) xxh3 {}, {} "
                                         "bytes of xxh3 {}",
                                         report.rank, placement.all[report.rank].tensors[w].tensor,
                                         digest_hex(report.digests[w]),
                                         report.expected.empty() ? "rank 0 sent"
                                                                 : "the files held",
                                         digest_hex(mine[w])));
      }
    }
  }
  const char* source = read_locally ? "the bytes it read from the files" : "the bytes rank 0 sent it";
  if (count == 0) {
    return Verdict{0, fmt::format("{}, {} bit-exact (XXH3-64 of every rank's "
                                  "local shards matches {})",
                                  counted(reports.size(), "rank"),
                                  counted(wants, "local shard"), source)};
  }
  std::string message = fmt::format("{} against {}: ",
                                    counted(count, "local shard mismatch",
                                                    "local shard mismatches"),
                                    read_locally ? "the files' bytes" : "the bytes rank 0 sent");
  for (std::size_t i = 0; i < mismatches.size(); ++i) {
    message += (i ? "; " : "") + mismatches[i];
  }
  return Verdict{exit_status(Errc::internal), message};
}

}  // namespace weightcast::detail
