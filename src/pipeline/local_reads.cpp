// How a load over the node ring reads: through rank 0's shared staging ring, or every rank
// its own boxes from the shard files, where they are in the page cache
// (docs/DESIGN.md § Staging, "Local reads"). Rank 0 decides; every rank learns the same answer.
#include "weightcast/pipeline/detail/pipeline.hpp"

#include "weightcast/core/error.hpp"
#include "weightcast/io/detail/shard_files.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <unistd.h>

namespace weightcast::detail {

namespace {

// True when every shard the plan reads is at least `ReadSide::mapped_fraction` in the page
// cache, as rank 0's probe finds it (cachestat, else RWF_NOWAIT samples, which need no write
// access: shard_files.hpp). A shard that cannot be opened or probed is not resident: the
// ring's reads then say what is wrong with it.
bool resident(const LoadContext& load) {
  std::vector<std::uint8_t> read(load.catalogue.shards.size(), 0);
  for (const Chunk& chunk : load.plan.chunks) read[chunk.shard] = 1;
  for (std::uint32_t f = 0; f < load.catalogue.shards.size(); ++f) {
    if (read[f] == 0) continue;
    const ShardInfo& shard = load.catalogue.shards[f];
    const int fd = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const double fraction = page_cache_fraction(fd, shard.file_bytes);
    ::close(fd);
    if (fraction < ReadSide::mapped_fraction) return false;
  }
  return true;
}

}  // namespace

// Local reads need host memory (a rank's `pread` lands in its destination) and the page
// cache (`direct_io: on` asks to bypass it); rank 0 takes them only where every shard is
// resident — cold, one O_DIRECT reader streaming into the ring is faster than N ranks
// seeking — and every other rank could open every shard itself. Its decision travels in the
// ring's header, so every rank takes the same path. The waits are 100 ms steps bounded by
// `timeout`, looking at the load's stop between them.
void Pipeline::decide_reads(NodeRing& ring) {
  const std::uint32_t load = ring.next_load();
  const LoadOptions& options = _load.options;
  const bool possible = options.direct_io != DirectIo::on && _load.device.name() == "host";
  const auto step = std::chrono::milliseconds(100);
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  auto check_time = [&](const char* waiting) {
    if (options.stop.stop_requested()) throw stopped();
    if (std::chrono::steady_clock::now() > deadline) {
      throw Error(Errc::timeout, fmt::format("transport shm: {} within {} ms (timeout)",
                                             waiting, options.timeout.count()));
    }
  };
  bool local = false;
  if (_load.transport.rank() == 0) {
    local = possible && resident(_load);
    std::optional<bool> every;
    while (!(every = ring.votes(load, step))) {
      check_time("not every local rank said whether it can open the shards");
    }
    local = local && *every;
    ring.decide(load, local);
  } else {
    if (possible) {
      try {
        _local_files.emplace(_load.catalogue);
      } catch (const Error& e) {
        spdlog::debug("{}; this rank copies its boxes out of rank 0's node ring", e.what());
      }
    }
    ring.vote(load, _local_files.has_value());
    std::optional<bool> decided;
    while (!(decided = ring.decision(load, step))) {
      check_time("rank 0 did not say how this load reads");
    }
    local = *decided;
    if (!local) _local_files.reset();
    _load.local_files = _local_files ? &*_local_files : nullptr;
  }
  _load.local_reads = local;
  spdlog::debug("transport shm: load {} reads {}", load,
                local ? "locally on every rank" : "through rank 0's node ring");
}

}  // namespace weightcast::detail
