// The io_uring reader, the shared short-read rule, and the back-end choice (`reader:`).
#include "weightcast/io/reader.hpp"

#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <liburing.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

namespace weightcast {

namespace detail {

ReadStep advance(ReadRequest& request, long long res) noexcept {
  const std::uint64_t required = request.required_bytes == 0 ? request.bytes
                                                             : request.required_bytes;
  if (res == -EINTR || res == -EAGAIN) return ReadStep::again;
  if (res < 0) {
    request.error = static_cast<int>(-res);
    return ReadStep::finished;
  }
  if (res == 0) {
    request.end_of_file = request.bytes_done < required;
    return ReadStep::finished;
  }
  request.bytes_done += static_cast<std::uint64_t>(res);
  if (request.bytes_done >= request.bytes) return ReadStep::finished;
  // A short read. With O_DIRECT it ends off the alignment only at the end of the file, and
  // asking again from there would fail with EINVAL rather than report the end.
  const std::uint32_t alignment = std::max<std::uint32_t>(request.alignment, 1);
  if (request.bytes_done % alignment != 0) {
    request.end_of_file = request.bytes_done < required;
    return ReadStep::finished;
  }
  return ReadStep::again;
}

}  // namespace detail

namespace {

// The kernel caps one read at 0x7ffff000 bytes; stay well below so a chunk of any size works.
// A multiple of every O_DIRECT alignment, so the pieces of a large read stay aligned.
constexpr std::uint64_t max_read_bytes = 1ull << 30;
// io_uring refuses a registered buffer over 1 GiB.
constexpr std::uint64_t max_fixed_buffer_bytes = 1ull << 30;

class UringReader final : public Reader {
 public:
  explicit UringReader(unsigned queue_depth) : _depth(std::max(queue_depth, static_cast<unsigned>(setting::io_depth.min))) {
    int rc = io_uring_queue_init(_depth, &_ring, 0);
    if (rc < 0) throw system_error(Errc::unavailable, -rc, "io_uring unavailable: io_uring_setup");
    // Probe before relying on an opcode: IORING_OP_READ came in 5.6, READ_FIXED in 5.1.
    if (io_uring_probe* probe = io_uring_get_probe_ring(&_ring)) {
      const bool read_ok = io_uring_opcode_supported(probe, IORING_OP_READ) != 0;
      _read_fixed_ok = io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) != 0;
      io_uring_free_probe(probe);
      if (!read_ok) {
        io_uring_queue_exit(&_ring);
        throw Error(Errc::unavailable,
                    "io_uring unavailable: the kernel lacks IORING_OP_READ (Linux < 5.6)");
      }
    }
    _event_fd.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (_event_fd.get() < 0) {
      int err = errno;
      io_uring_queue_exit(&_ring);
      throw system_error(Errc::internal, err, "eventfd");
    }
    rc = io_uring_register_eventfd(&_ring, _event_fd.get());
    if (rc < 0) {
      _event_fd.reset();
      io_uring_queue_exit(&_ring);
      throw system_error(Errc::unavailable, -rc, "io_uring unavailable: register eventfd");
    }
  }

  ~UringReader() override {
    // Reads still in flight write into staging slots the caller is about to free: wait for
    // every one of them before the ring (and then the slots) go away. Only reads the kernel
    // accepted complete; SQEs it never took stay unsent (waiting submits nothing).
    while (_in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&_ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        // The log facility, never stderr directly (an embedder may have replaced the sink).
        spdlog::error("io_uring_wait_cqe during shutdown: {}", rc);
        break;
      }
      io_uring_cqe_seen(&_ring, cqe);
      --_in_flight;
    }
    io_uring_queue_exit(&_ring);  // also drops registered buffers and files
    _event_fd.reset();            // after the ring, which signalled it
  }

  UringReader(const UringReader&) = delete;
  UringReader& operator=(const UringReader&) = delete;

  [[nodiscard]] std::string_view name() const noexcept override { return "io_uring"; }
  [[nodiscard]] int completion_fd() const noexcept override { return _event_fd.get(); }
  [[nodiscard]] std::size_t pending() const noexcept override { return _pending; }

