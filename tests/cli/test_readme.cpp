// The docs stay in step with the code: the config key table (docs/config.md) with
// configs/default.yaml and the loader, the exit-status table (docs/exit-status.md) with `Errc`,
// the README's two commands, and every "docs/DESIGN.md § Section" cited in the sources with a
// section of docs/DESIGN.md.
#include "support/paths.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/core/error.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The `## ` headings of a Markdown text: the sections "§ Name" refers to.
std::set<std::string> sections(const std::string& markdown) {
  std::set<std::string> names;
  for (const std::string& line : lines_of(markdown)) {
    if (line.rfind("## ", 0) == 0) names.insert(line.substr(3));
  }
  return names;
}

// Every "§ Name" in @p text: a capitalised word, then lowercase-initial words, up to the
// first character that is neither (`§ Control plane).` names "Control plane"). "§5.12" (a
// clause of a standard) has no space and is not one.
std::vector<std::string> section_references(const std::string& text) {
  std::vector<std::string> refs;
  const std::regex ref(R"(§ ([A-Z][A-Za-z]*(?: [a-z][A-Za-z]*)*))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), ref); it != std::sregex_iterator();
       ++it) {
    refs.push_back((*it)[1]);
  }
  return refs;
}

}  // namespace

TEST_CASE("readme: the config table in docs/config.md lists every key of default.yaml and of "
          "the loader",
          "[readme][config]") {
  const auto table = read_source_file("docs/config.md");
  const auto from_yaml = yaml_keys(read_source_file("configs/default.yaml"));
  const auto from_code = yaml_keys(weightcast::Config{}.to_yaml());
  CHECK(from_yaml == from_code);
  for (const auto& key : from_code) {
    INFO("key " << key);
    CHECK(table.find("| `" + key + "` |") != std::string::npos);
  }
}

TEST_CASE("readme: the two commands at the top are intact", "[readme]") {
  const auto readme = read_source_file("README.md");
  CHECK(readme.find("```sh\nbash scripts/demo.sh\n```") != std::string::npos);
  CHECK(readme.find("```sh\nbash scripts/test.sh\n```") != std::string::npos);
}

TEST_CASE("readme: README.md stays a front page", "[readme]") {
  // Issue 17: at most ~150 lines, the reference material in docs/.
  const auto lines = lines_of(read_source_file("README.md"));
  CHECK(lines.size() <= 160);
}

TEST_CASE("readme: docs/exit-status.md has one row per exit status, and only those",
          "[readme]") {
  // The statuses are the `Errc` values (error.hpp), and 0; `to_string` names every `Errc`
  // and says "error" for any other value.
  std::set<int> expected{0};
  for (int value = 1; value < 256; ++value) {
    const auto code = static_cast<weightcast::Errc>(value);
    if (weightcast::to_string(code) != "error") expected.insert(weightcast::exit_status(code));
  }
  REQUIRE(expected.size() > 8);
  // A row: "| 64 | meaning |", or "| 130, 143 | ... |" for statuses sharing a meaning.
  std::set<int> listed;
  const std::regex row(R"(^\| ([0-9]+(?:, [0-9]+)*) \|)");
  std::smatch m;
  for (const std::string& line : lines_of(read_source_file("docs/exit-status.md"))) {
    if (!std::regex_search(line, m, row)) continue;
    std::istringstream numbers(m[1].str());
    for (std::string number; std::getline(numbers, number, ',');) {
      const int status = std::stoi(number);
      INFO("status " << status << " listed twice");
      CHECK(listed.insert(status).second);
    }
  }
  CHECK(listed == expected);
}

TEST_CASE("readme: every docs/DESIGN.md reference in the sources names one of its sections",
          "[readme]") {
  namespace fs = std::filesystem;
  const std::string design = read_source_file("docs/DESIGN.md");
  const std::set<std::string> names = sections(design);
  REQUIRE(names.count("Staging") == 1);

  // docs/DESIGN.md's own references first.
  for (const std::string& ref : section_references(design)) {
    INFO("docs/DESIGN.md refers to § " << ref);
    CHECK(names.count(ref) == 1);
  }

  const fs::path root(WEIGHTCAST_SOURCE_DIR);
  std::vector<fs::path> files{root / "CMakeLists.txt"};
  for (const char* dir : {"include", "src", "tools", "tests", "examples", "bench", "fuzz"}) {
    if (!fs::is_directory(root / dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = entry.path().extension();
      if (entry.is_regular_file() &&
          (ext == ".hpp" || ext == ".cpp" || ext == ".txt" || ext == ".sh" || ext == ".py")) {
        files.push_back(entry.path());
      }
    }
  }
  std::size_t cited = 0;
  for (const fs::path& file : files) {
    if (file.filename() == "test_readme.cpp") continue;  // this file quotes the forms
    const auto lines = lines_of(weightcast::test::read_file(file));
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i];
      if (line.find("DESIGN.md") == std::string::npos) continue;
      INFO(fs::relative(file, root).string() << ":" << i + 1 << ": " << line);
      // One form: "docs/DESIGN.md § Section", on one line, so that a reader (and this test)
      // finds the section; the founding sketch's "DESIGN.md layer N" has no such section.
      CHECK(line.find("docs/DESIGN.md") != std::string::npos);
      CHECK(line.find("DESIGN.md layer") == std::string::npos);
      const auto refs = section_references(line.substr(line.find("DESIGN.md")));
      CHECK(!refs.empty());
      for (const std::string& ref : refs) {
        INFO("§ " << ref);
        CHECK(names.count(ref) == 1);
        ++cited;
      }
    }
  }
  CHECK(cited >= 10);
}
