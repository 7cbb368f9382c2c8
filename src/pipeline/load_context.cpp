// What the caller's hooks hear from the pipeline (each stage's end of a chunk, the load's
// progress) and the polling of operations in flight, shared by the read side, the delivery
// and the stages (weightcast/pipeline/detail/load_context.hpp).
#include "weightcast/pipeline/detail/load_context.hpp"

#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace weightcast::detail {

namespace asio = boost::asio;

void LoadContext::stage_event(Stage stage, std::size_t c, Clock::time_point begin) const {
  if (!options.on_stage_event) return;
  const Chunk& chunk = plan.chunks[c];
  options.on_stage_event(StageEvent{stage, c, chunk.shard, chunk.bytes, begin, Clock::now()});
}

void LoadContext::report_progress(std::size_t c) {
  const Chunk& chunk = plan.chunks[c];
  bytes_landed += chunk.bytes;
  if (!options.on_progress) return;
  const ShardInfo& shard = catalogue.shards[chunk.shard];
  options.on_progress(LoadProgress{
      bytes_landed, plan.total_bytes, c + 1, plan.chunks.size(), chunk.shard,
      static_cast<std::uint32_t>(catalogue.shards.size()), shard.name,
      std::chrono::duration<double>(Clock::now() - started).count()});
}

asio::awaitable<void> LoadContext::wait(std::unique_ptr<Pending> pending,
                                        std::chrono::microseconds cap) const {
  if (!pending) co_return;
  asio::steady_timer timer(executor);
  auto interval = std::chrono::microseconds(10);
  while (!pending->test()) {
    timer.expires_after(interval);
    co_await timer.async_wait(asio::use_awaitable);
    interval = std::min(interval * 2, cap);
  }
}

}  // namespace weightcast::detail
