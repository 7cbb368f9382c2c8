// A minimal "trainer" that loads a checkpoint with weightcast, in the two embedding forms:
//
//   trainer CHECKPOINT              the blocking call, weightcast::load()
//   trainer --coroutine CHECKPOINT  weightcast::async_load() on the trainer's own Asio loop,
//                                   while another coroutine of the trainer keeps running
//
// It prints the tensor count, the bytes loaded, and the first bytes of one tensor.
#include <weightcast/distributed/asio.hpp>
#include <weightcast/core/error.hpp>
#include <weightcast/pipeline/loader.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>

namespace asio = boost::asio;

namespace {

void print_result(const weightcast::LoadResult& result) {
  std::printf("tensors: %zu\n", result.catalogue.tensors.size());
  std::printf("bytes: %llu\n", static_cast<unsigned long long>(result.stats.bytes));
  // The first tensor that has bytes: a view into the arena (host memory here).
  for (std::size_t i = 0; i < result.catalogue.tensors.size(); ++i) {
    const weightcast::TensorView view = result.tensor(i);
    if (view.info->bytes == 0) continue;
    std::printf("first tensor: %s %s, %llu bytes, first bytes:", view.info->name.c_str(),
                std::string(weightcast::dtype_name(view.info->dtype)).c_str(),
                static_cast<unsigned long long>(view.info->bytes));
    for (std::uint64_t b = 0; b < std::min<std::uint64_t>(8, view.info->bytes); ++b) {
      std::printf(" %02x", static_cast<unsigned>(view.data[b]));
    }
    std::printf("\n");
    break;
  }
}

// The trainer's own work on the same io_context: it keeps ticking while chunks stream.
asio::awaitable<void> heartbeat(const bool& done, int& ticks) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (!done) {
    timer.expires_after(std::chrono::milliseconds(1));
    co_await timer.async_wait(asio::use_awaitable);
    ++ticks;
  }
}

asio::awaitable<weightcast::LoadResult> load_with_coroutine(std::string checkpoint, bool& done) {
  // The device and transport must outlive the awaitable: they live in this frame.
  auto device = weightcast::make_host_device();
  auto transport = weightcast::make_local_transport();
  weightcast::LoadOptions options;
  options.chunk_bytes = 1 << 20;
  auto result = co_await weightcast::async_load(weightcast::open_checkpoint(checkpoint),
                                                *device, *transport, options);
  done = true;
  co_return result;
}

}  // namespace

int main(int argc, char** argv) {
  const bool coroutine = argc == 3 && std::string(argv[1]) == "--coroutine";
  if (argc != 2 && !coroutine) {
    std::fprintf(stderr, "usage: trainer [--coroutine] CHECKPOINT\n");
    return 64;
  }
  const std::string checkpoint = argv[argc - 1];
  try {
    if (!coroutine) {
      weightcast::LoadOptions options;
      options.chunk_bytes = 1 << 20;
      const weightcast::LoadResult result = weightcast::load(checkpoint, options);
      std::printf("mode: blocking\n");
      print_result(result);
      return 0;
    }
    asio::io_context context;
    bool done = false;
    int ticks = 0;
    std::exception_ptr failure;
    std::optional<weightcast::LoadResult> result;
    asio::co_spawn(context, heartbeat(done, ticks), asio::detached);
    asio::co_spawn(context, load_with_coroutine(checkpoint, done),
                   [&](std::exception_ptr e, weightcast::LoadResult r) {
                     done = true;
                     if (e) failure = e; else result.emplace(std::move(r));
                   });
    context.run();
    if (failure) std::rethrow_exception(failure);
    std::printf("mode: coroutine (the trainer's heartbeat ticked %d times meanwhile)\n", ticks);
    print_result(*result);
    return 0;
  } catch (const weightcast::Error& e) {
    // Its <sysexits.h> status: 66 for a missing checkpoint, 65 for a malformed one, 74 for
    // a failed read, ... (weightcast/core/error.hpp).
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return weightcast::exit_status(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trainer: %s\n", e.what());
    return 70;  // EX_SOFTWARE
  }
}
