#include "support/host_load.hpp"

#include "support/expect_error.hpp"

#include "weightcast/device/device.hpp"
#include "weightcast/transport/transport.hpp"

#include <catch2/catch.hpp>

#include <filesystem>
#include <sys/stat.h>

namespace weightcast::test {

void truncate_shard(Catalogue& catalogue, std::uint64_t file_bytes) {
  std::filesystem::resize_file(catalogue.shards[0].path, file_bytes);
  catalogue.shards[0].file_bytes = file_bytes;
  // And its times, which the cut moved: the load's open-time check passes, so the reader
  // itself meets the end of the file.
  struct stat st {};
  REQUIRE(::stat(catalogue.shards[0].path.c_str(), &st) == 0);
  catalogue.shards[0].modified_ns = st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec;
  catalogue.shards[0].changed_ns = st.st_ctim.tv_sec * 1'000'000'000LL + st.st_ctim.tv_nsec;
}

Error expect_host_load_error(const Catalogue& catalogue, const LoadOptions& options) {
  auto device = make_host_device();
  auto transport = make_local_transport();
  return expect_error([&] { load(catalogue, *device, *transport, options); });
}

}  // namespace weightcast::test
