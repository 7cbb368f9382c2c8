// Fuzzes the index parser (`model.safetensors.index.json`): the input is the index file.
// Every input must parse into entries that stay inside the checkpoint directory, or throw
// weightcast::Error with a one-line message.
#include "weightcast/checkpoint/detail/index.hpp"
#include "weightcast/core/error.hpp"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

fs::path scratch_dir() {
  const char* tmp = std::getenv("TMPDIR");
  fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") /
                 ("weightcast-fuzz-index-" + std::to_string(getpid())) / "ckpt";
  fs::create_directories(dir);
  return fs::canonical(dir);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fs::path dir = scratch_dir();
  const fs::path index = dir / "model.safetensors.index.json";
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    for (const auto& entry : weightcast::detail::read_index(index)) {
      // Every accepted shard path is a plain name directly inside the directory.
      if (entry.shard_path.parent_path() != dir) std::abort();
    }
  } catch (const weightcast::Error& e) {
    const std::string message = e.what();
    if (message.empty() || message.find('\n') != std::string::npos) std::abort();
  }
  return 0;
}
