/**
 * @file load_options.hpp
 * @brief The launcher's `Config` turned into a load's options (`LoadOptions`,
 *        pipeline/loader.hpp). The pipeline takes only those options, never a `Config`.
 */
#pragma once

#include "weightcast/config/config.hpp"
#include "weightcast/pipeline/loader.hpp"

namespace weightcast {

/// @return the options @p config asks for: `chunk_size`, `buffer_depth`, `io_depth`,
///         `timeout`, `direct_io`, `reader`, `destination`, and a digest of discarded
///         tensors where `verify` is `digest`. Never throws.
[[nodiscard]] LoadOptions load_options(const Config& config);

}  // namespace weightcast
