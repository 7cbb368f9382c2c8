// Chrome trace-event JSON of the pipeline's stage events.
//
// The format is the "JSON Object Format" of the Trace Event Format document (Google, 2016):
// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Perfetto's JSON
// importer and chrome://tracing both read it.
#include "weightcast/pipeline/trace.hpp"

#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <fcntl.h>
#include <ext/stdio_filebuf.h>
#include <ostream>
#include <sstream>

namespace weightcast {
namespace {

// Track ids: tid 0 is avoided because some viewers treat it as "the process itself".
constexpr int tid_of(Stage stage) noexcept { return static_cast<int>(stage) + 1; }

constexpr std::array<Stage, 3> all_stages{Stage::read, Stage::upload, Stage::broadcast};

std::int64_t ns_since_epoch(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

TraceRecorder::TraceRecorder(int rank, std::size_t max_events)
    : _rank(rank), _max_events(max_events) {}

std::function<void(const StageEvent&)> TraceRecorder::hook() {
  return [this](const StageEvent& event) { record(event); };
}

void TraceRecorder::record(const StageEvent& event) {
  if (_events.size() >= _max_events) {
    ++_dropped;
    return;
  }
  // Reserve in steps so a long load does not reallocate per chunk, yet a short one stays small.
  if (_events.size() == _events.capacity()) {
    _events.reserve(std::min(_max_events, std::max<std::size_t>(1024, _events.size() * 2)));
  }
  _events.push_back(Record{ns_since_epoch(event.begin), ns_since_epoch(event.end), event.chunk,
                           event.bytes, event.shard, event.stage});
}

void TraceRecorder::write_to(std::ostream& out) const {
  using nlohmann::ordered_json;
  // One event per line: a multi-GiB checkpoint in small chunks gives a large file, and a
  // line per event keeps it greppable and streams without building a document in memory.
  out << "{\"traceEvents\": [\n";
  bool first = true;
  auto emit = [&](const ordered_json& event) {
    out << (first ? "" : ",\n") << event.dump();
    first = false;
  };
  emit({{"name", "process_name"}, {"ph", "M"}, {"pid", _rank}, {"tid", 0},
        {"args", {{"name", fmt::format("rank {}", _rank)}}}});
  emit({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", _rank}, {"tid", 0},
        {"args", {{"sort_index", _rank}}}});
  for (Stage stage : all_stages) {
    emit({{"name", "thread_name"}, {"ph", "M"}, {"pid", _rank}, {"tid", tid_of(stage)},
          {"args", {{"name", std::string(to_string(stage))}}}});
    // Tracks in pipeline order (read, upload, broadcast) rather than by first event.
    emit({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", _rank}, {"tid", tid_of(stage)},
          {"args", {{"sort_index", tid_of(stage)}}}});
  }
  for (const Record& r : _events) {
    // Microseconds with three decimals: a host memcpy of a small chunk takes a few µs,
    // and whole-microsecond rounding would turn it into a zero-length slice.
    const double ts_us = static_cast<double>(r.begin_ns) / 1e3;
    const double dur_us = static_cast<double>(r.end_ns - r.begin_ns) / 1e3;
    out << (first ? "" : ",\n")
        << fmt::format("{{\"name\": \"chunk {}\", \"cat\": \"{}\", \"ph\": \"X\", "
                       "\"pid\": {}, \"tid\": {}, \"ts\": {:.3f}, \"dur\": {:.3f}, "
                       "\"args\": {{\"chunk\": {}, \"shard\": {}, \"bytes\": {}}}}}",
                       r.chunk, to_string(r.stage), _rank, tid_of(r.stage), ts_us, dur_us,
                       r.chunk, r.shard, r.bytes);
    first = false;
  }
  out << "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": "
      << ordered_json{{"tool", "weightcast"},
                      {"rank", _rank},
                      {"clock", "steady_clock (CLOCK_MONOTONIC), microseconds"},
                      {"events", _events.size()},
                      {"dropped_events", _dropped}}
             .dump()
      << "\n}\n";
}

std::string TraceRecorder::to_json() const {
  std::ostringstream out;
  write_to(out);
  return out.str();
}

void TraceRecorder::write(const std::filesystem::path& path) const {
  // Opened without blocking (a FIFO is refused, not waited on), written whole or not at all
  // (a full file system leaves the previous trace as it was), and streamed through a filebuf
  // that owns a duplicate of the descriptor.
  detail::OutputFile output(path, "the trace file");
  const std::string what = fmt::format("{}: cannot write the trace file", path.string());
  const int fd = ::fcntl(output.fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw system_error(Errc::io, errno, what);
  {
    __gnu_cxx::stdio_filebuf<char> file(fd, std::ios::out | std::ios::binary);
    std::ostream out(&file);
    write_to(out);
    out.flush();
    const bool written = static_cast<bool>(out);
    errno = 0;
    if (file.close() == nullptr || !written) {
      if (errno != 0) throw system_error(Errc::io, errno, what);
      throw Error(Errc::io, what);
    }
  }
  output.commit();
}

std::string with_rank(std::string_view pattern, int rank) {
  constexpr std::string_view placeholder = "{rank}";
  std::string out(pattern);
  for (auto at = out.find(placeholder); at != std::string::npos; at = out.find(placeholder, at)) {
    out.replace(at, placeholder.size(), std::to_string(rank));
  }
  return out;
}

std::filesystem::path trace_path_for_rank(const std::string& path, int rank, int world_size) {
  if (path.find("{rank}") != std::string::npos) return with_rank(path, rank);
  if (world_size <= 1 || rank == 0) return path;
  std::filesystem::path p(path);
  const std::string stem = p.stem().string();
  return p.replace_filename(fmt::format("{}.rank{}{}", stem, rank, p.extension().string()));
}

}  // namespace weightcast
