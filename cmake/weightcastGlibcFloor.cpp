// The glibc functions that the self-contained build's code needs but that glibc added after
// its floor (cmake/weightcastGlibcFloor.cmake; docs/python.md § Install). That build compiles
// with the build host's headers and links the static libstdc++ and libgcc of its compiler,
// which were built against the build host's glibc; they reference these functions. Linked
// against the floor's libc (which lacks them), each reference binds here instead, inside the
// CLI or the extension: every definition is hidden (-fvisibility=hidden, and the extension's
// version script exports PyInit_* alone), so the process's own glibc, where it has them, is
// neither replaced nor seen. Each one behaves as glibc documents it, on any glibc >= 2.17.
//
// Compiled only into that build with a floor set, never into the library's normal build.

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cstring>

// WEIGHTCAST_GLIBC_FLOOR_MINOR: the floor's minor version (2.28: 28). A function is defined
// here only where the floor lacks it and the build host's headers declare it.
#ifndef WEIGHTCAST_GLIBC_FLOOR_MINOR
#error "compiled by cmake/weightcastGlibcFloor.cmake only, which defines WEIGHTCAST_GLIBC_FLOOR_MINOR"
#endif
#define WEIGHTCAST_FLOOR_LACKS(minor) \
  (WEIGHTCAST_GLIBC_FLOOR_MINOR < (minor) && __GLIBC_PREREQ(2, minor))

