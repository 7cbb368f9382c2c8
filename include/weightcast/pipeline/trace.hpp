/**
 * @file trace.hpp
 * @brief A pipeline trace: every stage's work on every chunk, as Chrome trace-event JSON.
 *
 * The file opens in Perfetto (ui.perfetto.dev) and chrome://tracing. Each rank is a process
 * (`pid` = rank) with one track per stage it runs (`tid` 1 = read, 2 = upload,
 * 3 = broadcast, named by `thread_name` metadata events), and each chunk is one complete
 * slice (`"ph": "X"`) per stage with `ts` and `dur` in microseconds and
 * `args: {chunk, shard, bytes}`. Seeing the read track run ahead of the upload and broadcast
 * tracks is seeing the pipeline overlap; a gap on the broadcast track while reads are slow
 * says the disk is the bottleneck.
 *
 * Timestamps are `std::chrono::steady_clock` (CLOCK_MONOTONIC) in microseconds, so the
 * traces of ranks on one host share a time base and can be merged by concatenating their
 * `traceEvents` arrays.
 *
 * ```cpp
 * weightcast::TraceRecorder trace(rank);
 * options.on_stage_event = trace.hook();
 * auto result = weightcast::load(catalogue, device, transport, options);
 * trace.write("load.trace.json");
 * ```
 */
#pragma once

#include "weightcast/pipeline/loader.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast {

/**
 * @brief Collects `StageEvent`s in memory and writes them as Chrome trace-event JSON.
 *
 * Memory is bounded: one 40-byte record per chunk per stage, and at most `max_events`
 * records (further events are counted, not kept, and the count is written in the trace's
 * `otherData.dropped_events`).
 * @note Not thread-safe: the loader calls its hook from the loader's one thread.
 */
class TraceRecorder {
 public:
  /// Default bound on kept events: 1,048,576 records, 40 MiB.
  static constexpr std::size_t default_max_events = std::size_t{1} << 20;

  /**
   * @param rank the `pid` of this rank's events (and its process name, "rank R").
   * @param max_events events kept at most; later ones are dropped and counted.
   */
  explicit TraceRecorder(int rank = 0, std::size_t max_events = default_max_events);

  /// @return a hook for `LoadOptions::on_stage_event` that records into this recorder.
  /// @note The recorder must outlive every load that uses the hook.
  [[nodiscard]] std::function<void(const StageEvent&)> hook();

  /// Keeps @p event (or counts it as dropped when `max_events` are already kept).
  void record(const StageEvent& event);

  /// @return the number of events kept (at most `max_events`).
  [[nodiscard]] std::size_t size() const noexcept { return _events.size(); }
  /// @return the events dropped past `max_events`.
  [[nodiscard]] std::uint64_t dropped() const noexcept { return _dropped; }

  /// @return the whole trace as one JSON object `{"traceEvents": [...], ...}`.
  [[nodiscard]] std::string to_json() const;

  /**
   * @brief Writes `to_json()` to @p path (replacing the file), streaming event by event.
   *
   * A regular file is replaced whole or not at all (detail::OutputFile: a temporary file
   * beside it, renamed over it once written and fsynced): a write that fails, on a full file
   * system say, leaves the previous file as it was. A symbolic link is written through.
   * @throws Error `io` (74) naming @p path when it cannot be created or written; `usage` (64)
   *         when @p path holds a NUL byte (nothing is created).
   */
  void write(const std::filesystem::path& path) const;

 private:
  // A compact record: times as steady_clock nanoseconds since its epoch.
  struct Record {
    std::int64_t begin_ns;
    std::int64_t end_ns;
    std::uint64_t chunk;
    std::uint64_t bytes;
    std::uint32_t shard;
    Stage stage;
  };
  void write_to(std::ostream& out) const;

  int _rank;
  std::size_t _max_events;
  std::vector<Record> _events;
  std::uint64_t _dropped = 0;
};

/// @return @p pattern with every `{rank}` replaced by @p rank: the placeholder the `trace`
///         path and `--report PATH` share ("r{rank}.json" → "r3.json").
std::string with_rank(std::string_view pattern, int rank);

/**
 * @brief The trace file of @p rank for the configured `trace` path @p path.
 *
 * `{rank}` in @p path is replaced by the rank. Otherwise, when @p world_size > 1, ranks
 * other than 0 insert `.rankR` before the extension (`load.json` → `load.rank3.json`), so
 * ranks sharing a file system do not overwrite each other; rank 0 keeps @p path.
 */
std::filesystem::path trace_path_for_rank(const std::string& path, int rank, int world_size);

}  // namespace weightcast
