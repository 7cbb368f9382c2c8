// What `weightcast run` shows while it loads: a live bar on a terminal, a line now and then
// in a log file. Driven by `LoadOptions::on_progress`; rank 0 only.
#pragma once

#include "weightcast/pipeline/loader.hpp"

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

namespace weightcast::cli {

/// Renders `LoadProgress` on a stream (stderr in `run`).
class ProgressRenderer {
 public:
  using Clock = std::chrono::steady_clock;

  /// How the progress appears.
  enum class Mode {
    bar,    ///< A terminal: one line redrawn in place (`\r`), at most 10 times a second.
    lines,  ///< A file or pipe: a plain line at each further 10% done, at most one per 2 s
            ///< (none for a load that ends sooner), and at least one per 30 s while chunks
            ///< still land (it is driven by chunk completions: a load where none lands
            ///< prints nothing until the `timeout` error).
  };

  /// @return `bar` when @p out is a terminal (`isatty`), else `lines`.
  static Mode mode_for(std::FILE* out) noexcept;

  /// @param out where to write (not owned). @param mode how. @param start the load's start.
  /// @param label what starts each line in `lines` mode (e.g. "weightcast[rank 0]", as the
  ///        log lines of a rank among several).
  ProgressRenderer(std::FILE* out, Mode mode, Clock::time_point start = Clock::now(),
                   std::string label = "weightcast");

  /// Shows @p progress if the rate limit allows (the last chunk is always drawn on a bar).
  void update(const LoadProgress& progress) { update(progress, Clock::now()); }
  /// As `update`, at time @p now (tests drive the clock).
  void update(const LoadProgress& progress, Clock::time_point now);

  /// Ends the bar's line so the summary or an error message starts on a fresh line.
  void finish();

  /// @return the text of one progress line (no `\r`, no newline): percent, bytes done of
  ///         total, GB/s (1 GB = 1e9 B), ETA, the current shard.
  static std::string describe(const LoadProgress& progress);

 private:
  std::FILE* _out;
  Mode _mode;
  std::string _label;
  Clock::time_point _last_draw;
  std::size_t _columns = 80;    // bar mode: the terminal's width (80 when unknown)
  bool _drawn = false;          // a bar line is on screen (finish must end it)
  int _last_decile = 0;         // lines mode: the 10% step of the last line
};

}  // namespace weightcast::cli