extern "C" {

#if WEIGHTCAST_FLOOR_LACKS(32)
// __libc_single_threaded (glibc 2.32): libstdc++'s shared_ptr and its locale and string
// reference counts read it to skip atomics while the process has one thread. 0 says "not
// single-threaded" always: every update is then atomic, which the flag lets one skip and never
// requires, so any process's threads are handled; the cost is an atomic increment where a plain
// one would do. Weak: the extension has its own definition (python/single_threaded.cpp, for
// Debian's non-PIC libyaml-cpp.a), which wins there.
__attribute__((weak)) char __libc_single_threaded = 0;
#endif

#if WEIGHTCAST_FLOOR_LACKS(30)
// The waits on a chosen clock (glibc 2.30): libstdc++'s headers call them for waits on
// std::chrono::steady_clock (condition_variable::wait_for/wait_until, timed_mutex,
// shared_timed_mutex), on a mutex or condition variable made with the default attributes. Each
// turns its deadline on `clock` into one on CLOCK_REALTIME, the clock the glibc < 2.30
// functions wait on, as libstdc++ itself does where glibc has no clockwait: the wait then
// ends early or late by as much as the system clock is stepped during it, and the callers
// (the standard's wait_until loops) check their own clock again after it. EINVAL for a clock
// other than CLOCK_MONOTONIC and CLOCK_REALTIME, as glibc.
// static: C linkage here (inside extern "C"), where an unnamed namespace would not make it local.
static int realtime_deadline(clockid_t clock, const timespec* abstime, timespec* realtime) {
  if (clock == CLOCK_REALTIME) {
    *realtime = *abstime;
    return 0;
  }
  if (clock != CLOCK_MONOTONIC) return EINVAL;
  if (abstime->tv_nsec < 0 || abstime->tv_nsec >= 1000000000) return EINVAL;
  timespec now_clock, now_real;
  clock_gettime(CLOCK_MONOTONIC, &now_clock);
  clock_gettime(CLOCK_REALTIME, &now_real);
  int64_t left_ns = (static_cast<int64_t>(abstime->tv_sec) - now_clock.tv_sec) * 1000000000 +
                    (abstime->tv_nsec - now_clock.tv_nsec);
  if (left_ns < 0) left_ns = 0;  // already past: the call times out at once
  int64_t ns = now_real.tv_nsec + left_ns % 1000000000;
  realtime->tv_sec = now_real.tv_sec + static_cast<time_t>(left_ns / 1000000000 + ns / 1000000000);
  realtime->tv_nsec = static_cast<long>(ns % 1000000000);
  return 0;
}

// The running glibc's own function where it has one (2.30 and later, nearly every host):
// these definitions are hidden, so the wheel's code always calls them, and the conversion
// above is only for a glibc that lacks the real thing. Looked up by version, so that the
// lookup can never find one of these.
static void* running_glibc(const char* name) {
  return dlvsym(RTLD_DEFAULT, name, "GLIBC_2.30");
}

int pthread_cond_clockwait(pthread_cond_t* cond, pthread_mutex_t* mutex, clockid_t clock,
                           const timespec* abstime) {
  using Fn = int (*)(pthread_cond_t*, pthread_mutex_t*, clockid_t, const timespec*);
  static const Fn real = reinterpret_cast<Fn>(running_glibc("pthread_cond_clockwait"));
  if (real != nullptr) return real(cond, mutex, clock, abstime);
  timespec deadline;
  if (int rc = realtime_deadline(clock, abstime, &deadline)) return rc;
  if (clock == CLOCK_MONOTONIC) {
    // At most 100 ms per wait on the system clock, so that a step of it cannot stretch a
    // steady-clock wait: an early return is a spurious wake-up, which every caller of a
    // condition variable handles (libstdc++'s wait_until reads its own clock again).
    timespec cap;
    clock_gettime(CLOCK_REALTIME, &cap);
    cap.tv_nsec += 100000000;
    if (cap.tv_nsec >= 1000000000) {
      cap.tv_sec += 1;
      cap.tv_nsec -= 1000000000;
    }
    if (cap.tv_sec < deadline.tv_sec ||
        (cap.tv_sec == deadline.tv_sec && cap.tv_nsec < deadline.tv_nsec)) {
      const int rc = pthread_cond_timedwait(cond, mutex, &cap);
      return rc == ETIMEDOUT ? 0 : rc;
    }
  }
  return pthread_cond_timedwait(cond, mutex, &deadline);
}

int pthread_mutex_clocklock(pthread_mutex_t* mutex, clockid_t clock,
                            const timespec* abstime) noexcept {
  using Fn = int (*)(pthread_mutex_t*, clockid_t, const timespec*);
  static const Fn real = reinterpret_cast<Fn>(running_glibc("pthread_mutex_clocklock"));
  if (real != nullptr) return real(mutex, clock, abstime);
  timespec deadline;
  if (int rc = realtime_deadline(clock, abstime, &deadline)) return rc;
  return pthread_mutex_timedlock(mutex, &deadline);
}

int pthread_rwlock_clockrdlock(pthread_rwlock_t* rwlock, clockid_t clock,
                               const timespec* abstime) noexcept {
  using Fn = int (*)(pthread_rwlock_t*, clockid_t, const timespec*);
  static const Fn real = reinterpret_cast<Fn>(running_glibc("pthread_rwlock_clockrdlock"));
  if (real != nullptr) return real(rwlock, clock, abstime);
  timespec deadline;
  if (int rc = realtime_deadline(clock, abstime, &deadline)) return rc;
  return pthread_rwlock_timedrdlock(rwlock, &deadline);
}

int pthread_rwlock_clockwrlock(pthread_rwlock_t* rwlock, clockid_t clock,
                               const timespec* abstime) noexcept {
  using Fn = int (*)(pthread_rwlock_t*, clockid_t, const timespec*);
  static const Fn real = reinterpret_cast<Fn>(running_glibc("pthread_rwlock_clockwrlock"));
  if (real != nullptr) return real(rwlock, clock, abstime);
  timespec deadline;
  if (int rc = realtime_deadline(clock, abstime, &deadline)) return rc;
  return pthread_rwlock_timedwrlock(rwlock, &deadline);
}

// sem_clockwait reports errors through errno, as sem_timedwait.
int sem_clockwait(sem_t* sem, clockid_t clock, const timespec* abstime) {
  using Fn = int (*)(sem_t*, clockid_t, const timespec*);
  static const Fn real = reinterpret_cast<Fn>(running_glibc("sem_clockwait"));
  if (real != nullptr) return real(sem, clock, abstime);
  timespec deadline;
  if (int rc = realtime_deadline(clock, abstime, &deadline)) {
    errno = rc;
    return -1;
  }
  return sem_timedwait(sem, &deadline);
}
#endif

#if WEIGHTCAST_FLOOR_LACKS(36)
// arc4random (glibc 2.36): std::random_device's "default" and "arc4random" sources in
// libstdc++. Bytes from the kernel's CSPRNG (getrandom(2), glibc 2.25, Linux 3.17; on a kernel
// without it, /dev/urandom). Like glibc's, it cannot fail: where neither source answers, the
// process aborts rather than return predictable bytes.
void arc4random_buf(void* buffer, size_t size) noexcept {
  auto* out = static_cast<unsigned char*>(buffer);
  while (size > 0) {
    ssize_t got = getrandom(out, size, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == ENOSYS) break;
    if (got <= 0) abort();
    out += got;
    size -= static_cast<size_t>(got);
  }
  if (size == 0) return;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) abort();
  while (size > 0) {
    ssize_t got = read(fd, out, size);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) abort();
    out += got;
    size -= static_cast<size_t>(got);
  }
  close(fd);
}

