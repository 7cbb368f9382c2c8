#include "weightcast/io/detail/mapped_shard.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <mutex>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace weightcast::detail {

namespace {

// The mappings a SIGBUS may belong to. The handler reads this table with atomic loads only
// (async-signal-safe); registration takes a mutex, never from a handler.
struct Registered {
  std::atomic<std::uintptr_t> begin{0};  // 0: a free entry
  std::atomic<std::uintptr_t> end{0};
  std::atomic<std::atomic<std::uint64_t>*> zeroed{nullptr};
};
constexpr std::size_t max_mappings = 1024;
std::array<Registered, max_mappings> registered;
std::mutex registration;
struct sigaction previous_action {};
std::uintptr_t page_bytes = 4096;

// A handler must leave errno as it found it: the interrupted code may be about to read it.
struct KeepErrno {
  int saved = errno;
  ~KeepErrno() { errno = saved; }
};

void on_sigbus(int signal, siginfo_t* info, void* context) {
  const KeepErrno keep;
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  // Only a fault has a faulting address (si_code > 0); a SIGBUS sent by kill(2) is never ours.
  for (Registered& r : registered) {
    if (info->si_code <= 0) break;
    const std::uintptr_t begin = r.begin.load(std::memory_order_acquire);
    if (begin == 0 || address < begin || address >= r.end.load(std::memory_order_acquire)) {
      continue;
    }
    // A page of a registered shard past the file's (new) end, or one the kernel could not
    // read: a zero page in its place, and the read goes on; the loader sees the count and
    // fails the load. The raw system call: a library may interpose mmap(3) with locks (UCX).
    const std::uintptr_t page = address & ~(page_bytes - 1);
    const long mapped = syscall(SYS_mmap, page, page_bytes, PROT_READ,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (mapped != -1) {
      if (auto* zeroed = r.zeroed.load(std::memory_order_acquire)) {
        zeroed->fetch_add(1, std::memory_order_acq_rel);
      }
      return;
    }
    break;
  }
  // Not ours: whatever was there before us.
  if ((previous_action.sa_flags & SA_SIGINFO) != 0 && previous_action.sa_sigaction != nullptr) {
    previous_action.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN &&
      previous_action.sa_handler != nullptr) {
    previous_action.sa_handler(signal);
    return;
  }
  // The default action: restore it. A faulting access, run again, takes it; a sent signal
  // is sent again.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGBUS, &default_action, nullptr);
  if (info->si_code <= 0) raise(signal);
}

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    page_bytes = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous_action);
  });
}

}  // namespace

MappedShard::MappedShard(int fd, std::uint64_t bytes, const std::string& name) : _bytes(bytes) {
  if (bytes == 0) return;
  install_handler();
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    throw system_error(Errc::io, errno, fmt::format("{}: cannot map the shard", name));
  }
  _data = static_cast<const std::byte*>(p);
  std::lock_guard lock(registration);
  for (std::size_t i = 0; i < max_mappings; ++i) {
    if (registered[i].begin.load(std::memory_order_relaxed) != 0) continue;
    registered[i].zeroed.store(&_zeroed, std::memory_order_release);
    registered[i].end.store(reinterpret_cast<std::uintptr_t>(_data) + bytes,
                            std::memory_order_release);
    registered[i].begin.store(reinterpret_cast<std::uintptr_t>(_data),
                              std::memory_order_release);
    _slot = static_cast<int>(i);
    return;
  }
  munmap(p, bytes);
  _data = nullptr;
  throw Error(Errc::unavailable,
              fmt::format("{}: cannot map the shard: {} shards are mapped already", name,
                          max_mappings));
}

MappedShard::~MappedShard() {
  if (_data == nullptr) return;
  {
    std::lock_guard lock(registration);
    Registered& r = registered[static_cast<std::size_t>(_slot)];
    r.begin.store(0, std::memory_order_release);
    r.end.store(0, std::memory_order_release);
    r.zeroed.store(nullptr, std::memory_order_release);
  }
  munmap(const_cast<std::byte*>(_data), _bytes);
}

void MappedShard::release(std::uint64_t offset, std::uint64_t bytes) noexcept {
  if (_data == nullptr || bytes == 0 || offset >= _bytes) return;
  const auto page = static_cast<std::uint64_t>(page_bytes);
  const std::uint64_t begin = offset / page * page;
  const std::uint64_t end = std::min(_bytes, offset + bytes);
  if (end <= begin) return;
  madvise(const_cast<std::byte*>(_data) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace weightcast::detail
