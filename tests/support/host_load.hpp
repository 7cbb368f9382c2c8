// Loads that must fail: a catalogue loaded into host memory (host device, local transport)
// after its shard changed under it.
#pragma once

#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <cstdint>

namespace weightcast::test {

/// Truncates shard 0 of @p catalogue to @p file_bytes and makes the catalogue agree, so that
/// the load passes its size and time checks and the reader itself meets the end of the file.
void truncate_shard(Catalogue& catalogue, std::uint64_t file_bytes);

/// Loads @p catalogue into host memory (make_host_device, make_local_transport) with
/// @p options; the load must throw weightcast::Error. FAILs the test when it succeeds.
/// @return the Error the load threw.
Error expect_host_load_error(const Catalogue& catalogue, const LoadOptions& options = {});

}  // namespace weightcast::test
