// The load's entry points on Boost.Asio: the blocking `load` on an io_context of its own and
// `async_load` on a strand of the caller's executor, both running one Pipeline.
#include "weightcast/pipeline/async_load.hpp"

#include "weightcast/pipeline/detail/pipeline.hpp"
#include "weightcast/pipeline/detail/placed_plan.hpp"
#include "weightcast/core/error.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <spdlog/spdlog.h>

#include <exception>
#include <optional>

namespace weightcast {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;

namespace {

// Leaks @p memory, saying so: device work the load cannot end (NCCL kernels on a
// communicator handed in, which only its owner can abort) may still write or read it, and
// freeing it would let the next allocation receive those writes.
void keep_forever(std::shared_ptr<Arena> memory, const char* what) noexcept {
  if (!memory || memory->bytes() == 0) return;
  spdlog::warn("{} ({} bytes of {}) is left allocated: NCCL work on the communicator handed in "
               "may still touch it until its owner aborts the communicator",
               what, memory->bytes(), memory->kind() == MemoryKind::cuda ? "device memory"
                                                                          : "host memory");
  static_cast<void>(new std::shared_ptr<Arena>(std::move(memory)));
}

// The load on the calling coroutine's executor, which must run one handler at a time (the
// stages share the pipeline's state without locks): `load`'s own io_context, or a strand.
awaitable<LoadResult> load_serially(Catalogue catalogue, Device& device, Transport& transport,
                                    LoadOptions options) {
  auto executor = co_await asio::this_coro::executor;
  check_load_options(options);
  LoadResult result;
  result.catalogue = std::move(catalogue);
  const bool discard = options.destination == Destination::discard;
  check_destination(options.destination, transport.world_size());
  Plan plan;
  std::vector<std::byte*> want_data;
  if (options.placement) {
    plan = detail::plan_placed_load(result, device, transport, options);
    want_data = result.want_data;
  } else {
    result.layout = layout_arena(result.catalogue, options.tensor_alignment);
    plan = make_plan(result.catalogue, result.layout, options.chunk_bytes);
    result.arena =
        discard ? make_host_arena(0) : device.allocate_arena(result.layout.arena_bytes);
  }

  // The caller's queued GPU work on the destinations comes first (LoadOptions::cuda_stream).
  device.order_after(options.cuda_stream);
  transport.order_after(options.cuda_stream);
  const auto start = Clock::now();
  std::optional<detail::Pipeline> running;
  detail::Pipeline& pipeline =
      running.emplace(executor, result.catalogue, plan, result.layout, *result.arena, device,
                      transport, options, std::move(want_data));
  std::exception_ptr failure;
  try {
    co_await pipeline.run();
    pipeline.finish_hashing();
  } catch (...) {
    failure = pipeline.first_failure() ? pipeline.first_failure() : std::current_exception();
  }
  result.stats.reader = pipeline.reader_name();
  result.stats.io_mode = pipeline.io_mode();
  if (transport.node_ring() != nullptr) {
    result.stats.node_reads = pipeline.local_reads() ? "local" : "ring";
  }
  pipeline.report(result);
  pipeline.shut_down();
  if (failure) {
    // The pipeline's operations in flight end with it (an abandoned nccl group aborts its
    // communicator and drains the comm stream); only then is it known whether device work
    // may still touch the arena and the send regions.
    std::shared_ptr<Arena> device_sends = pipeline.take_device_sends();
    running.reset();
    if (transport.may_still_touch_memory()) {
      keep_forever(std::move(result.arena), "the arena");
      keep_forever(std::move(device_sends), "rank 0's send regions");
    }
    std::rethrow_exception(failure);
  }
  // The data is ready on the caller's stream (its later work runs after every write).
  device.order_before(options.cuda_stream);
  transport.order_before(options.cuda_stream);

  result.stats.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.stats.bytes = plan.total_bytes;
  if (result.placed) {
    result.stats.bytes = 0;
    for (std::size_t w = 0; w < result.wants.tensors.size(); ++w) {
      result.stats.bytes += local_bytes(*result.local(w).info, result.wants.tensors[w]);
    }
  }
  result.stats.chunks = plan.chunks.size();
  result.stats.staging_bytes = pipeline.staging_bytes();
  result.stats.device = std::string(device.name());
  result.stats.transport = std::string(transport.name());
  co_return result;
}

}  // namespace

awaitable<LoadResult> async_load(Catalogue catalogue, Device& device, Transport& transport,
                                 LoadOptions options) {
  // A trainer's executor may run handlers on several threads (an io_context run by a thread
  // pool): a strand of it keeps the stages to one at a time.
  co_return co_await asio::co_spawn(
      asio::make_strand(co_await asio::this_coro::executor),
      load_serially(std::move(catalogue), device, transport, std::move(options)), use_awaitable);
}

LoadResult load(Catalogue catalogue, Device& device, Transport& transport,
                const LoadOptions& options) {
  asio::io_context context(1);
  std::optional<LoadResult> result;
  std::exception_ptr failure;
  asio::co_spawn(context, load_serially(std::move(catalogue), device, transport, options),
                 [&](std::exception_ptr e, LoadResult r) {
                   if (e) {
                     failure = e;
                   } else {
                     result.emplace(std::move(r));
                   }
                 });
  context.run();
  if (failure) std::rethrow_exception(failure);
  if (!result) throw Error(Errc::internal, "the load ended without a result");
  return std::move(*result);
}

}  // namespace weightcast
