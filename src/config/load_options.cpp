// LoadOptions from the launcher's configuration: the config layer reads `Config`, so the
// pipeline's options are filled here, above the pipeline, not in it.
#include "weightcast/config/load_options.hpp"

namespace weightcast {

LoadOptions load_options(const Config& config) {
  LoadOptions options;
  options.chunk_bytes = config.chunk_bytes;
  options.buffer_depth = config.buffer_depth;
  options.io_depth = config.io_depth;
  options.timeout = config.timeout;
  options.direct_io = config.direct_io;
  options.reader = config.reader;
  options.destination = config.destination;
  options.digest_discarded = config.verify == Verify::digest;
  return options;
}

}  // namespace weightcast
