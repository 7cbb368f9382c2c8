/**
 * @file transport.hpp
 * @brief The data plane: broadcasts each chunk from the root rank into every rank's arena.
 *
 * `local` (world size 1) does nothing; `mpi` (host memory) and `nccl` (device memory) come
 * with the multi-rank work (DESIGN.md layer 8). Every rank calls `broadcast` for the same
 * chunks in the same order (the plan), as NCCL and MPI collectives require.
 */
#pragma once

#include "weightcast/pending.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace weightcast {

class Transport {
 public:
  virtual ~Transport() = default;
  /// @return "local", "mpi" or "nccl".
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// @return this rank, 0 ≤ rank < world size.
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// @return the number of ranks.
  [[nodiscard]] virtual int world_size() const noexcept = 0;
  /**
   * @brief Starts broadcasting @p bytes at @p data from @p root to every rank.
   * @param data arena memory: the source on the root, the destination elsewhere.
   * @return null when already complete, else the broadcast in flight.
   */
  virtual std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes,
                                             int root) = 0;
};

/// @return the world-size-1 transport: broadcast is a no-op.
std::unique_ptr<Transport> make_local_transport();

}  // namespace weightcast
