/**
 * @file placed_plan.hpp
 * @brief A placed load's plan, arena and destinations, from `LoadOptions::placement`.
 *
 * Internal (no Asio; never installed).
 */
#pragma once

#include "weightcast/pipeline/loader.hpp"

namespace weightcast::detail {

/// A placed load's plan, arena and destinations (`result.wants`, `want_tensors`, `want_data`,
/// `arena`), after checking `options.placement` against the catalogue, the device and the
/// transport. @throws Error `config` (78) for a placement this load cannot deliver (a
/// discarded load, an in-place destination without memory, memory of another kind than the
/// device's or the transport's, a cast on a device), as `validate_wants` does for the wants.
Plan plan_placed_load(LoadResult& result, Device& device, Transport& transport,
                      const LoadOptions& options);

}  // namespace weightcast::detail
