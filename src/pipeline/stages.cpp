// The pipeline's stages: upload, upload completion, broadcast and landing, as coroutines on one
// executor, joined by `run` with the read side's read and completion stages
// (weightcast/pipeline/detail/pipeline.hpp). What each chunk becomes is the delivery's; these
// only hand chunks on in plan order and keep what is in flight alive until it completes.
#include "weightcast/pipeline/detail/pipeline.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"

#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using namespace asio::experimental::awaitable_operators;

Pipeline::Pipeline(const asio::any_io_executor& executor, const Catalogue& catalogue,
                   const Plan& plan, const ArenaLayout& layout, Arena& arena, Device& device,
                   Transport& transport, const LoadOptions& options,
                   std::vector<std::byte*> want_data)
    : _load(executor, catalogue, plan, layout, arena, device, transport, options),
      _delivery(options.placement            ? make_placed_delivery(_load, std::move(want_data))
                : transport.node_ring() != nullptr ? make_node_ring_delivery(_load)
                                                   : make_broadcast_delivery(_load)),
      _to_broadcast(executor, std::max(options.buffer_depth,
                                       static_cast<std::uint32_t>(setting::buffer_depth.min))),
      _to_complete(executor, 1),
      _to_land(executor, broadcasts_in_flight - 2),
      _watchdog_timer(executor) {}

awaitable<void> Pipeline::run() {
  const LoadOptions& options = _load.options;
  if (options.stop.stop_requested()) throw stopped();
  if (options.stop.stop_possible()) {
    // Runs on the thread that requests the stop: only wake the watchdog, on the executor.
    // The handler may run after this pipeline is gone (a stop as the load ends): it holds
    // a weak reference, and the pipeline is destroyed on the executor too.
    std::function<void()> wake = [executor = _load.executor, alive = std::weak_ptr(_alive)] {
      asio::post(executor, [alive] {
        if (auto self = alive.lock()) (*self)->_watchdog_timer.cancel();
      });
    };
    _stop_callback.emplace(options.stop, std::move(wake));
  }
  // How this load reads is decided first: a placed delivery hashes differently with local
  // reads (each rank its own expected bytes). A plan without chunks reads nothing: every
  // rank has the same plan, so no rank waits for a decision.
  if (NodeRing* ring = _load.transport.node_ring(); ring != nullptr && !_load.plan.chunks.empty()) {
    decide_reads(*ring);
  }
  _delivery->start();
  if (_load.plan.chunks.empty()) co_return;
  if (_load.transport.rank() == 0) {
    _read.emplace(_load, _delivery->read_policy());
    _delivery->staging_ready(_read->ring());
    _read->open();
    co_await (guarded(_read->read_stage()) && guarded(_read->completion_stage()) &&
              guarded(upload_stage()) && guarded(upload_completion_stage()) &&
              guarded(broadcast_stage()) && guarded(landing_stage()) && guarded(watchdog()));
  } else {
    co_await (guarded(broadcast_stage()) && guarded(landing_stage()) && guarded(watchdog()));
  }
}

// Upload stage: wait for the slot's read, have the delivery queue the chunk's copies, and
// hand the chunk to the completion stage without waiting for them: the next chunk's copies
// are queued behind them on the copy stream (up to three chunks: one being waited for, one
// in `_to_complete`, one being handed over), so the copy engine never idles while a poll
// notices a completion.
awaitable<void> Pipeline::upload_stage() {
  for (std::size_t c = 0; c < _load.plan.chunks.size(); ++c) {
    SlotLease lease = co_await _read->next_read();
    const auto upload_begin = Clock::now();
    const Slot& slot = _read->slot(lease.index());
    Uploading uploading = co_await _delivery->upload(c, std::move(lease), slot);
    uploading.chunk = c;
    uploading.begin = upload_begin;
    _uploading.push(std::move(uploading));
    co_await _to_complete.async_send(boost::system::error_code{}, c, use_awaitable);
  }
}

// Upload completion stage: waits, in plan order, for each chunk's copies, frees its slot and
// hands the chunk to the broadcast stage, which posts it with no stream wait.
awaitable<void> Pipeline::upload_completion_stage() {
  for (std::size_t c = 0; c < _load.plan.chunks.size(); ++c) {
    const std::size_t issued = co_await _to_complete.async_receive(use_awaitable);
    if (issued != c) throw Error(Errc::internal, "chunks reached upload completion out of order");
    // A reference into the queue stays valid while the upload stage pushes behind it.
    Uploading& uploading = _uploading.front(c);
    for (auto& copy : uploading.copies) {
      co_await _load.wait(std::move(copy), LoadContext::upload_poll_cap);
    }
    _load.progressed();
    _load.stage_event(Stage::upload, c, uploading.begin);
    // The lease ends here: the slot is free again only now that its upload is complete.
    static_cast<void>(_uploading.take(c));
    co_await _to_broadcast.async_send(boost::system::error_code{}, c, use_awaitable);
  }
}

// Broadcast stage: every rank posts each chunk's broadcast (or exchange), in plan order,
// and hands it to the landing stage. Posting waits for that hand-over, so at most
// `broadcasts_in_flight` are posted at once: the next chunk's broadcast is already queued
// when one completes, and no rank idles between chunks while a poll notices the completion
// (MPI and NCCL both allow several collectives in flight, posted in the same order on every
// rank).
awaitable<void> Pipeline::broadcast_stage() {
  const bool root = _load.transport.rank() == 0;
  for (std::size_t c = 0; c < _load.plan.chunks.size(); ++c) {
    if (root) {
      const std::size_t uploaded = co_await _to_broadcast.async_receive(use_awaitable);
      if (uploaded != c) throw Error(Errc::internal, "chunks reached broadcast out of order");
    }
    const auto broadcast_begin = Clock::now();
    InFlight posted = _delivery->post(c, root);
    posted.chunk = c;
    posted.begin = broadcast_begin;
    _posted.push(std::move(posted));
    co_await _to_land.async_send(boost::system::error_code{}, c, use_awaitable);
  }
}

// Landing stage: waits for each posted broadcast in plan order and hands its chunk to the
// delivery as landed. It runs beside the broadcast stage so that a completion is seen as
// soon as it happens, not when rank 0's next chunk is ready to post; polling it also drives
// the transport's progress (MPI progresses a non-blocking collective only inside MPI calls)
// while rank 0 waits on its reads.
awaitable<void> Pipeline::landing_stage() {
  for (std::size_t c = 0; c < _load.plan.chunks.size(); ++c) {
    const std::size_t posted = co_await _to_land.async_receive(use_awaitable);
    if (posted != c) throw Error(Errc::internal, "broadcasts landed out of order");
    // The slot, packed slices and windows stay alive until the exchange has completed.
    InFlight in_flight = _posted.take(c);
    _landing = c;
    co_await _load.wait(std::move(in_flight.pending), landing_poll_cap());
    _landing.reset();
    if (_read) _read->sent(c);
    _delivery->landed(in_flight);
  }
  // The last stage to finish ends the watchdog (`||` would not cancel it on failure:
  // it waits for one success; `&&` cancels every operand as soon as one fails).
  _finished = true;
  _watchdog_timer.cancel();
}

// Records the first stage failure. When one stage throws, the awaitable operators cancel
// the others and rethrow whichever operand comes first, which may be a cancellation.
awaitable<void> Pipeline::guarded(awaitable<void> stage) {
  try {
    co_await std::move(stage);
  } catch (...) {
    if (!_first_failure) _first_failure = std::current_exception();
    throw;
  }
}

}  // namespace weightcast::detail
