// Where the tests find the corpus, the CLI binary and scratch space.
#pragma once

#include <filesystem>
#include <string>

namespace weightcast::test {

/// The shared corpus: $WEIGHTCAST_CORPUS if set, else ../shared/corpus beside the source tree.
/// FAILs the running test (never skips) when the directory is missing.
std::filesystem::path corpus_dir();

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
