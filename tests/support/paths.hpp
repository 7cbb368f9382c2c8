// Where the tests find the corpus, the CLI binary and scratch space.
#pragma once

#include <filesystem>
#include <string>
#include <utility>

namespace weightcast::test {

/// The marker line of a test skipped for want of the external corpus. ctest reports a test
/// whose output holds it as skipped (SKIP_REGULAR_EXPRESSION, tests/CMakeLists.txt).
inline constexpr const char* corpus_skip_marker = "SKIPPED: test corpus not found";

/// The external test corpus (real files from public repositories, and the format's cases):
/// `$WEIGHTCAST_CORPUS` if set, else `../shared/corpus` beside the source tree
/// (docs/install.md, scripts/fetch_corpus.sh). `corpus_dir() / "real"` is that part of it.
class CorpusDir {
 public:
  explicit CorpusDir(std::filesystem::path root) : _root(std::move(root)) {}
  /// @return the corpus's @p part ("real", "malformed", ...) when it is there. When it is not,
  ///         ends the running test: skipped (it WARNs corpus_skip_marker and the reason, then
  ///         aborts the test case without a failure); FAILs instead when
  ///         `WEIGHTCAST_CORPUS` names no directory at all (a typo is not a skip), or when
  ///         `WEIGHTCAST_REQUIRE_CORPUS=1` (CI: .ci/run) says the corpus must be there.
  std::filesystem::path operator/(const std::filesystem::path& part) const;

 private:
  std::filesystem::path _root;
};

/// @return where the corpus is looked for (see CorpusDir); the test goes on only through
///         `corpus_dir() / part`, which checks that part is there.
CorpusDir corpus_dir();

/// A small valid checkpoint the suite writes itself, for tests that need any checkpoint and
/// not a particular real one: `model.safetensors`, 4 F32 tensors laid out as a two-layer MLP
/// (fc1.bias [20], fc1.weight [20, 10], fc2.bias [10], fc2.weight [10, 20]: 1720 bytes of
/// tensor data, fixed pseudo-random values), the shapes of the corpus's
/// CoffeeVampir3__Model-Saving-Test-Repo/model.safetensors. Written once per test process into
/// a temporary directory removed at exit; callers must not change it.
std::filesystem::path small_checkpoint();

/// The whole of @p path as bytes; empty when it cannot be opened (a /proc or /sys file
/// that vanished or does not exist here). Callers that need the file REQUIRE it non-empty.
std::string read_file(const std::filesystem::path& path);
/// Path of the `weightcast` launcher: $WEIGHTCAST_CLI if set, else the one this build made.
std::filesystem::path cli_path();

/// A fresh empty directory under $TMPDIR, removed when the object is destroyed.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "weightcast-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return _path; }
  std::filesystem::path operator/(const std::string& name) const { return _path / name; }

 private:
  std::filesystem::path _path;
};

}  // namespace weightcast::test
