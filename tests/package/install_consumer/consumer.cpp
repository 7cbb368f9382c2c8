// A trainer's own Boost.Asio code beside weightcast's: the deprecated `io_service` and
// `io_service::work` (gone under BOOST_ASIO_NO_DEPRECATED, which weightcast's own build sets
// and must not pass on), a coroutine load on that io_service, and each tensor's digest.
//
//   consumer CHECKPOINT   prints "tensors: N", then "NAME XXH3" per tensor in catalogue order
#include <weightcast/distributed/asio.hpp>
#include <weightcast/pipeline/digest.hpp>
#include <weightcast/pipeline/loader.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_service.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

#if __cplusplus < 202002L
#error "weightcast::weightcast must bring C++20 (cxx_std_20) to a consumer that sets none"
#endif
#if defined(BOOST_ASIO_NO_DEPRECATED) || defined(OMPI_SKIP_MPICXX) || \
    defined(MPICH_SKIP_MPICXX) || defined(WEIGHTCAST_HAVE_MPI) || defined(WEIGHTCAST_HAVE_CUDA)
#error "weightcast::weightcast passes on a compile definition of its own build"
#endif

namespace asio = boost::asio;

namespace {

asio::awaitable<weightcast::LoadResult> load(std::string checkpoint) {
  auto device = weightcast::make_host_device();
  auto transport = weightcast::make_local_transport();
  weightcast::LoadOptions options;
  options.chunk_bytes = 64 << 10;  // several chunks even for a small checkpoint
  co_return co_await weightcast::async_load(weightcast::open_checkpoint(checkpoint), *device,
                                            *transport, options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer CHECKPOINT\n");
    return 64;
  }
  asio::io_service service;
  std::optional<asio::io_service::work> work(service);
  std::exception_ptr failure;
  std::optional<weightcast::LoadResult> result;
  asio::co_spawn(service, load(argv[1]),
                 [&](std::exception_ptr e, weightcast::LoadResult r) {
                   if (e) failure = e; else result.emplace(std::move(r));
                   work.reset();
                 });
  service.run();
  try {
    if (failure) std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  const auto digests = weightcast::tensor_digests(*result);
  std::printf("tensors: %zu\n", result->catalogue.tensors.size());
  for (std::size_t i = 0; i < digests.size(); ++i) {
    std::printf("%s %s\n", result->catalogue.tensors[i].name.c_str(),
                weightcast::digest_hex(digests[i]).c_str());
  }
  return 0;
}
