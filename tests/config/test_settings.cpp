// The settings registry: one default and one set of bounds per setting, which configs/
// default.yaml restates, and one message for one bad value from every surface.
#include "weightcast/config/config.hpp"
#include "weightcast/config/detail/config_parts.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/pipeline/loader.hpp"

#include "support/expect_error.hpp"
#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

using namespace weightcast;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using weightcast::test::expect_error;

namespace {

/// The top-level `key: value` lines of @p path, values unquoted.
std::map<std::string, std::string> yaml_values(const std::filesystem::path& path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.front() == '#' || line.front() == ' ') continue;
    const auto colon = line.find(": ");
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 2);
    if (value == "\"\"") value.clear();
    out.emplace(line.substr(0, colon), value);
  }
  return out;
}

}  // namespace

TEST_CASE("settings: configs/default.yaml restates every setting's default from the registry",
          "[config][settings]") {
  const auto values =
      yaml_values(std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / "configs" / "default.yaml");
  CHECK(values.size() == settings().size());
  for (const Setting& s : settings()) {
    INFO(s.name);
    REQUIRE(values.contains(std::string(s.name)));
    // The demo checkpoint is an example, not a default.
    if (s.name == "checkpoint") continue;
    CHECK(values.at(std::string(s.name)) == default_text(s));
  }
}

TEST_CASE("settings: docs/config.md's table gives every setting's default from the registry",
          "[config][settings]") {
  std::ifstream in(std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / "docs" / "config.md");
  std::map<std::string, std::string> defaults;  // key -> the table's default cell
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| `")) continue;
    const auto key_end = line.find("` |");
    const auto unit_end = line.find(" | ", key_end + 3);
    const auto default_end = line.find(" | ", unit_end + 3);
    if (key_end == std::string::npos || unit_end == std::string::npos ||
        default_end == std::string::npos) {
      continue;
    }
    defaults.emplace(line.substr(3, key_end - 3),
                     line.substr(unit_end + 3, default_end - unit_end - 3));
  }
  for (const Setting& s : settings()) {
    INFO(s.name);
    if (s.name == "checkpoint") continue;  // the demo path in default.yaml, none without it
    REQUIRE(defaults.contains(std::string(s.name)));
    const std::string text = default_text(s);
    CHECK_THAT(defaults.at(std::string(s.name)),
               Catch::Matchers::StartsWith(fmt::format("`{}`", text.empty() ? "\"\"" : text)));
  }
}

TEST_CASE("settings: Config and LoadOptions take their defaults from the registry",
          "[config][settings]") {
  const Config config;
  const LoadOptions options;
  CHECK(config.chunk_bytes == static_cast<std::uint64_t>(setting::chunk_size.default_value));
  CHECK(options.chunk_bytes == config.chunk_bytes);
  CHECK(options.buffer_depth == config.buffer_depth);
  CHECK(options.io_depth == config.io_depth);
  CHECK(options.timeout == config.timeout);
  CHECK(options.direct_io == config.direct_io);
  CHECK(options.reader == config.reader);
  // Every key of the effective config prints its registry default.
  const Config loaded = load_config("", {});
  for (const Setting& s : settings()) {
    INFO(s.name);
    CHECK_THAT(loaded.to_yaml(), Contains(fmt::format("\n{}: ", s.name)) ||
                                     Contains(fmt::format("{}: ", s.name)));
  }
  CHECK(to_string(DirectIo::on) == "on");
  CHECK(to_string(ReaderKind::uring) == "uring");
  CHECK(to_string(Verify::none) == "none");
  CHECK(to_string(PlacementMode::fsdp) == "fsdp");
}

