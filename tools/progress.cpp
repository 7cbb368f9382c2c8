// Progress display of `weightcast run`.
#include "progress.hpp"

#include "weightcast/config/config.hpp"
#include "weightcast/core/log.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <sys/ioctl.h>
#include <unistd.h>

namespace weightcast::cli {
namespace {

// 10 Hz: fast enough to look live, slow enough that redrawing never costs the pipeline
// anything measurable (the hook runs on the loader's thread).
constexpr auto bar_interval = std::chrono::milliseconds(100);
// A log line at most every 2 s, so a load of a few seconds does not fill a CI log, and a
// line at least every 30 s while chunks still land, so a crawling load shows it is alive.
constexpr auto line_interval = std::chrono::seconds(2);
constexpr auto heartbeat_interval = std::chrono::seconds(30);
constexpr int bar_cells = 24;
// Room for the shard name on an 80-column terminal after the bar and the figures.
constexpr std::size_t max_shard_name = 32;

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  const auto s = static_cast<long long>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

int percent_of(const LoadProgress& p) {
  if (p.bytes_total == 0) return 100;
  return static_cast<int>(p.bytes_done * 100 / p.bytes_total);
}

}  // namespace

ProgressRenderer::Mode ProgressRenderer::mode_for(std::FILE* out) noexcept {
  return ::isatty(::fileno(out)) == 1 ? Mode::bar : Mode::lines;
}

ProgressRenderer::ProgressRenderer(std::FILE* out, Mode mode, Clock::time_point start,
                                   std::string label)
    : _out(out), _mode(mode), _label(std::move(label)), _last_draw(start) {
  // A bar longer than the terminal wraps, and "\r" then redraws only its last row.
  winsize size{};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &size) == 0 && size.ws_col > 20) _columns = size.ws_col;
}

std::string ProgressRenderer::describe(const LoadProgress& p) {
  const double gbps = p.seconds > 0 ? static_cast<double>(p.bytes_done) / p.seconds / 1e9 : 0;
  const double eta = gbps > 0 ? static_cast<double>(p.bytes_total - p.bytes_done) / (gbps * 1e9)
                              : std::nan("");
  std::string shard = printable(p.shard_name);
  if (shard.size() > max_shard_name) {
    shard = "..." + shard.substr(shard.size() - (max_shard_name - 3));
  }
  return fmt::format("{:3}% {} / {}  {:.2f} GB/s  ETA {}  shard {}/{} {}", percent_of(p),
                     format_bytes(p.bytes_done), format_bytes(p.bytes_total), gbps,
                     format_eta(eta), p.shard + 1, p.shards, shard);
}

void ProgressRenderer::update(const LoadProgress& p, Clock::time_point now) {
  const bool last = p.chunks_done == p.chunks_total;
  if (_mode == Mode::bar) {
    if (!last && _drawn && now - _last_draw < bar_interval) return;
    const int filled = p.bytes_total == 0
                           ? bar_cells
                           : static_cast<int>(p.bytes_done * bar_cells / p.bytes_total);
    // "\r" returns to the line's start; "\x1b[K" erases what a longer previous line left.
    std::string line = fmt::format("[{}{}] {}", std::string(filled, '#'),
                                   std::string(bar_cells - filled, '-'), describe(p));
    // The line is ASCII but for the shard name; cutting inside a UTF-8 sequence only
    // garbles the last character shown.
    if (line.size() >= _columns) line.resize(_columns - 1);
    fmt::print(_out, "\r{}\x1b[K", line);
    std::fflush(_out);
    _drawn = true;
    _last_draw = now;
    return;
  }
  const auto since = now - _last_draw;
  if (since < line_interval) return;
  const int decile = percent_of(p) / 10;
  if (decile <= _last_decile && since < heartbeat_interval) return;
  fmt::print(_out, "{}: {}\n", _label, describe(p));
  std::fflush(_out);
  _last_decile = decile;
  _last_draw = now;
}

void ProgressRenderer::finish() {
  if (_mode == Mode::bar && _drawn) {
    fmt::print(_out, "\n");
    std::fflush(_out);
    _drawn = false;
  }
}

}  // namespace weightcast::cli
