// The README's config reference stays in step with configs/default.yaml and the key table.
#include "utils/paths.hpp"
#include "weightcast/config.hpp"

#include <catch2/catch.hpp>

#include <regex>
#include <set>
#include <sstream>

namespace {

std::string read_source_file(const std::string& relative) {
  std::string text = weightcast::test::read_file(std::string(WEIGHTCAST_SOURCE_DIR) + "/" + relative);
  REQUIRE(!text.empty());
  return text;
}

// Top-level `key: value` lines of a YAML text (the effective config or default.yaml).
std::set<std::string> yaml_keys(const std::string& yaml) {
  std::set<std::string> keys;
  std::istringstream lines(yaml);
  const std::regex key_line(R"(^([a-z_][a-z_.]*):)");
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_search(line, m, key_line)) keys.insert(m[1]);
  }
  return keys;
}

}  // namespace

TEST_CASE("readme: the config table lists every key of default.yaml and of the loader",
          "[readme][config]") {
  const auto readme = read_source_file("README.md");
  const auto from_yaml = yaml_keys(read_source_file("configs/default.yaml"));
  const auto from_code = yaml_keys(weightcast::Config{}.to_yaml());
  CHECK(from_yaml == from_code);
  for (const auto& key : from_code) {
    INFO("key " << key);
    CHECK(readme.find("| `" + key + "` |") != std::string::npos);
  }
}

TEST_CASE("readme: the two commands at the top are intact", "[readme]") {
  const auto readme = read_source_file("README.md");
  CHECK(readme.find("```sh\nbash scripts/demo.sh\n```") != std::string::npos);
  CHECK(readme.find("```sh\nbash scripts/test.sh\n```") != std::string::npos);
}
