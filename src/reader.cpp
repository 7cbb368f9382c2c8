#include "weightcast/reader.hpp"

#include "weightcast/error.hpp"

#include <fmt/core.h>
#include <liburing.h>

#include <cerrno>
#include <cstdio>
#include <deque>
#include <sys/eventfd.h>
#include <unistd.h>

namespace weightcast {
namespace {

// The kernel caps one read at 0x7ffff000 bytes; stay well below so a chunk of any size works.
constexpr std::uint64_t max_read_bytes = 1ull << 30;

class UringReader final : public Reader {
 public:
  explicit UringReader(unsigned queue_depth) : _depth(queue_depth == 0 ? 1 : queue_depth) {
    int rc = io_uring_queue_init(_depth, &_ring, 0);
    if (rc < 0) throw system_error(Errc::unavailable, -rc, "io_uring unavailable: io_uring_setup");
    _event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (_event_fd < 0) {
      int err = errno;
      io_uring_queue_exit(&_ring);
      throw system_error(Errc::internal, err, "eventfd");
    }
    rc = io_uring_register_eventfd(&_ring, _event_fd);
    if (rc < 0) {
      close(_event_fd);
      io_uring_queue_exit(&_ring);
      throw system_error(Errc::unavailable, -rc, "io_uring unavailable: register eventfd");
    }
  }

  ~UringReader() override {
    // Reads still in flight write into staging slots the caller is about to free: wait for
    // every one of them before the ring (and then the slots) go away.
    while (_in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&_ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        std::fprintf(stderr, "weightcast: io_uring_wait_cqe during shutdown: %d\n", rc);
        break;
      }
      io_uring_cqe_seen(&_ring, cqe);
      --_in_flight;
    }
    io_uring_queue_exit(&_ring);
    close(_event_fd);
  }

  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return "io_uring"; }
  [[nodiscard]] int completion_fd() const noexcept override { return _event_fd; }
  [[nodiscard]] std::size_t pending() const noexcept override { return _pending; }

  void submit(ReadRequest* request) override {
    request->bytes_done = 0;
    request->error = 0;
    request->end_of_file = false;
    ++_pending;
    _backlog.push_back(request);
    fill_and_submit();
  }

  std::size_t reap(std::vector<ReadRequest*>& finished) override {
    std::uint64_t counter = 0;
    // Clears the eventfd; EAGAIN just means nothing was signalled since the last reap.
    [[maybe_unused]] auto ignored = read(_event_fd, &counter, sizeof counter);
    std::size_t appended = 0;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&_ring, &cqe) == 0) {
      auto* request = static_cast<ReadRequest*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&_ring, cqe);
      --_in_flight;
      if (res == -EINTR || res == -EAGAIN) {
        _backlog.push_front(request);  // retried as is
      } else if (res < 0) {
        request->error = -res;
        finished.push_back(request);
        ++appended;
      } else if (res == 0) {
        request->end_of_file = true;
        finished.push_back(request);
        ++appended;
      } else {
        request->bytes_done += static_cast<std::uint64_t>(res);
        if (request->bytes_done < request->bytes) {
          _backlog.push_front(request);  // short read: the rest goes again
        } else {
          finished.push_back(request);
          ++appended;
        }
      }
    }
    _pending -= appended;
    fill_and_submit();
    return appended;
  }

 private:
  void fill_and_submit() {
    unsigned queued = 0;
    while (_in_flight < _depth && !_backlog.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&_ring);
      if (sqe == nullptr) break;
      ReadRequest* request = _backlog.front();
      _backlog.pop_front();
      const std::uint64_t left = request->bytes - request->bytes_done;
      io_uring_prep_read(sqe, request->fd, request->destination + request->bytes_done,
                         static_cast<unsigned>(std::min(left, max_read_bytes)),
                         request->file_offset + request->bytes_done);
      io_uring_sqe_set_data(sqe, request);
      ++_in_flight;
      ++queued;
    }
    if (queued == 0) return;
    int rc;
    do {
      rc = io_uring_submit(&_ring);
    } while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) throw system_error(Errc::io, -rc, "io_uring_submit");
  }

  io_uring _ring{};
  int _event_fd = -1;
  unsigned _depth;
  unsigned _in_flight = 0;   // SQEs the kernel owns
  std::size_t _pending = 0;  // requests submitted and not yet reaped
  std::deque<ReadRequest*> _backlog;
};

}  // namespace

std::unique_ptr<Reader> make_uring_reader(unsigned queue_depth) {
  return std::make_unique<UringReader>(queue_depth);
}

}  // namespace weightcast
