// The delivery of `transport: shm`: the node's ranks copy each chunk out of the shared staging
// ring themselves (weightcast/pipeline/detail/node_ring_delivery.hpp).
#include "weightcast/pipeline/detail/node_ring_delivery.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcast::detail {

namespace asio = boost::asio;
using asio::awaitable;

namespace {

// The chunk's pieces, as copies out of its slot into their places in the arena.
std::vector<RingCopy> arena_copies(const LoadContext& load, std::size_t c) {
  const Chunk& chunk = load.plan.chunks[c];
  const bool device = load.arena.kind() != MemoryKind::host;
  if (chunk.arena_contiguous) {
    return {{0, load.arena.data() + chunk.arena_offset, chunk.bytes, device}};
  }
  std::vector<RingCopy> copies;
  for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
    const Piece& piece = load.plan.pieces[chunk.first_piece + p];
    copies.push_back(
        {piece.chunk_offset, load.arena.data() + piece.arena_offset, piece.bytes, device});
  }
  return copies;
}

// Rank 0: complete once every consumer has released the slot. A poll, not a wait: rank 0's
// thread also reads and copies (the landing stage polls it up to every millisecond).
class Released final : public Pending {
 public:
  Released(const NodeRing& ring, std::size_t slot) : _ring(ring), _slot(slot) {}
  bool test() override { return _ring.readers(_slot) == 0; }

 private:
  const NodeRing& _ring;
  std::size_t _slot;
};

// Another rank: waits for the slot holding chunk `c`, then copies out of it and releases the
// slot. Each test sleeps at most `step` on the ring's futex, so the landing stage's loop (and
// with it the watchdog and a stop request: the control plane stops the load when a rank is
// lost or aborts) runs at least that often; the thread has nothing else to do meanwhile.
// Device copies (cuda) are queued on the rank's own copy stream and polled; the slot is
// released only once they have completed, as the DMA reads it.
class Received final : public Pending {
 public:
  Received(const LoadContext& load, NodeRing& ring, std::size_t c, std::vector<RingCopy> copies)
      : _load(load), _ring(ring), _chunk(c), _copies(std::move(copies)) {}
  ~Received() override {
    // A load that fails with copies in flight: the device's copy waits for its DMA when
    // dropped, and only then does the slot go back.
    _copying.reset();
    if (_slot) _ring.release(*_slot);
  }
  Received(const Received&) = delete;
  Received& operator=(const Received&) = delete;

  bool test() override {
    if (_copying) return copied();
    if (_load.options.stop.stop_requested()) return false;  // the watchdog ends the load
    const auto found = _ring.find(_chunk, step);
    if (!found) return false;
    _slot = found->slot;
    const Chunk& chunk = _load.plan.chunks[_chunk];
    if (found->bytes != chunk.bytes) {
      throw Error(Errc::internal,
                  fmt::format("node ring: chunk {} has {} bytes in slot {}, the plan says {}",
                              _chunk, found->bytes, found->slot, chunk.bytes));
    }
    _copying = copy_out(_load.device, _copies, found->data);
    if (_copying) return copied();
    release();
    return true;
  }

 private:
  bool copied() {
    if (!_copying->test()) return false;
    _copying.reset();
    release();
    return true;
  }
  void release() {
    _ring.release(*_slot);
    _slot.reset();
  }

  static constexpr std::chrono::milliseconds step{100};
  const LoadContext& _load;
  NodeRing& _ring;
  std::size_t _chunk;
  std::vector<RingCopy> _copies;
  std::optional<std::size_t> _slot;      // found, not yet released
  std::unique_ptr<Pending> _copying;     // device copies out of it, in flight
};

// A rank's own boxes of one chunk, read from its own descriptor of the shard (local reads).
class LocalRead final : public Pending {
 public:
  LocalRead(const LoadContext& load, const LocalShards& files, std::size_t c,
            std::vector<RingCopy> copies, ReadBytesHook seen)
      : _load(load), _files(files), _chunk(c), _copies(std::move(copies)), _seen(std::move(seen)) {}
  bool test() override {
    const Chunk& chunk = _load.plan.chunks[_chunk];
    for (std::size_t i = 0; i < _copies.size(); ++i) {
      const RingCopy& copy = _copies[i];
      // Shown to a hook (a digest of the file's bytes), a `pread` goes through a buffer of
      // its own: a digest of the destination would be the received one again.
      const std::byte* read =
          _files.read(chunk.shard, chunk.file_offset + copy.chunk_offset, copy.to, copy.bytes,
                      [&] { return tensor_at(chunk, copy.chunk_offset); },
                      _seen ? &_bounce : nullptr);
      if (_seen) _seen(i, read);
    }
    _files.release(chunk.shard, chunk.file_offset, chunk.bytes);
    // Bytes read while the file was rewritten in place may mix old and new contents.
    _files.check_unchanged(chunk.shard);
    return true;
  }

