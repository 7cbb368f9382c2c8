// The argv and environment that weightcast launch (and the tests' spawner) hand to execve.
#include "weightcast/core/detail/exec_image.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

using weightcast::detail::ExecImage;

namespace {

std::vector<std::string> strings(char* const* list) {
  std::vector<std::string> out;
  for (; *list != nullptr; ++list) out.emplace_back(*list);
  return out;
}

}  // namespace

TEST_CASE("an exec image keeps argv and overrides only the environment keys it is given",
          "[launch]") {
  REQUIRE(setenv("WEIGHTCAST_TEST_KEEP", "kept", 1) == 0);
  REQUIRE(setenv("WEIGHTCAST_TEST_RANK", "old", 1) == 0);
  REQUIRE(setenv("WEIGHTCAST_TEST_RANK_LONGER", "prefix", 1) == 0);
  const ExecImage image({"/bin/prog", "--flag", "value with spaces"},
                        {"WEIGHTCAST_TEST_RANK=2", "WEIGHTCAST_TEST_NEW=x=y"});
  CHECK(strings(image.argv()) ==
        std::vector<std::string>{"/bin/prog", "--flag", "value with spaces"});

  const auto env = strings(image.envp());
  auto count = [&](const std::string& entry) { return std::count(env.begin(), env.end(), entry); };
  auto count_key = [&](const std::string& key) {
    return std::count_if(env.begin(), env.end(),
                         [&](const std::string& e) { return e.rfind(key + "=", 0) == 0; });
  };
  CHECK(count("WEIGHTCAST_TEST_KEEP=kept") == 1);
  CHECK(count("WEIGHTCAST_TEST_RANK=2") == 1);
  CHECK(count_key("WEIGHTCAST_TEST_RANK") == 1);  // the old value is gone, not doubled
  CHECK(count("WEIGHTCAST_TEST_RANK_LONGER=prefix") == 1);  // a longer key is another key
  CHECK(count("WEIGHTCAST_TEST_NEW=x=y") == 1);  // the value may hold '='
  unsetenv("WEIGHTCAST_TEST_KEEP");
  unsetenv("WEIGHTCAST_TEST_RANK");
  unsetenv("WEIGHTCAST_TEST_RANK_LONGER");
}

TEST_CASE("an exec image entry without '=' replaces only its own key, not the environment",
          "[launch]") {
  // The key was the text up to and including '='; without one that was "", a prefix of
  // every entry, and the child got an environment of that one entry (no PATH, no HOME).
  REQUIRE(setenv("WEIGHTCAST_TEST_KEEP", "kept", 1) == 0);
  REQUIRE(setenv("WEIGHTCAST_TEST_BARE", "old", 1) == 0);
  const ExecImage image({"/bin/prog"}, {"WEIGHTCAST_TEST_BARE"});
  const auto env = strings(image.envp());
  auto count = [&](const std::string& entry) { return std::count(env.begin(), env.end(), entry); };
  CHECK(count("WEIGHTCAST_TEST_KEEP=kept") == 1);
  CHECK(count("WEIGHTCAST_TEST_BARE=old") == 0);
  CHECK(count("WEIGHTCAST_TEST_BARE") == 1);
  unsetenv("WEIGHTCAST_TEST_KEEP");
  unsetenv("WEIGHTCAST_TEST_BARE");
}
