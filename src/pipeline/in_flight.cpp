// The in-flight records' window bookkeeping (weightcast/pipeline/detail/in_flight.hpp).
#include "weightcast/pipeline/detail/in_flight.hpp"

#include <fmt/core.h>

namespace weightcast::detail {

std::byte* InFlight::add_window(std::uint32_t want, std::uint64_t local_offset,
                                std::uint64_t bytes, std::uint64_t capacity,
                                std::vector<std::vector<std::byte>>& spare) {
  // Reused from chunks that landed (at most `broadcasts_in_flight` hold any): a fresh
  // allocation per chunk would zero and fault in its bytes each time.
  if (windows.empty()) {
    if (!spare.empty()) {
      window_memory = std::move(spare.back());
      spare.pop_back();
    }
    if (window_memory.size() < capacity) window_memory.resize(capacity);
  }
  if (_window_used + bytes > window_memory.size()) {
    throw Error(Errc::internal,
                fmt::format("chunk {}'s cast windows exceed {} bytes", chunk, capacity));
  }
  windows.push_back({want, local_offset, bytes, _window_used});
  _window_used += bytes;
  return window_memory.data() + windows.back().at;
}

void InFlight::recycle_windows(std::vector<std::vector<std::byte>>& spare) {
  if (!window_memory.empty()) spare.push_back(std::move(window_memory));
  window_memory.clear();
  windows.clear();
  _window_used = 0;
}

}  // namespace weightcast::detail
