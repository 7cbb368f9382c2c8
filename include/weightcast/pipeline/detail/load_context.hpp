/**
 * @file load_context.hpp
 * @brief What every part of one load's pipeline shares: its inputs, the caller's hooks, the
 *        progress stamp the watchdog reads, and the polling of operations in flight.
 *
 * Internal (includes Boost.Asio; never installed). NOT THREAD SAFE: the read side, the
 * delivery and the stages run on one executor that runs one handler at a time (`load`'s own
 * `io_context`, or a strand for `async_load`), so they share this without locks
 * (docs/DESIGN.md § Pipeline).
 */
#pragma once

#include "weightcast/core/detail/running_time.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace weightcast::detail {

class LocalShards;

struct LoadContext {
  using Clock = std::chrono::steady_clock;

  /// @p executor must run one handler at a time; the references must outlive the context.
  LoadContext(const boost::asio::any_io_executor& executor, const Catalogue& catalogue,
              const Plan& plan, const ArenaLayout& layout, Arena& arena, Device& device,
              Transport& transport, const LoadOptions& options)
      : executor(executor), catalogue(catalogue), plan(plan), layout(layout), arena(arena),
        device(device), transport(transport), options(options) {}

  /// A stage moved: the watchdog's `timeout` counts from here.
  void progressed() { last_progress = running.now(); }
  /// Tells the trace hook that @p stage finished chunk @p c, which it began at @p begin.
  void stage_event(Stage stage, std::size_t c, Clock::time_point begin) const;
  /// Tells the progress hook that chunk @p c has landed (chunks land in plan order).
  void report_progress(std::size_t c);
  /// Polls an operation in flight on the device or transport, every 10 µs at first, then
  /// twice as long each time up to @p cap. Null is complete.
  boost::asio::awaitable<void> wait(
      std::unique_ptr<Pending> pending,
      std::chrono::microseconds cap = std::chrono::microseconds(1000)) const;

  // How late a watchdog wake-up must be to count as time this process did not run.
  static constexpr std::chrono::milliseconds suspended_after{500};

  // How late a completed copy may be noticed: a 16 MiB H2D copy takes ~0.3 ms on PCIe 5, and
  // a 1 ms cap noticed it up to ~0.6 ms late (a slot and the chunk's broadcast held as long;
  // the copy engine meanwhile runs the chunks queued behind it). 100 µs keeps that under a
  // third of a copy for one cudaEventQuery per 100 µs. Rank 0's placed uploads still wait
  // for each copy in turn. (A host device's upload is a memcpy: nothing to poll.)
  static constexpr std::chrono::microseconds upload_poll_cap{100};

  const boost::asio::any_io_executor executor;
  const Catalogue& catalogue;
  const Plan& plan;
  const ArenaLayout& layout;
  Arena& arena;
  Device& device;
  Transport& transport;
  const LoadOptions& options;
  const Clock::time_point started = Clock::now();  // for LoadProgress::seconds
  std::uint64_t bytes_landed = 0;                  // for LoadProgress::bytes_done
  /// `transport: shm`: every rank reads its own boxes from the shard files for this load
  /// (rank 0's decision, the same on every rank: NodeRing::decide); false otherwise.
  bool local_reads = false;
  /// A rank other than 0 with `local_reads`: its own descriptors of the shards.
  const LocalShards* local_files = nullptr;
  // Progress is stamped in the time this process ran: the watchdog's `timeout` leaves out
  // the stretches it was stopped.
  RunningClock running{suspended_after};
  Clock::time_point last_progress = running.now();
};

}  // namespace weightcast::detail