uint32_t arc4random() noexcept {
  uint32_t value;
  arc4random_buf(&value, sizeof value);
  return value;
}

// Uniform in [0, bound) without modulo bias: rejects the values below 2^32 mod bound.
uint32_t arc4random_uniform(uint32_t bound) noexcept {
  if (bound < 2) return 0;
  uint32_t floor = static_cast<uint32_t>(-bound) % bound;
  for (;;) {
    uint32_t value = arc4random();
    if (value >= floor) return value % bound;
  }
}
#endif

#if WEIGHTCAST_FLOOR_LACKS(35) && defined(DLFO_STRUCT_HAS_EH_DBASE)
// _dl_find_object (glibc 2.35): the C++ unwinder of libgcc (built against a glibc that has
// it) finds the unwind tables of the object holding a return address with it alone:
// _Unwind_Find_FDE (libgcc/unwind-dw2-fde-dip.c) returns "no FDE" when it fails, so a stub
// that fails would make every throw std::terminate. This one finds the object as the same
// unwinder did before glibc 2.35, by walking the loaded objects with dl_iterate_phdr (under
// the loader's lock: safe during unwinding), and fills in what glibc does: the mapping (the
// PT_LOAD segment holding the address), the object's PT_GNU_EH_FRAME (its .eh_frame_hdr,
// which the unwinder reads) and its link_map (from dladdr1). Returns 0 when found, -1 when
// no object holds the address or the object has no PT_GNU_EH_FRAME (glibc's contract).
struct FindObject {
  uintptr_t address;
  dl_find_object* result;
  bool found;
};

static int find_object_callback(dl_phdr_info* info, size_t, void* data) {
  auto* find = static_cast<FindObject*>(data);
  const ElfW(Phdr)* load = nullptr;
  const ElfW(Phdr)* eh_frame = nullptr;
  for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& phdr = info->dlpi_phdr[i];
    if (phdr.p_type == PT_LOAD) {
      uintptr_t start = info->dlpi_addr + phdr.p_vaddr;
      if (find->address >= start && find->address < start + phdr.p_memsz) load = &phdr;
    } else if (phdr.p_type == PT_GNU_EH_FRAME) {
      eh_frame = &phdr;
    }
  }
  if (load == nullptr) return 0;  // not this object: go on to the next
  if (eh_frame != nullptr) {
    dl_find_object* r = find->result;
    std::memset(r, 0, sizeof *r);
    r->dlfo_map_start = reinterpret_cast<void*>(info->dlpi_addr + load->p_vaddr);
    r->dlfo_map_end = reinterpret_cast<void*>(info->dlpi_addr + load->p_vaddr + load->p_memsz);
    r->dlfo_eh_frame = reinterpret_cast<void*>(info->dlpi_addr + eh_frame->p_vaddr);
    find->found = true;
  }
  return 1;  // the object holding the address: stop, found or not
}

int _dl_find_object(void* address, dl_find_object* result) noexcept {
  FindObject find{reinterpret_cast<uintptr_t>(address), result, false};
  dl_iterate_phdr(find_object_callback, &find);
  if (!find.found) return -1;
  Dl_info info;
  void* map = nullptr;
  if (dladdr1(address, &info, &map, RTLD_DL_LINKMAP) != 0) {
    result->dlfo_link_map = static_cast<link_map*>(map);
  }
  return 0;
}
#endif

}  // extern "C"