 private:
  std::string_view tensor_at(const Chunk& chunk, std::uint64_t chunk_offset) const {
    for (std::uint32_t p = 0; p < chunk.piece_count; ++p) {
      const Piece& piece = _load.plan.pieces[chunk.first_piece + p];
      if (chunk_offset < piece.chunk_offset + piece.bytes) {
        return _load.catalogue.tensors[piece.tensor].name;
      }
    }
    return "?";
  }

  const LoadContext& _load;
  const LocalShards& _files;
  std::size_t _chunk;
  std::vector<RingCopy> _copies;
  ReadBytesHook _seen;
  std::vector<std::byte> _bounce;  // `pread`s shown to `_seen`
};

std::int64_t modified_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::int64_t changed_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec;
}

NodeRing& ring_of(LoadContext& load) {
  NodeRing* ring = load.transport.node_ring();
  WEIGHTCAST_EXPECT(ring != nullptr, Errc::internal,
                    "the node ring delivery needs transport shm's ring");
  return *ring;
}

}  // namespace

std::unique_ptr<Pending> copy_out(Device& device, const std::vector<RingCopy>& copies,
                                  const std::byte* source) {
  std::vector<Device::Copy> uploads;
  for (const RingCopy& copy : copies) {
    if (copy.to_device) {
      uploads.push_back({source + copy.chunk_offset, copy.to, copy.bytes});
    } else {
      std::memcpy(copy.to, source + copy.chunk_offset, copy.bytes);
    }
  }
  if (uploads.empty()) return nullptr;
  return device.upload_all(uploads);
}

RingPin::RingPin(Device& device, const NodeRing& ring) : _device(device) {
  std::byte* slots = ring.slot_data(0);
  const std::uint64_t bytes = ring.slots() * ring.slot_bytes();
  try {
    _device.pin(slots, bytes);
    _pinned = slots;
  } catch (const Error& e) {
    spdlog::warn("{}; this rank copies out of the node ring from pageable memory (slower)",
                 e.what());
  }
}

RingPin::~RingPin() {
  if (_pinned != nullptr) _device.unpin(_pinned);
}

std::unique_ptr<Pending> node_ring_receive(const LoadContext& load, NodeRing& ring,
                                           std::size_t c, std::vector<RingCopy> copies) {
  return std::make_unique<Received>(load, ring, c, std::move(copies));
}

LocalShards::LocalShards(const Catalogue& catalogue) : _catalogue(catalogue) {
  _files.reserve(catalogue.shards.size());
  for (const ShardInfo& shard : catalogue.shards) {
    Opened opened;
    opened.fd = UniqueFd(::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!opened.fd) {
      throw system_error(errno == ENOENT ? Errc::missing_input : Errc::io, errno,
                         fmt::format("{}: cannot open the shard ({}) to read it locally",
                                     shard.name, shard.path.string()));
    }
    struct stat st {};
    if (::fstat(opened.fd.get(), &st) != 0) {
      throw system_error(Errc::io, errno, fmt::format("{}: fstat", shard.name));
    }
    const bool same_file = shard.inode == 0 || (static_cast<std::uint64_t>(st.st_dev) ==
                                                    shard.device &&
                                                static_cast<std::uint64_t>(st.st_ino) ==
                                                    shard.inode);
    if (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) != shard.file_bytes ||
        !same_file) {
      throw Error(Errc::io, fmt::format("{}: {} is not the file rank 0 read the header of "
                                        "({} bytes here, {} there)",
                                        shard.name, shard.path.string(), st.st_size,
                                        shard.file_bytes));
    }
    if (shard.inode != 0 &&
        (modified_ns(st) != shard.modified_ns || changed_ns(st) != shard.changed_ns)) {
      throw Error(Errc::io, fmt::format("{}: the file changed since rank 0 read its header "
                                        "(its modification or status change time moved)",
                                        shard.name));
    }
    opened.bytes = static_cast<std::uint64_t>(st.st_size);
    opened.modified_ns = modified_ns(st);
    opened.changed_ns = changed_ns(st);
    if (opened.bytes > 0) {
      try {
        opened.map = std::make_unique<MappedShard>(opened.fd.get(), opened.bytes, shard.name);
      } catch (const Error& e) {
        spdlog::debug("{}; reading it with pread instead", e.what());
      }
    }
    _files.push_back(std::move(opened));
  }
}