  [[nodiscard]] bool completed(const ReadRequest& request) noexcept override {
    unsigned head = 0;
    io_uring_cqe* cqe = nullptr;
    io_uring_for_each_cqe(&_ring, head, cqe) {
      if (io_uring_cqe_get_data(cqe) == &request) return true;
    }
    return false;
  }

  bool register_buffers(std::span<const std::span<std::byte>> buffers) override {
    if (!_read_fixed_ok || buffers.empty()) return false;
    std::vector<iovec> iovecs;
    for (const auto& buffer : buffers) {
      if (buffer.size() > max_fixed_buffer_bytes) {
        spdlog::debug("io_uring: staging slots of {} bytes exceed the 1 GiB of a fixed buffer; "
                      "reading without registered buffers",
                      buffer.size());
        return false;
      }
      iovecs.push_back(iovec{buffer.data(), buffer.size()});
    }
    // Registration pins the pages and counts them against RLIMIT_MEMLOCK (without
    // CAP_IPC_LOCK); a refusal only costs the per-read pinning it would have saved.
    const int rc = io_uring_register_buffers(&_ring, iovecs.data(),
                                             static_cast<unsigned>(iovecs.size()));
    if (rc < 0) {
      spdlog::debug("io_uring: registering {} staging slots failed ({}); reading without "
                    "registered buffers",
                    iovecs.size(), std::strerror(-rc));
      return false;
    }
    _buffers.assign(buffers.begin(), buffers.end());
    return true;
  }

