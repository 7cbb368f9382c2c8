// The node ring in shared memory and the hand-over of its memfd to the node's ranks
// (weightcast/transport/detail/node_ring.hpp).
#include "weightcast/transport/detail/node_ring.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>

#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

namespace weightcast::detail {

namespace {

constexpr std::uint64_t ring_magic = 0x676e69722d6d6873ull;  // "shm-ring"
constexpr std::uint64_t header_bytes = 4096;
constexpr auto step = std::chrono::milliseconds(100);

std::uint64_t page_bytes() { return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)); }

}  // namespace

// One slot's state. The words are shared between processes: lock-free atomics only, and
// futexes on them are shared ones (no FUTEX_PRIVATE_FLAG).
struct NodeRingSlot {
  std::atomic<std::uint32_t> chunk_plus_one;  // 0: nothing published yet
  std::atomic<std::uint32_t> readers;         // consumers still copying out of it
  std::uint64_t offset;                       // the chunk's first byte, from the slot's
  std::uint64_t bytes;
};

struct NodeRingHeader {
  std::uint64_t magic;
  std::uint64_t slots;
  std::uint64_t slot_bytes;
  std::uint32_t consumers;
  std::atomic<std::uint32_t> published;  // futex: bumped by every publish
  std::atomic<std::uint32_t> released;   // futex: bumped when a slot's last reader is done
  // How each load reads (NodeRing::vote, decide): loads are numbered from 1 alike on every
  // rank, so each word says which load it speaks of and no reset between loads is needed.
  std::atomic<std::uint32_t> voted;    // futex: votes cast over every load so far
  std::atomic<std::uint32_t> refused;  // the last load some consumer could not read itself
  std::atomic<std::uint32_t> decided;  // futex: load × 2 + 1 where the ranks read themselves
  std::uint32_t reserved;
  NodeRingSlot slot[1];  // `slots` of them, in the header page
};

static_assert(std::atomic<std::uint32_t>::is_always_lock_free,
              "the node ring's words are shared between processes: they must be lock-free");

namespace {

constexpr std::size_t max_slots =
    (header_bytes - offsetof(NodeRingHeader, slot)) / sizeof(NodeRingSlot);

void futex_wait(const std::atomic<std::uint32_t>& word, std::uint32_t seen,
                std::chrono::milliseconds timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  // EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: look again.
  ::syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts,
            nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

void* map_shared(int fd, std::uint64_t bytes, const char* what) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw system_error(Errc::unavailable, errno,
                       fmt::format("mmap of the node ring ({} bytes, {})", bytes, what));
  }
  return p;
}

// Waits until @p fd is ready for @p events, in 100 ms steps up to @p deadline.
// @return false at the deadline. @throws interrupted on @p stop.
bool wait_ready(int fd, short events, std::chrono::steady_clock::time_point deadline,
                const std::stop_token& stop, const char* what) {
  while (true) {
    if (stop.stop_requested()) {
      throw Error(Errc::interrupted, fmt::format("stopped while {}", what));
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return false;
    const auto wait = std::min<std::chrono::steady_clock::duration>(left, step);
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1,
                         static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count()));
    if (n < 0 && errno != EINTR) throw system_error(Errc::unavailable, errno, what);
    if (n > 0) return true;
  }
}

uid_t peer_uid(int fd) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    throw system_error(Errc::unavailable, errno, "getsockopt(SO_PEERCRED) on the node ring socket");
  }
  return cred.uid;
}

}  // namespace

NodeRing::NodeRing(UniqueFd fd, void* mapping, std::uint64_t mapping_bytes)
    : _fd(std::move(fd)), _mapping(mapping), _mapping_bytes(mapping_bytes) {
  _header = static_cast<NodeRingHeader*>(mapping);
  _slot_base = static_cast<std::byte*>(mapping) + header_bytes;
  _slots = _header->slots;
  _slot_bytes = _header->slot_bytes;
}

NodeRing::NodeRing(NodeRing&& other) noexcept
    : _fd(std::move(other._fd)), _mapping(std::exchange(other._mapping, nullptr)),
      _mapping_bytes(other._mapping_bytes), _header(other._header),
      _slot_base(other._slot_base), _slots(other._slots), _slot_bytes(other._slot_bytes),
      _loads(other._loads) {}

NodeRing::~NodeRing() {
  if (_mapping != nullptr) ::munmap(_mapping, _mapping_bytes);
}

