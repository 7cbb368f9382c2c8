#include "support/report.hpp"

#include "support/paths.hpp"

#include <catch2/catch.hpp>

#include <fstream>

namespace weightcast::test {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  INFO("reading " << path.string());
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

nlohmann::json corpus_manifest() { return read_json(corpus_dir() / "real" / "MANIFEST.json"); }

ProcessResult run_corpus_file(const std::string& file, const std::filesystem::path& report_path,
                              const std::vector<std::string>& sets) {
  std::vector<std::string> args{"run", "--set",
                                "checkpoint=" + (corpus_dir() / "real" / file).string(), "--set",
                                "chunk_size=4KiB"};
  for (const auto& item : sets) {
    args.emplace_back("--set");
    args.push_back(item);
  }
  args.emplace_back("--report");
  args.push_back(report_path.string());
  auto result = run_cli(args);
  INFO(result.out << result.err);
  REQUIRE(result.exit_status == 0);
  return result;
}

void check_report_matches_manifest(const nlohmann::json& report, const nlohmann::json& expected) {
  REQUIRE(report["tensors"].size() == expected.size());
  for (const auto& [name, entry] : expected.items()) {
    INFO("tensor " << name);
    REQUIRE(report["tensors"].contains(name));
    const auto& got = report["tensors"][name];
    CHECK(got["xxh3"] == entry["xxh3"]);
    CHECK(got["dtype"] == entry["dtype"]);
    CHECK(got["shape"] == entry["shape"]);
  }
}

}  // namespace weightcast::test