TEST_CASE("settings: one bad value says the same from YAML, --set and LoadOptions",
          "[config][settings]") {
  const test::TempDir dir;
  struct Case {
    std::string key;
    std::string value;
    std::string reason;                          // what every surface says after its prefix
    std::function<void(LoadOptions&)> set = {};  // the same value in LoadOptions, if it has one
    std::string field = {};
  };
  const std::vector<Case> cases = {
      // A size.
      {"chunk_size", "0", "'0' is out of range (must be more than 0 and at most 4GiB)",
       [](LoadOptions& o) { o.chunk_bytes = 0; }, "chunk_bytes"},
      {"chunk_size", "5GiB", "'5GiB' is out of range (must be more than 0 and at most 4GiB)",
       [](LoadOptions& o) { o.chunk_bytes = 5ull << 30; }, "chunk_bytes"},
      // A count.
      {"buffer_depth", "5000", "'5000' is out of range (must be 1 to 1024: staging ring slots)",
       [](LoadOptions& o) { o.buffer_depth = 5000; }, "buffer_depth"},
      {"io_depth", "0", "'0' is out of range (must be 1 to 4096: reads in flight)",
       [](LoadOptions& o) { o.io_depth = 0; }, "io_depth"},
      // A duration.
      {"timeout", "192h", "'192h' is out of range (must be at least 1ms and at most 7 days)",
       [](LoadOptions& o) { o.timeout = std::chrono::hours(24 * 8); }, "timeout"},
      // An enum, and a bool-like enum: no LoadOptions value can be out of them.
      {"reader", "bogus", "'bogus' is not one of auto, uring, pread"},
      {"direct_io", "maybe", "'maybe' is not one of auto, on, off (or true, false)"},
      {"verify", "maybe", "'maybe' is not one of none, digest"},
  };
  for (const Case& c : cases) {
    INFO(c.key << "=" << c.value);
    const std::string path = (dir / "x.yaml").string();
    test::write_file(path, fmt::format("{}: {}\n", c.key, c.value));
    const Error yaml = expect_error([&] { load_config(path, {}); });
    CHECK(yaml.code() == Errc::config);
    CHECK(std::string(yaml.what()) == fmt::format("{}:1: {}: {}", path, c.key, c.reason));
    const Error set = expect_error([&] { load_config("", {c.key + "=" + c.value}); });
    CHECK(set.code() == Errc::config);
    CHECK(std::string(set.what()) == fmt::format("--set {}={}: {}", c.key, c.value, c.reason));
    if (!c.set) continue;
    LoadOptions options;
    c.set(options);
    const Error cpp = expect_error([&] { check_load_options(options); });
    CHECK(cpp.code() == Errc::config);
    CHECK(std::string(cpp.what()) ==
          fmt::format("LoadOptions::{}: {}: {}", c.field, c.key, c.reason));
  }
}

TEST_CASE("settings: the names and values no config key holds are the registry's too",
          "[config][settings]") {
  // A Python `device=` takes the config's spellings and torch's `cpu`, exactly as spelt.
  CHECK(device_kind("cpu") == DeviceKind::host);
  CHECK(device_kind("host") == DeviceKind::host);
  CHECK(device_kind("cuda") == DeviceKind::cuda);
  CHECK_FALSE(device_kind("auto"));
  CHECK_FALSE(device_kind("Host"));
  CHECK_FALSE(device_kind("cuda:0"));
  // `device: cpu` stays a config error: the config says `host`.
  CHECK(choice_value(setting::device, "cpu") == -1);
  CHECK(to_string(PlacementMode::fsdp) == "fsdp");
  CHECK(choice_value(setting::placement, "FSDP") == static_cast<int>(PlacementMode::fsdp));
  // The launcher's options: what `launch --help` and its messages say.
  CHECK(default_text(setting::launch_spawner) == "auto");
  CHECK(default_text(setting::launch_grace) == "5s");
  CHECK(bound_text(setting::launch_grace, setting::launch_grace.max) == "600s");
  CHECK(bound_text(setting::timeout, setting::timeout.max) == "7 days");
  CHECK(bound_text(setting::chunk_size, setting::chunk_size.max) == "4GiB");
  // The arena alignments the entry points pick; a job raises a cuda load's to 256.
  CHECK(setting::torch_tensor_alignment(DeviceKind::host) == 8);
  CHECK(setting::torch_tensor_alignment(DeviceKind::cuda) == 256);
  CHECK(LoadOptions{}.tensor_alignment == setting::tensor_alignment_packed);
}

TEST_CASE("settings: the key table is the registry's, in its order, every key re-readable",
          "[settings][config]") {
  // The table is built from config.hpp's PlainKeys and the few keys read in a way of their
  // own: a setting added to the registry and PlainKeys needs no line in keys.cpp.
  const auto keys = weightcast::detail::key_table();
  std::vector<std::string_view> names;
  for (const auto& key : keys) names.push_back(key.name);
  std::vector<std::string_view> expected;
  for (const weightcast::Setting& s : weightcast::settings()) {
    if (s.type != weightcast::SettingType::rules) expected.push_back(s.name);  // a YAML list
  }
  CHECK(names == expected);
  const weightcast::Config defaults;
  for (const auto& key : keys) {
    INFO(key.name);
    CHECK(key.setting->name == key.name);
    weightcast::Config read;
    const std::string printed = key.print(defaults);
    key.parse(read, printed);
    CHECK(key.print(read) == printed);
  }
}