NodeRing NodeRing::create(std::size_t slots, std::uint64_t slot_bytes, std::uint32_t consumers) {
  slots = std::max<std::size_t>(slots, 1);
  if (slots > max_slots) {
    throw Error(Errc::config,
                fmt::format("transport: shm: buffer_depth {} is more slots than the node ring "
                            "holds ({} at most)",
                            slots, max_slots));
  }
  const std::uint64_t page = page_bytes();
  slot_bytes = std::max<std::uint64_t>((slot_bytes + page - 1) / page * page, page);
  const std::uint64_t total = header_bytes + slots * slot_bytes;
  UniqueFd fd(::memfd_create("weightcast-node-ring", MFD_CLOEXEC));
  if (!fd) throw system_error(Errc::unavailable, errno, "memfd_create for the node ring");
  if (::ftruncate(fd.get(), static_cast<off_t>(total)) != 0) {
    throw system_error(Errc::unavailable, errno,
                       fmt::format("ftruncate of the node ring to {} bytes ({} slots of {})",
                                   total, slots, slot_bytes));
  }
  void* p = map_shared(fd.get(), total, "rank 0");
  // The memfd is zero-filled: the words start at 0; constructing them makes them objects.
  auto* header = static_cast<NodeRingHeader*>(p);
  header->magic = ring_magic;
  header->slots = slots;
  header->slot_bytes = slot_bytes;
  header->consumers = consumers;
  new (&header->published) std::atomic<std::uint32_t>(0);
  new (&header->released) std::atomic<std::uint32_t>(0);
  new (&header->voted) std::atomic<std::uint32_t>(0);
  new (&header->refused) std::atomic<std::uint32_t>(0);
  new (&header->decided) std::atomic<std::uint32_t>(0);
  for (std::size_t i = 0; i < slots; ++i) {
    new (&header->slot[i].chunk_plus_one) std::atomic<std::uint32_t>(0);
    new (&header->slot[i].readers) std::atomic<std::uint32_t>(0);
  }
  return NodeRing(std::move(fd), p, total);
}

NodeRing NodeRing::map(UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    throw system_error(Errc::unavailable, errno, "fstat of the node ring from rank 0");
  }
  const auto total = static_cast<std::uint64_t>(st.st_size);
  WEIGHTCAST_EXPECT(total >= header_bytes, Errc::unavailable,
                    fmt::format("the node ring from rank 0 has {} bytes, less than its header",
                                total));
  void* p = map_shared(fd.get(), total, "a local rank");
  const auto* header = static_cast<const NodeRingHeader*>(p);
  if (header->magic != ring_magic || header->slots == 0 || header->slots > max_slots ||
      header_bytes + header->slots * header->slot_bytes != total) {
    ::munmap(p, total);
    throw Error(Errc::unavailable,
                "the descriptor rank 0 sent is not a node ring of this weightcast version");
  }
  return NodeRing(std::move(fd), p, total);
}

std::byte* NodeRing::slot_data(std::size_t index) const noexcept {
  return _slot_base + index * _slot_bytes;
}

std::uint32_t NodeRing::consumers() const noexcept { return _header->consumers; }

void NodeRing::publish(std::size_t index, std::size_t chunk, std::uint64_t offset,
                       std::uint64_t bytes) {
  NodeRingSlot& slot = _header->slot[index];
  slot.offset = offset;
  slot.bytes = bytes;
  slot.readers.store(_header->consumers, std::memory_order_relaxed);
  // Release: a consumer that sees the chunk sees its bytes, offset and readers too.
  slot.chunk_plus_one.store(static_cast<std::uint32_t>(chunk + 1), std::memory_order_release);
  _header->published.fetch_add(1, std::memory_order_release);
  futex_wake_all(_header->published);
}

std::uint32_t NodeRing::readers(std::size_t index) const noexcept {
  return _header->slot[index].readers.load(std::memory_order_acquire);
}

std::optional<NodeRing::Found> NodeRing::find(std::size_t chunk,
                                              std::chrono::milliseconds timeout) const {
  const auto wanted = static_cast<std::uint32_t>(chunk + 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    // Read the count before the slots: a publish after this read changes it, and the
    // futex then returns at once instead of sleeping past it.
    const std::uint32_t seen = _header->published.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < _slots; ++i) {
      const NodeRingSlot& slot = _header->slot[i];
      if (slot.chunk_plus_one.load(std::memory_order_acquire) == wanted) {
        return Found{i, slot_data(i) + slot.offset, slot.bytes};
      }
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
    futex_wait(_header->published, seen,
               std::chrono::ceil<std::chrono::milliseconds>(left));
  }
}

void NodeRing::release(std::size_t index) noexcept {
  if (_header->slot[index].readers.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    _header->released.fetch_add(1, std::memory_order_release);
    futex_wake_all(_header->released);
  }
}

void NodeRing::vote(std::uint32_t load, bool reads_itself) noexcept {
  if (!reads_itself) _header->refused.store(load, std::memory_order_relaxed);
  // Release: rank 0, seeing the count, sees the refusal too.
  _header->voted.fetch_add(1, std::memory_order_release);
  futex_wake_all(_header->voted);
}

