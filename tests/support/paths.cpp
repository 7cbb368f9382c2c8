#include "support/paths.hpp"

#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <random>
#include <utility>
#include <vector>

namespace weightcast::test {

namespace {

bool corpus_required() {
  const char* env = std::getenv("WEIGHTCAST_REQUIRE_CORPUS");
  return env != nullptr && *env != '\0' && std::string_view(env) != "0";
}

bool corpus_named() {
  const char* env = std::getenv("WEIGHTCAST_CORPUS");
  return env != nullptr && *env != '\0';
}

}  // namespace

CorpusDir corpus_dir() {
  if (corpus_named()) return CorpusDir(std::getenv("WEIGHTCAST_CORPUS"));
  return CorpusDir(std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / ".." / "shared" / "corpus");
}

std::filesystem::path CorpusDir::operator/(const std::filesystem::path& part) const {
  const std::filesystem::path dir = _root / part;
  // A part is there when what its tests read first is: a corpus fetched without a copy of
  // the corpus's own files (scripts/fetch_corpus.sh) has real/ but no MANIFEST.json.
  std::filesystem::path needed = dir;
  if (part == "real") {
    needed /= "MANIFEST.json";
  } else if (part == "malformed" || part == "sharded" || part == "real-negative") {
    needed /= "expected.json";
  }
  std::error_code ec;
  if (std::filesystem::exists(needed, ec)) return std::filesystem::canonical(dir);
  const std::string where = needed.lexically_normal().string();
  if (corpus_named() && !std::filesystem::is_directory(_root, ec)) {
    FAIL("test corpus not found at " << where << ": WEIGHTCAST_CORPUS names "
         << _root.string() << ", which is not a directory");
  }
  if (corpus_required()) {
    FAIL("test corpus not found at " << where << ", and WEIGHTCAST_REQUIRE_CORPUS="
         << std::getenv("WEIGHTCAST_REQUIRE_CORPUS") << " requires it (set WEIGHTCAST_CORPUS,"
         " or put the corpus at ../shared/corpus beside the source tree)");
  }
  // Catch2 v2 has no SKIP: the marker makes ctest report the test skipped, and throwing the
  // exception REQUIRE throws ends the test case without recording a failure.
  WARN(corpus_skip_marker << " at " << where << " (set WEIGHTCAST_CORPUS, or fetch the corpus "
       "with scripts/fetch_corpus.sh: docs/install.md)");
  throw Catch::TestFailureException();
}

std::filesystem::path small_checkpoint() {
  static const TempDir dir("weightcast-small-checkpoint");
  static const std::filesystem::path path = [] {
    const std::filesystem::path file = dir / "model.safetensors";
    // Names in the order the safetensors writer sorts them, data in that order.
    const std::vector<std::pair<std::string, std::vector<std::uint64_t>>> tensors{
        {"fc1.bias", {20}}, {"fc1.weight", {20, 10}}, {"fc2.bias", {10}}, {"fc2.weight", {10, 20}}};
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    std::mt19937 rng(17);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (const auto& [name, shape] : tensors) {
      std::uint64_t elements = 1;
      for (const auto extent : shape) elements *= extent;
      const std::size_t begin = data.size();
      for (std::uint64_t i = 0; i < elements; ++i) {
        const float v = value(rng);
        data.append(reinterpret_cast<const char*>(&v), sizeof v);  // little-endian host
      }
      header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    }
    write_file(file, make_safetensors(header.dump(), data));
    return file;
  }();
  return path;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::filesystem::path cli_path() {
  // A relocated test binary (tests/gpu/gpu_bundle.sh's bundle) names the launcher beside it.
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
