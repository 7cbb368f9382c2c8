/**
 * @file memory_kind.hpp
 * @brief Whether an address is host memory or CUDA device memory.
 */
#pragma once

namespace weightcast {

/// Where an arena or a destination lives.
enum class MemoryKind { host, cuda };

}  // namespace weightcast