std::optional<bool> NodeRing::votes(std::uint32_t load, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::uint64_t wanted = static_cast<std::uint64_t>(load) * _header->consumers;
  while (true) {
    const std::uint32_t seen = _header->voted.load(std::memory_order_acquire);
    if (seen >= wanted) return _header->refused.load(std::memory_order_relaxed) != load;
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
    futex_wait(_header->voted, seen, std::chrono::ceil<std::chrono::milliseconds>(left));
  }
}

void NodeRing::decide(std::uint32_t load, bool local_reads) noexcept {
  _header->decided.store(load * 2 + (local_reads ? 1 : 0), std::memory_order_release);
  futex_wake_all(_header->decided);
}

std::optional<bool> NodeRing::decision(std::uint32_t load, std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const std::uint32_t seen = _header->decided.load(std::memory_order_acquire);
    if (seen / 2 == load) return seen % 2 == 1;
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return std::nullopt;
    futex_wait(_header->decided, seen, std::chrono::ceil<std::chrono::milliseconds>(left));
  }
}

std::string node_id() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  return fmt::format("{} (boot {})", host, boot.empty() ? "unknown" : boot);
}

NodeRingServer::NodeRingServer() {
  std::random_device random;
  const std::uint64_t id = (static_cast<std::uint64_t>(random()) << 32) ^ random();
  _name = fmt::format("weightcast-ring-{:016x}-{}", id, ::getpid());
  _socket = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!_socket) throw system_error(Errc::unavailable, errno, "socket(AF_UNIX) for the node ring");
  sockaddr_un address;
  socklen_t length = 0;
  abstract_address(_name, address, length);
  if (::bind(_socket.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    throw system_error(Errc::unavailable, errno,
                       fmt::format("bind of the node ring socket @{}", _name));
  }
  if (::listen(_socket.get(), 1024) != 0) {
    throw system_error(Errc::unavailable, errno, "listen on the node ring socket");
  }
}

void NodeRingServer::serve(int ring_fd, int peers, std::chrono::milliseconds timeout,
                           std::stop_token stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int served = 0;
  while (served < peers) {
    if (!wait_ready(_socket.get(), POLLIN, deadline, stop,
                    "handing the node ring to the local ranks")) {
      throw Error(Errc::timeout,
                  fmt::format("transport shm: {} of {} local ranks took the node ring within "
                              "{} ms (timeout)",
                              served, peers, timeout.count()));
    }
    UniqueFd peer(::accept4(_socket.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer) {
      if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) continue;
      throw system_error(Errc::unavailable, errno, "accept on the node ring socket");
    }
    if (const uid_t uid = peer_uid(peer.get()); uid != ::getuid()) {
      spdlog::warn("transport shm: a process of user {} connected to the node ring socket; "
                   "refused (the job runs as user {})",
                   uid, ::getuid());
      continue;
    }
    char byte = 'r';
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &ring_fd, sizeof(int));
    if (::sendmsg(peer.get(), &message, MSG_NOSIGNAL) != 1) {
      throw system_error(Errc::unavailable, errno, "sendmsg of the node ring to a local rank");
    }
    ++served;
  }
}

UniqueFd receive_node_ring(const std::string& name, std::chrono::milliseconds timeout,
                           std::stop_token stop) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  UniqueFd socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket) throw system_error(Errc::unavailable, errno, "socket(AF_UNIX) for the node ring");
  sockaddr_un address;
  socklen_t length = 0;
  abstract_address(name, address, length);
  if (::connect(socket.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    throw system_error(Errc::unavailable, errno,
                       fmt::format("transport shm: connect to rank 0's node ring socket @{} "
                                   "(is this rank on rank 0's node, in its network "
                                   "namespace?)",
                                   name));
  }
  if (const uid_t uid = peer_uid(socket.get()); uid != ::getuid()) {
    throw Error(Errc::unavailable,
                fmt::format("transport shm: the node ring socket @{} belongs to user {}, not "
                            "to this job's user {}",
                            name, uid, ::getuid()));
  }
  if (!wait_ready(socket.get(), POLLIN, deadline, stop, "waiting for rank 0's node ring")) {
    throw Error(Errc::timeout, fmt::format("transport shm: rank 0 did not send the node ring "
                                           "within {} ms (timeout)",
                                           timeout.count()));
  }
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(socket.get(), &message, MSG_CMSG_CLOEXEC);
  if (n < 0) throw system_error(Errc::unavailable, errno, "recvmsg of the node ring");
  const cmsghdr* c = CMSG_FIRSTHDR(&message);
  if (n != 1 || c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
    throw Error(Errc::unavailable, "transport shm: rank 0's socket sent no node ring descriptor");
  }
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return UniqueFd(fd);
}

void abstract_address(const std::string& name, sockaddr_un& address, socklen_t& length) {
  address = sockaddr_un{};
  address.sun_family = AF_UNIX;
  WEIGHTCAST_EXPECT(name.size() + 1 < sizeof(address.sun_path), Errc::internal,
                    fmt::format("socket name '{}' too long for an abstract address", name));
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace weightcast::detail
