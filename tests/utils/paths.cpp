#include "utils/paths.hpp"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <random>

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

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::filesystem::path cli_path() { return WEIGHTCAST_CLI_PATH; }

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
