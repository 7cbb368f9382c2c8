// The pread reader: a small thread pool for where io_uring is unavailable (Docker's default
// seccomp profile, `kernel.io_uring_disabled`, old kernels). Same contract as the io_uring
// reader: completions are signalled through an eventfd and collected by `reap()`.
#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/io/reader.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>

namespace weightcast {
namespace {

// As the io_uring reader: below the kernel's 0x7ffff000-byte cap and a multiple of every
// O_DIRECT alignment.
constexpr std::uint64_t max_read_bytes = 1ull << 30;

class PreadReader final : public Reader {
 public:
  explicit PreadReader(unsigned threads) {
    _event_fd.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (_event_fd.get() < 0) throw system_error(Errc::internal, errno, "eventfd");
    const unsigned count = std::max(threads, static_cast<unsigned>(setting::io_depth.min));
    try {
      for (unsigned i = 0; i < count; ++i) _threads.emplace_back([this] { work(); });
    } catch (const std::system_error& e) {
      stop();
      throw system_error(Errc::internal, e.code().value(), "pread reader: cannot start a thread");
    }
  }

  ~PreadReader() override {
    // Threads may be writing into staging slots the caller frees next: join them first.
    stop();
  }

  PreadReader(const PreadReader&) = delete;
  PreadReader& operator=(const PreadReader&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return "pread"; }
  [[nodiscard]] int completion_fd() const noexcept override { return _event_fd.get(); }
  [[nodiscard]] std::size_t pending() const noexcept override {
    std::lock_guard lock(_mutex);
    return _pending;
  }

  void submit(ReadRequest* request) override {
    request->bytes_done = 0;
    request->error = 0;
    request->end_of_file = false;
    {
      std::lock_guard lock(_mutex);
      ++_pending;
      _queue.push_back(request);
    }
    _wake.notify_one();
  }

  std::size_t reap(std::vector<ReadRequest*>& finished) override {
    std::uint64_t counter = 0;
    [[maybe_unused]] auto ignored = read(_event_fd.get(), &counter, sizeof counter);
    std::lock_guard lock(_mutex);
    const std::size_t appended = _done.size();
    finished.insert(finished.end(), _done.begin(), _done.end());
    _done.clear();
    _pending -= appended;
    return appended;
  }

 private:
  void work() {
    for (;;) {
      ReadRequest* request = nullptr;
      {
        std::unique_lock lock(_mutex);
        _wake.wait(lock, [this] { return _stopping || !_queue.empty(); });
        if (_stopping) return;
        request = _queue.front();
        _queue.pop_front();
      }
      // The whole request on this thread: short reads and EINTR/EAGAIN loop here.
      while (true) {
        const std::uint64_t left = request->bytes - request->bytes_done;
        const ssize_t got =
            ::pread(request->fd, request->destination + request->bytes_done,
                    std::min(left, max_read_bytes),
                    static_cast<off_t>(request->file_offset + request->bytes_done));
        const long long res = got < 0 ? -static_cast<long long>(errno) : got;
        if (detail::advance(*request, res) == detail::ReadStep::finished) break;
      }
      {
        std::lock_guard lock(_mutex);
        _done.push_back(request);
      }
      const std::uint64_t one = 1;
      [[maybe_unused]] auto ignored = ::write(_event_fd.get(), &one, sizeof one);
    }
  }

  void stop() noexcept {
    {
      std::lock_guard lock(_mutex);
      _stopping = true;
    }
    _wake.notify_all();
    for (auto& thread : _threads) {
      if (thread.joinable()) thread.join();
    }
    _threads.clear();
    _event_fd.reset();
  }

  detail::UniqueFd _event_fd;
  mutable std::mutex _mutex;
  std::condition_variable _wake;
  std::deque<ReadRequest*> _queue;  // submitted, not yet taken by a thread
  std::vector<ReadRequest*> _done;  // finished, not yet reaped
  std::size_t _pending = 0;
  bool _stopping = false;
  std::vector<std::thread> _threads;
};

}  // namespace

std::unique_ptr<Reader> make_pread_reader(unsigned threads) {
  return std::make_unique<PreadReader>(threads);
}

}  // namespace weightcast
