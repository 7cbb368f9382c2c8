#include "utils/host_load.hpp"

#include "utils/expect_error.hpp"

#include "weightcast/device.hpp"
#include "weightcast/transport.hpp"

#include <filesystem>

namespace weightcast::test {

void truncate_shard(Catalogue& catalogue, std::uint64_t file_bytes) {
  std::filesystem::resize_file(catalogue.shards[0].path, file_bytes);
  catalogue.shards[0].file_bytes = file_bytes;
}

Error expect_host_load_error(const Catalogue& catalogue, const LoadOptions& options) {
  auto device = make_host_device();
  auto transport = make_local_transport();
  return expect_error([&] { load(catalogue, *device, *transport, options); });
}

}  // namespace weightcast::test
