// Sets (or unsets) environment variables for one scope, restoring the old values after.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace weightcast::test {

/// RAII: `ScopedEnv env({{"RANK", "1"}, {"WORLD_SIZE", std::nullopt}})` sets RANK and unsets
/// WORLD_SIZE until `env` is destroyed. Not thread-safe (setenv is not).
class ScopedEnv {
 public:
  using Entry = std::pair<std::string, std::optional<std::string>>;
  explicit ScopedEnv(const std::vector<Entry>& entries);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<Entry> _saved;
};

/// The variables every launcher family sets, all unset: a clean slate for world tests.
std::vector<ScopedEnv::Entry> no_launcher_env();

}  // namespace weightcast::test
