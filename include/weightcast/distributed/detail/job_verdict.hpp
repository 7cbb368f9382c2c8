/**
 * @file distributed/detail/job_verdict.hpp
 * @brief Rank 0's verdict on a job: every rank's digests against what rank 0 has.
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/control/control_plane.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"

#include <cstdint>
#include <vector>

namespace weightcast::detail {

/// Rank 0: every rank's digests (@p reports, indexed by rank) against rank 0's own, tensor by
/// tensor of @p catalogue; @p seconds is the time rank 0's digests took, for the message.
/// @return status 0 and "N ranks × M tensors bit-exact ..." (or "not compared" under
///         `Verify::none`); else `internal` (70)'s status and the first mismatches, by tensor.
Verdict judge(const std::vector<RankReport>& reports, const Catalogue& catalogue, Verify verify,
              double seconds);

/// Rank 0, a placed load: every rank's digests of its local shards against @p expected, what
/// rank 0 hashed of each rank's bytes as they passed through its staging ring (indexed by
/// rank, then by the rank's wants in @p placement), or, for a rank whose report carries its
/// own (`RankReport::expected`: @p read_locally, local reads over the node ring), those.
/// @return as `judge` does, by local shard.
Verdict judge_placed(const std::vector<RankReport>& reports, const LoadPlacement& placement,
                     const std::vector<std::vector<std::uint64_t>>& expected, Verify verify,
                     bool read_locally = false);

}  // namespace weightcast::detail