  bool register_files(std::span<const int> fds) override {
    if (fds.empty()) return false;
    const int rc = io_uring_register_files(&_ring, fds.data(), static_cast<unsigned>(fds.size()));
    if (rc < 0) {
      spdlog::debug("io_uring: registering {} shard files failed ({}); using plain fds",
                    fds.size(), std::strerror(-rc));
      return false;
    }
    _files.assign(fds.begin(), fds.end());
    return true;
  }

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
    [[maybe_unused]] auto ignored = read(_event_fd.get(), &counter, sizeof counter);
    std::size_t appended = 0;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&_ring, &cqe) == 0) {
      auto* request = static_cast<ReadRequest*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&_ring, cqe);
      --_in_flight;
      if (detail::advance(*request, res) == detail::ReadStep::again) {
        _backlog.push_front(request);  // the rest (or a retry) goes again, first
      } else {
        finished.push_back(request);
        ++appended;
      }
    }
    fill_and_submit();
    // Requests a failed io_uring_submit never sent (this call's own included).
    finished.insert(finished.end(), _failed.begin(), _failed.end());
    appended += _failed.size();
    _failed.clear();
    _pending -= appended;
    return appended;
  }

 private:
  // @return the registered buffer holding [data, data + bytes), or -1.
  [[nodiscard]] int buffer_index(const std::byte* data, std::uint64_t bytes) const noexcept {
    for (std::size_t i = 0; i < _buffers.size(); ++i) {
      const std::byte* begin = _buffers[i].data();
      if (data >= begin && data + bytes <= begin + _buffers[i].size()) return static_cast<int>(i);
    }
    return -1;
  }

  [[nodiscard]] int file_index(int fd) const noexcept {
    for (std::size_t i = 0; i < _files.size(); ++i) {
      if (_files[i] == fd) return static_cast<int>(i);
    }
    return -1;
  }

  // Prepares SQEs for the backlog and submits them. Only what io_uring_submit says the
  // kernel took is in flight: a short submit leaves the rest in the SQ ring, offered again
  // at once, or at the next reap where the kernel is short of resources (EAGAIN, EBUSY)
  // while reads in flight will free some. Any other failure, or that one with nothing in
  // flight (no completion would ever come to retry from), fails the requests not taken.
  void fill_and_submit() {
    if (_submit_error != 0) {
      fail_unsent();
      return;
    }
    while (_in_flight + _unsent.size() < _depth && !_backlog.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&_ring);
      if (sqe == nullptr) break;
      ReadRequest* request = _backlog.front();
      _backlog.pop_front();
      const std::uint64_t left = request->bytes - request->bytes_done;
      const auto bytes = static_cast<unsigned>(std::min(left, max_read_bytes));
      std::byte* destination = request->destination + request->bytes_done;
      const std::uint64_t offset = request->file_offset + request->bytes_done;
      const int file = file_index(request->fd);
      const int fd = file >= 0 ? file : request->fd;
      const int buffer = buffer_index(destination, bytes);
      if (buffer >= 0) {
        io_uring_prep_read_fixed(sqe, fd, destination, bytes, offset, buffer);
      } else {
        io_uring_prep_read(sqe, fd, destination, bytes, offset);
      }
      if (file >= 0) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data(sqe, request);
      _unsent.push_back(request);
    }
    while (!_unsent.empty()) {
      const int rc = io_uring_submit(&_ring);
      if (rc == -EINTR) continue;
      if (rc > 0) {
        // The kernel takes SQEs in ring order.
        const auto taken = std::min<std::size_t>(static_cast<std::size_t>(rc), _unsent.size());
        _unsent.erase(_unsent.begin(), _unsent.begin() + static_cast<std::ptrdiff_t>(taken));
        _in_flight += static_cast<unsigned>(taken);
        continue;
      }
      const bool short_of_resources = rc == 0 || rc == -EAGAIN || rc == -EBUSY;
      if (short_of_resources && _in_flight > 0) return;
      _submit_error = rc == 0 ? EAGAIN : -rc;
      spdlog::debug("io_uring_submit: {} ({} reads in flight): failing {} reads not submitted",
                    std::strerror(_submit_error), _in_flight, _unsent.size() + _backlog.size());
      fail_unsent();
      return;
    }
  }

  // After a failed io_uring_submit: the SQEs the kernel did not take stay in the SQ ring, so
  // nothing is submitted again (it would send them too, into slots already given back). Every
  // request not in flight fails with the submit's errno; reap() returns them, woken by the
  // eventfd.
  void fail_unsent() {
    if (_unsent.empty() && _backlog.empty()) return;
    for (std::deque<ReadRequest*>* queue : {&_unsent, &_backlog}) {
      for (ReadRequest* request : *queue) {
        request->error = _submit_error;
        _failed.push_back(request);
      }
      queue->clear();
    }
    [[maybe_unused]] const int ignored = eventfd_write(_event_fd.get(), 1);
  }

  io_uring _ring{};
  detail::UniqueFd _event_fd;
  unsigned _depth;
  bool _read_fixed_ok = false;
  unsigned _in_flight = 0;   // SQEs the kernel took (io_uring_submit's count), not reaped
  std::size_t _pending = 0;  // requests submitted and not yet reaped
  int _submit_error = 0;     // errno of a failed io_uring_submit; then nothing is sent again
  std::deque<ReadRequest*> _unsent;   // in SQEs of the SQ ring the kernel has not taken, in order
  std::vector<ReadRequest*> _failed;  // never sent (_submit_error), for the next reap()
  std::deque<ReadRequest*> _backlog;
  std::vector<std::span<std::byte>> _buffers;  // registered, by buffer index
  std::vector<int> _files;                     // registered, by file index
};

}  // namespace

std::unique_ptr<Reader> make_uring_reader(unsigned queue_depth) {
  return std::make_unique<UringReader>(queue_depth);
}

std::unique_ptr<Reader> make_reader(ReaderKind kind, unsigned queue_depth) {
  switch (kind) {
    case ReaderKind::uring:
      try {
        return make_uring_reader(queue_depth);
      } catch (const Error& e) {
        if (e.code() != Errc::unavailable) throw;
        throw Error(Errc::unavailable,
                    fmt::format("reader: uring: {} (use reader: auto or pread)", e.what()));
      }
    case ReaderKind::pread:
      return make_pread_reader(queue_depth);
    case ReaderKind::automatic:
      break;
  }
  try {
    return make_uring_reader(queue_depth);
  } catch (const Error& e) {
    if (e.code() != Errc::unavailable) throw;
    spdlog::warn("{}; reading with a pread thread pool instead", e.what());
    return make_pread_reader(queue_depth);
  }
}

}  // namespace weightcast
