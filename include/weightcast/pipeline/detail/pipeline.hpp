/**
 * @file pipeline.hpp
 * @brief The pipeline of one load: a read side (rank 0) and a delivery, joined by the stage
 *        coroutines that hand chunks between them in plan order.
 *
 * Internal (includes Boost.Asio; never installed). One `Pipeline` runs one load's stages as
 * coroutines on one executor that runs one handler at a time (`load`'s own `io_context`, or a
 * strand for `async_load`): the stages share its state without locks. What rank 0 reads is
 * the `ReadSide`'s (read_side.hpp); what a chunk becomes on each rank is the `Delivery`'s
 * (delivery.hpp: broadcast or placed); the pipeline owns the hand-offs between the stages,
 * what is in flight between them (in_flight.hpp), and the watchdog:
 *
 * - `stages.cpp`: the upload, upload completion, broadcast and landing stages and `run`,
 *   which joins them with the read side's read and completion stages;
 * - `watchdog.cpp`: the watchdog (`timeout`, `LoadOptions::stop`).
 */
#pragma once

#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/detail/delivery.hpp"
#include "weightcast/pipeline/detail/in_flight.hpp"
#include "weightcast/pipeline/detail/load_context.hpp"
#include "weightcast/pipeline/detail/node_ring_delivery.hpp"
#include "weightcast/pipeline/detail/read_side.hpp"
#include "weightcast/pipeline/loader.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

namespace weightcast::detail {

class Pipeline {
 public:
  using Clock = std::chrono::steady_clock;
  /// Chunk indices handed from one stage to the next, in plan order.
  using IndexChannel =
      boost::asio::experimental::channel<void(boost::system::error_code, std::size_t)>;

  /// @p executor must run one handler at a time; the references must outlive the pipeline.
  /// @p want_data: a placed load's destinations, one per want of this rank
  /// (`LoadResult::want_data`); empty otherwise.
  Pipeline(const boost::asio::any_io_executor& executor, const Catalogue& catalogue,
           const Plan& plan, const ArenaLayout& layout, Arena& arena, Device& device,
           Transport& transport, const LoadOptions& options,
           std::vector<std::byte*> want_data = {});

  /// Runs the load: every stage of this rank, joined (stages.cpp).
  boost::asio::awaitable<void> run();

  /// @return the first failure of any stage (the cause; later ones are its cancellations).
  [[nodiscard]] std::exception_ptr first_failure() const noexcept { return _first_failure; }

  [[nodiscard]] std::uint64_t staging_bytes() const noexcept {
    return _read ? _read->staging_bytes() : 0;
  }
  [[nodiscard]] std::string reader_name() const {
    return _read ? _read->reader_name() : std::string();
  }
  /// How rank 0 read the shards (ReadSide::io_mode); empty elsewhere.
  [[nodiscard]] std::string io_mode() const { return _read ? _read->io_mode() : std::string(); }
  /// True where this load's ranks each read their own boxes from the files (`transport:
  /// shm`, local reads: decide_reads), the same on every rank.
  [[nodiscard]] bool local_reads() const noexcept { return _load.local_reads; }
  /// Writes what the delivery reports (digests) into @p result; after `run`, failed or not.
  void report(LoadResult& result) const { _delivery->report(result); }
  /// Waits for the delivery's device read-backs still hashing; call after `run` and before
  /// `report`. @throws what a read-back threw (`Arena::read_back`'s errors).
  void finish_hashing() { _delivery->finish_hashing(); }

  /// Frees the reader before the ring: in-flight reads must finish before slots go away.
  void shut_down() noexcept {
    if (_read) _read->shut_down();
  }
  /// Hands over the device memory the transport's sends read (rank 0's send regions of a
  /// placed load over nccl; null otherwise), so the caller can keep it past the pipeline when
  /// the transport may still touch it after a failure (`Transport::may_still_touch_memory`).
  [[nodiscard]] std::shared_ptr<Arena> take_device_sends() noexcept {
    return _delivery->take_device_sends();
  }

 private:
  // ---- the stages (stages.cpp) ----
  boost::asio::awaitable<void> upload_stage();
  boost::asio::awaitable<void> upload_completion_stage();
  boost::asio::awaitable<void> broadcast_stage();
  boost::asio::awaitable<void> landing_stage();
  boost::asio::awaitable<void> guarded(boost::asio::awaitable<void> stage);
  // ---- how a node ring load reads (local_reads.cpp) ----
  void decide_reads(NodeRing& ring);

  // ---- the watchdog (watchdog.cpp) ----
  boost::asio::awaitable<void> watchdog();
  [[nodiscard]] static Error stopped();
  [[nodiscard]] std::chrono::microseconds landing_poll_cap() const noexcept;

  // Chunks whose broadcast may be posted at once (see broadcast_stage). Two let one chunk's
  // broadcast travel while the next is posted, so the link never idles between chunks; a
  // third finds the link busy with the first two and gains nothing (bench/RESULTS.md).
  // In flight at once: the one the landing stage waits on, those queued in `_to_land`, and
  // the one whose hand-over is blocked; hence `_to_land`'s capacity of this minus 2.
  static constexpr std::size_t broadcasts_in_flight = 2;
  static_assert(broadcasts_in_flight >= 2);

  // Declared in the order they must outlive each other: the ring (in `_read`) outlives
  // every lease (in the delivery and in flight); the delivery's send regions outlive the
  // exchanges in flight (`_posted`), which are aborted and drained when destroyed.
  LoadContext _load;
  std::optional<ReadSide> _read;          // rank 0
  std::optional<LocalShards> _local_files;  // another rank's own shards, with local reads
  std::unique_ptr<Delivery> _delivery;
  IndexChannel _to_broadcast;             // uploaded chunks, plan order
  IndexChannel _to_complete;              // uploads queued, plan order
  PlanOrder<Uploading> _uploading{"chunks reached upload completion out of order"};
  IndexChannel _to_land;                  // posted chunks, plan order
  PlanOrder<InFlight> _posted{"broadcasts landed out of order"};
  boost::asio::steady_timer _watchdog_timer;
  bool _finished = false;
  std::optional<std::size_t> _landing;  // the chunk whose broadcast the landing stage awaits
  std::exception_ptr _first_failure;
  // LoadOptions::stop: the callback posts a wake-up for the watchdog, which holds `_alive`
  // weakly (a pipeline already destroyed is not touched).
  std::shared_ptr<Pipeline*> _alive = std::make_shared<Pipeline*>(this);
  std::optional<std::stop_callback<std::function<void()>>> _stop_callback;
};

}  // namespace weightcast::detail