const std::byte* LocalShards::read(std::uint32_t shard, std::uint64_t offset, std::byte* to,
                                   std::uint64_t bytes,
                                   const std::function<std::string_view()>& tensor,
                                   std::vector<std::byte>* bounce) const {
  const ShardInfo& info = _catalogue.shards.at(shard);
  const Opened& opened = _files.at(shard);
  if (opened.map && offset + bytes <= opened.map->size()) {
    // A page past a new end reads as zeros: check_unchanged sees it (truncated()).
    std::memcpy(to, opened.map->data() + offset, bytes);
    return opened.map->data() + offset;
  }
  std::byte* const destination = to;
  const std::uint64_t length = bytes;
  if (bounce != nullptr) {
    bounce->resize(bytes);
    to = bounce->data();
  }
  std::byte* const read = to;
  const int fd = opened.fd.get();
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, to, bytes, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw system_error(Errc::io, errno,
                         fmt::format("{}: read failed at offset {} (tensor '{}')", info.name,
                                     offset, tensor()));
    }
    if (got == 0) {
      throw Error(Errc::io, fmt::format("{}: file ended at offset {} inside tensor '{}' "
                                        "(expected {} bytes): the shard shrank after its "
                                        "header was read",
                                        info.name, offset, tensor(), info.file_bytes));
    }
    to += got;
    offset += static_cast<std::uint64_t>(got);
    bytes -= static_cast<std::uint64_t>(got);
  }
  if (bounce != nullptr) std::memcpy(destination, read, length);
  return read;
}

void LocalShards::release(std::uint32_t shard, std::uint64_t offset,
                          std::uint64_t bytes) const {
  const Opened& opened = _files.at(shard);
  if (opened.map) opened.map->release(offset, bytes);
}

void LocalShards::check_unchanged(std::uint32_t shard) const {
  const Opened& opened = _files.at(shard);
  const ShardInfo& info = _catalogue.shards[shard];
  if (opened.map && opened.map->truncated() != 0) {
    throw Error(Errc::io, fmt::format("{}: a page of the shard could not be read (the file "
                                      "shrank under its mapping, or an I/O error) while it "
                                      "was read locally",
                                      info.name));
  }
  struct stat st {};
  if (::fstat(opened.fd.get(), &st) != 0) {
    throw system_error(Errc::io, errno, fmt::format("{}: fstat", info.name));
  }
  if (static_cast<std::uint64_t>(st.st_size) != opened.bytes ||
      modified_ns(st) != opened.modified_ns || changed_ns(st) != opened.changed_ns) {
    throw Error(Errc::io, fmt::format("{}: the shard changed while it was read (now {} bytes, "
                                      "{} when opened; modification or status change time "
                                      "moved): its bytes "
                                      "may mix old and new contents",
                                      info.name, st.st_size, opened.bytes));
  }
}

std::unique_ptr<Pending> local_read(const LoadContext& load, const LocalShards& files,
                                    std::size_t c, std::vector<RingCopy> copies,
                                    ReadBytesHook seen) {
  return std::make_unique<LocalRead>(load, files, c, std::move(copies), std::move(seen));
}

std::unique_ptr<Pending> node_ring_released(const NodeRing& ring, std::size_t slot) {
  return std::make_unique<Released>(ring, slot);
}

NodeRingDelivery::NodeRingDelivery(LoadContext& load)
    : BroadcastDelivery(load), _ring(ring_of(load)) {}

void NodeRingDelivery::start() {
  if (_load.device.wants_pinned_staging()) _pin.emplace(_load.device, _ring);
  BroadcastDelivery::start();
}

ReadPolicy NodeRingDelivery::read_policy() const {
  ReadPolicy policy;
  policy.send_from_page_cache = _load.local_reads;
  return policy;
}

// Publishes first, so the other ranks copy while rank 0 copies its own; the slot stays leased
// until every one of them has released it (`post`). With local reads nothing is published.
awaitable<Uploading> NodeRingDelivery::upload(std::size_t c, SlotLease lease, const Slot& slot) {
  const Chunk& chunk = _load.plan.chunks[c];
  if (!_load.local_reads) {
    const std::byte* base = _ring.slot_data(lease.index());
    _ring.publish(lease.index(), c, static_cast<std::uint64_t>(slot.source - base),
                  chunk.bytes);
  }
  // Held past the upload completion stage (which waits for the copies) until `post`'s
  // wait for every consumer's release; held first, so that a copy that fails leaves the
  // published slot held, never read into while the others may still copy out of it.
  _held.push_back(std::move(lease));
  Uploading uploading;
  if (auto copying = copy_out(_load.device, arena_copies(_load, c), slot.source)) {
    uploading.copies.push_back(std::move(copying));
  }
  co_return uploading;
}

InFlight NodeRingDelivery::post(std::size_t c, bool root) {
  InFlight posted;
  posted.chunk = c;
  if (root) {
    WEIGHTCAST_EXPECT(!_held.empty(), Errc::internal, "node ring: a chunk posted before its upload");
    posted.lease = std::move(_held.front());
    _held.pop_front();
    if (!_load.local_reads) posted.pending = node_ring_released(_ring, posted.lease.index());
  } else if (_load.local_reads) {
    posted.pending = local_read(_load, *_load.local_files, c, arena_copies(_load, c));
  } else {
    posted.pending = node_ring_receive(_load, _ring, c, arena_copies(_load, c));
  }
  return posted;
}

std::unique_ptr<Delivery> make_node_ring_delivery(LoadContext& load) {
  return std::make_unique<NodeRingDelivery>(load);
}

}  // namespace weightcast::detail
