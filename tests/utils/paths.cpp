#include "utils/paths.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <random>

namespace weightcast::test {

std::filesystem::path corpus_dir() {
  std::filesystem::path dir;
  if (const char* env = std::getenv("WEIGHTCAST_CORPUS"); env != nullptr && *env != '\0') {
    dir = env;
  } else {
    dir = std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / ".." / "shared" / "corpus";
  }
  if (!std::filesystem::is_directory(dir / "real")) {
    FAIL("test corpus not found at " << dir.string()
         << " (expected ../shared/corpus beside the source tree, or set WEIGHTCAST_CORPUS)");
  }
  return std::filesystem::canonical(dir);
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::filesystem::path cli_path() {
  // A relocated test binary (bench/gpu_bundle.sh's bundle) names the launcher beside it.
  if (const char* env = std::getenv("WEIGHTCAST_CLI"); env != nullptr && *env != '\0') return env;
  return WEIGHTCAST_CLI_PATH;
}

TempDir::TempDir(const std::string& prefix) {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / (prefix + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      _path = candidate;
      return;
    }
  }
  FAIL("cannot create a temporary directory under " << base.string());
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(_path, ec);
}

}  // namespace weightcast::test
