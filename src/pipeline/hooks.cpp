// What the caller's hooks hear from the pipeline: tensors ready (LoadOptions::on_tensor_ready),
// each stage's end of a chunk (on_stage_event) and the load's progress (on_progress).
#include "weightcast/pipeline/detail/pipeline.hpp"

namespace weightcast::detail {

// Chunk `c`'s broadcast (begun at `begin`) has completed on this rank: its bytes are in
// the arena; tensors whose last piece it carried are ready.
void Pipeline::chunk_landed(std::size_t c, Clock::time_point begin) {
  const Chunk& chunk = _plan.chunks[c];
  _last_progress = _running.now();
  stage_event(Stage::broadcast, c, begin);
  for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
    const std::uint32_t t = _plan.pieces[chunk.first_piece + p].tensor;
    if (++_landed[t] == _plan.tensor_piece_counts[t]) tensor_ready(t);
  }
  report_progress(c);
}

// Tells the trace hook that `stage` finished chunk `c`, which it began at `begin`.
void Pipeline::stage_event(Stage stage, std::size_t c, Clock::time_point begin) const {
  if (!_options.on_stage_event) return;
  const Chunk& chunk = _plan.chunks[c];
  _options.on_stage_event(StageEvent{stage, c, chunk.shard, chunk.bytes, begin, Clock::now()});
}

// Tells the progress hook that chunk `c` has landed (chunks land in plan order).
void Pipeline::report_progress(std::size_t c) {
  const Chunk& chunk = _plan.chunks[c];
  _bytes_landed += chunk.bytes;
  if (!_options.on_progress) return;
  const ShardInfo& shard = _catalogue.shards[chunk.shard];
  _options.on_progress(LoadProgress{
      _bytes_landed, _plan.total_bytes, c + 1, _plan.chunks.size(), chunk.shard,
      static_cast<std::uint32_t>(_catalogue.shards.size()), shard.name,
      std::chrono::duration<double>(Clock::now() - _started).count()});
}

void Pipeline::announce_zero_size_tensors() {
  if (_placement) {
    for (std::uint32_t w = 0; w < _want_left.size(); ++w) {
      if (_want_left[w] == 0) want_ready(w);
    }
    return;
  }
  for (std::uint32_t t = 0; t < _catalogue.tensors.size(); ++t) {
    if (_plan.tensor_piece_counts[t] == 0) tensor_ready(t);
  }
}

void Pipeline::tensor_ready(std::uint32_t t) {
  if (!_options.on_tensor_ready) return;
  const TensorInfo& info = _catalogue.tensors[t];
  std::byte* data = info.bytes == 0 || discarding()
                        ? nullptr
                        : _arena.data() + _layout.tensor_offsets[t];
  _options.on_tensor_ready(TensorView{&info, data, _arena.kind()});
}

}  // namespace weightcast::detail
