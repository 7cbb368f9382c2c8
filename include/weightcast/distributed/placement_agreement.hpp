/**
 * @file placement_agreement.hpp
 * @brief The job's placement step: every rank's wants reach rank 0, which checks them all
 *        against the catalogue and sends them back, so every rank plans alike.
 *
 * Runs after the catalogue is shared and before the plan (docs/DESIGN.md § Placement), on every
 * rank of the job in the same order as its other control-plane calls.
 */
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/plan/placement.hpp"

#include <memory>

namespace weightcast {

class ControlPlane;

/**
 * @brief Gathers every rank's wants on rank 0 (over @p control), validates them
 *        (`validate_wants`) and shares them all with every rank.
 * @param mine this rank's wants, with its in-place pointers (they stay here).
 * @param expect_digests whether rank 0 hashes each rank's expected bytes (`verify: digest`).
 * @return null when every rank wants every tensor whole in its arena in the checkpoint's
 *         dtype (today's broadcast of the whole checkpoint: the load runs without a
 *         placement), else the placement to put in `LoadOptions::placement`.
 * @throws Error `config` (78) / `invalid_checkpoint` (65) on rank 0 as `validate_wants`
 *         does (its message names the rank, the tensor and the key; the caller aborts the job
 *         with it, so every rank ends with it); `unavailable` (69) for a malformed message
 *         from a peer; as `ControlPlane::gather` and `share` for a stall or a lost peer.
 */
std::shared_ptr<const LoadPlacement> agree_placement(ControlPlane& control,
                                                     const Catalogue& catalogue,
                                                     RankWants mine, bool expect_digests);

}  // namespace weightcast
