// Config: defaults, YAML file, --set overrides, every key's good and bad values, messages.
#include "weightcast/config/config.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/error.hpp"

#include "support/expect_error.hpp"
#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <string>
#include <vector>

using namespace weightcast;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using weightcast::test::expect_error;

namespace {

/// Writes @p yaml to a file in @p dir and returns its path.
std::string write_yaml(const test::TempDir& dir, const std::string& yaml,
                       const std::string& name = "x.yaml") {
  auto path = dir / name;
  test::write_file(path, yaml);
  return path.string();
}

Config from_set(const std::vector<std::string>& overrides) { return load_config("", overrides); }

}  // namespace

TEST_CASE("config: built-in defaults", "[config]") {
  Config c = load_config("", {});
  CHECK(c.checkpoint.empty());
  CHECK(c.device == DeviceKind::automatic);
  CHECK(c.transport == TransportKind::automatic);
  CHECK(c.chunk_bytes == 16ull << 20);
  CHECK(c.buffer_depth == 4);
  CHECK(c.io_depth == 4);
  CHECK(c.direct_io == DirectIo::automatic);
  CHECK(c.timeout == 300s);
  CHECK(c.verify == Verify::digest);
  CHECK(c.log_level == LogLevel::info);
}

TEST_CASE("config: file overrides defaults, --set overrides the file, last --set wins",
          "[config]") {
  test::TempDir dir;
  auto path = write_yaml(dir,
                         "# comment\n"
                         "checkpoint: /data/llama\n"
                         "chunk_size: 64MiB\n"
                         "buffer_depth: 8\n"
                         "device: host\n");
  Config file_only = load_config(path, {});
  CHECK(file_only.checkpoint == "/data/llama");
  CHECK(file_only.chunk_bytes == 64ull << 20);
  CHECK(file_only.buffer_depth == 8);
  CHECK(file_only.device == DeviceKind::host);
  CHECK(file_only.io_depth == 4);  // untouched key keeps its default

  Config both = load_config(path, {"chunk_size=1MiB", "io_depth=32", "chunk_size=2MiB"});
  CHECK(both.checkpoint == "/data/llama");
  CHECK(both.chunk_bytes == 2ull << 20);
  CHECK(both.io_depth == 32);
  CHECK(both.buffer_depth == 8);
}

TEST_CASE("config: an empty file or one of comments only is all defaults", "[config]") {
  test::TempDir dir;
  CHECK(load_config(write_yaml(dir, ""), {}).chunk_bytes == 16ull << 20);
  CHECK(load_config(write_yaml(dir, "# nothing here\n", "c.yaml"), {}).io_depth == 4);
}

TEST_CASE("config: sizes", "[config]") {
  struct Case {
    const char* text;
    std::uint64_t bytes;
  };
  const Case good[] = {
      {"4096", 4096},           {"16MiB", 16ull << 20},  {"16 MiB", 16ull << 20},
      {"64KiB", 64ull << 10},   {"1GiB", 1ull << 30},    {"1 GiB", 1ull << 30},
      {"1.5GiB", 3ull << 29},   {"16MB", 16'000'000},    {"1KB", 1000},
      {"2TiB", 2ull << 40},     {"512B", 512},           {"0.5KiB", 512},
      {"1_048_576", 1ull << 20}, {" 8 KiB ", 8192},
  };
  for (const auto& c : good) {
    INFO("size '" << c.text << "'");
    CHECK(parse_size(c.text, "chunk_size") == c.bytes);
  }
  const char* bad[] = {"", "abc", "16 parsecs", "-1", "1e9", "0x10", "1.2.3", "1G", "16M",
                       "0.1KiB", "1.5", "99999999999999999999", "20000000TiB", "MiB", "1gib",
                       "16mb"};
  for (const auto* text : bad) {
    INFO("size '" << text << "'");
    auto e = expect_error([&] { parse_size(text, "chunk_size"); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("chunk_size: '" + std::string(text) + "'"));
  }
  auto e = expect_error([] { parse_size("16 parsecs", "chunk_size"); });
  CHECK(std::string(e.what()) ==
        "chunk_size: '16 parsecs' is not a size (use bytes or a unit: 16MiB, 1GiB)");
  CHECK_THAT(expect_error([] { parse_size("1G", "chunk_size"); }).what(),
             Contains("ambiguous") && Contains("1GiB") && Contains("1GB"));
}

TEST_CASE("config: durations", "[config]") {
  struct Case {
    const char* text;
    std::chrono::milliseconds value;
  };
  const Case good[] = {
      {"300s", 300s}, {"5m", 5min}, {"250ms", 250ms}, {"1h", 1h}, {"30", 30s},
      {"1.5s", 1500ms}, {"2 min", 2min}, {"1d", 24h}, {"0.25", 250ms},
  };
  for (const auto& c : good) {
    INFO("duration '" << c.text << "'");
    CHECK(parse_duration(c.text, "timeout") == c.value);
  }
  const char* bad[] = {"", "soon", "5 parsecs", "-5s", "5y", "s", "1e3"};
  for (const auto* text : bad) {
    INFO("duration '" << text << "'");
    auto e = expect_error([&] { parse_duration(text, "timeout"); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("timeout: '" + std::string(text) + "'"));
  }
}

TEST_CASE("config: each key's good values", "[config]") {
  CHECK(from_set({"checkpoint=/tmp/a b/model.safetensors"}).checkpoint ==
        "/tmp/a b/model.safetensors");
  CHECK(from_set({"device=auto"}).device == DeviceKind::automatic);
  CHECK(from_set({"device=host"}).device == DeviceKind::host);
  CHECK(from_set({"device=cuda"}).device == DeviceKind::cuda);
  CHECK(from_set({"transport=local"}).transport == TransportKind::local);
  CHECK(from_set({"transport=mpi"}).transport == TransportKind::mpi);
  CHECK(from_set({"transport=nccl"}).transport == TransportKind::nccl);
  CHECK(from_set({"transport=auto"}).transport == TransportKind::automatic);
  CHECK(from_set({"chunk_size=1"}).chunk_bytes == 1);
  CHECK(from_set({"chunk_size=4GiB"}).chunk_bytes == 4ull << 30);
  CHECK(from_set({"buffer_depth=1"}).buffer_depth == 1);
  CHECK(from_set({"buffer_depth=1024"}).buffer_depth == 1024);
  CHECK(from_set({"io_depth=1"}).io_depth == 1);
  CHECK(from_set({"io_depth=4096"}).io_depth == 4096);
  CHECK(from_set({"direct_io=on"}).direct_io == DirectIo::on);
  CHECK(from_set({"direct_io=off"}).direct_io == DirectIo::off);
  CHECK(from_set({"direct_io=auto"}).direct_io == DirectIo::automatic);
  CHECK(from_set({"direct_io=true"}).direct_io == DirectIo::on);
  CHECK(from_set({"direct_io=false"}).direct_io == DirectIo::off);
  CHECK(from_set({"timeout=250ms"}).timeout == 250ms);
  CHECK(from_set({"timeout=7d"}).timeout == 7 * 24h);
  CHECK(from_set({"log_level=error"}).log_level == LogLevel::error);
  CHECK(from_set({"log_level=warn"}).log_level == LogLevel::warn);
  CHECK(from_set({"log_level=debug"}).log_level == LogLevel::debug);
  CHECK(from_set({"log_level=info"}).log_level == LogLevel::info);
  CHECK(from_set({"verify=none"}).verify == Verify::none);
  CHECK(from_set({"verify=digest"}).verify == Verify::digest);
  CHECK(from_set({"verify=false"}).verify == Verify::none);
  CHECK(from_set({"verify=on"}).verify == Verify::digest);

  // YAML booleans in a file, unquoted, mean on/off.
  test::TempDir dir;
  CHECK(load_config(write_yaml(dir, "direct_io: true\n"), {}).direct_io == DirectIo::on);
  CHECK(load_config(write_yaml(dir, "direct_io: false\n", "f.yaml"), {}).direct_io ==
        DirectIo::off);
}

TEST_CASE("config: each key's bad values name the key and the value", "[config]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"device", "gpu"},          {"transport", "ucx"},       {"chunk_size", "0"},
      {"chunk_size", "5GiB"},     {"chunk_size", "abc"},      {"buffer_depth", "0"},
      {"buffer_depth", "1025"},   {"buffer_depth", "2.5"},    {"buffer_depth", "-1"},
      {"io_depth", "0"},          {"io_depth", "4097"},       {"io_depth", "many"},
      {"direct_io", "maybe"},     {"timeout", "0"},           {"timeout", "0s"},
      {"timeout", "8d"},          {"timeout", "forever"},     {"log_level", "trace"},
      {"verify", "sha256"},       {"verify", "maybe"},
  };
  for (const auto& [key, value] : bad) {
    INFO(key << "=" << value);
    auto e = expect_error([&] { from_set({key + "=" + value}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("--set " + key + "=" + value + ": ") &&
                             Contains("'" + value + "'"));
  }
  CHECK(std::string(expect_error([] { from_set({"chunk_size=abc"}); }).what()) ==
        "--set chunk_size=abc: 'abc' is not a size (use bytes or a unit: 16MiB, 1GiB)");
  CHECK_THAT(expect_error([] { from_set({"device=gpu"}); }).what(),
             Contains("auto, host, cuda"));
}

TEST_CASE("config: a rendezvous.token longer than a hello carries is refused, unquoted",
          "[config]") {
  // It was caught only as a peer connected, so rank 0 waited out `timeout` for nothing.
  const std::size_t limit = detail::max_token_bytes;
  CHECK(limit > 3000);
  CHECK(limit < detail::max_hello_bytes);
  CHECK(from_set({"rendezvous.token=" + std::string(limit, 'k')}).rendezvous_token.size() ==
        limit);
  const std::string token(limit + 1, 'k');
  auto e = expect_error([&] { from_set({"rendezvous.token=" + token}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) ==
        fmt::format("--set rendezvous.token: {} bytes, over the {} a rank's hello to rank 0 "
                    "carries",
                    limit + 1, limit));
  test::TempDir dir;
  auto file = expect_error(
      [&] { load_config(write_yaml(dir, "rendezvous.token: " + token + "\n"), {}); });
  CHECK(file.code() == Errc::config);
  CHECK_THAT(file.what(), Contains("x.yaml:1: rendezvous.token: ") &&
                              Contains(fmt::format("over the {}", limit)));
  CHECK_THAT(file.what(), !Contains("kkk"));
}

TEST_CASE("config: a duration that is not a whole number of milliseconds is refused, not "
          "rounded",
          "[config]") {
  // `timeout=0.5ms` was 1 ms and `1.4ms` 1 ms, with exit 0: durations are whole milliseconds,
  // so a fraction of one is refused as sizes refuse a fraction of a byte.
  for (const std::string value : {"0.5ms", "1.5ms", "1.4ms", "0.0005s", "0.0001s", "0.4ms",
                                   "1.0005s", "0.00000000000000000000000001s"}) {
    INFO(value);
    auto e = expect_error([&] { from_set({"timeout=" + value}); });
    CHECK(e.code() == Errc::config);
    CHECK(std::string(e.what()) ==
          "--set timeout=" + value + ": '" + value + "' is not a whole number of milliseconds");
    CHECK_THAT(expect_error([&] { parse_duration(value, "timeout"); }).what(),
               Contains("not a whole number of milliseconds"));
  }
  CHECK_THAT(expect_error([] { from_set({"timeout=1500us"}); }).what(),
             Contains("'1500us' is not a duration"));
  CHECK(from_set({"timeout=1.5s"}).timeout == 1500ms);
  CHECK(from_set({"timeout=0.001s"}).timeout == 1ms);
  CHECK(from_set({"timeout=0.5m"}).timeout == 30s);
  CHECK(from_set({"timeout=2.000000000000000000000000s"}).timeout == 2s);
  // 0 is a whole number of milliseconds, below the bound, which says the unit.
  CHECK(std::string(expect_error([] { from_set({"timeout=0"}); }).what()) ==
        "--set timeout=0: '0' is out of range (must be at least 1ms and at most 7 days)");
}

TEST_CASE("config: size fractions are exact however many digits they have", "[config]") {
  // Digits past the 18th were dropped: 4.0000000000000000001GiB loaded as 4GiB.
  for (const std::string& value : std::vector<std::string>{
           "4.0000000000000000001GiB", "1.00000000000000000000000000000000000001KiB",
           "0.00000000000090949470177292823791503906251TiB",
           "1." + std::string(3000, '0') + "1MiB"}) {
    INFO(value);
    auto e = expect_error([&] { from_set({"chunk_size=" + value}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("is not a whole number of bytes"));
  }
  // Trailing zeros change nothing; 2^-40 TiB, 40 digits, is exactly one byte.
  CHECK(from_set({"chunk_size=4.000000000000000000000000000000GiB"}).chunk_bytes == 4ull << 30);
  CHECK(from_set({"chunk_size=1." + std::string(3000, '0') + "MiB"}).chunk_bytes == 1ull << 20);
  CHECK(parse_size("0.0000000000009094947017729282379150390625TiB", "x") == 1);
  CHECK(parse_size("1.0000000000009094947017729282379150390625TiB", "x") == (1ull << 40) + 1);
  CHECK(parse_size("18446744073709551615", "x") == 18446744073709551615ull);
  CHECK_THAT(expect_error([] { parse_size("18446744073709551616", "x"); }).what(),
             Contains("out of range"));
  // Over the key's limit, however written: the limit's message.
  for (const std::string value : {"4.5GiB", "4.000000000000000000000000TiB", "99999999999999999999",
                                  "99999999999999999999.5", "20000000TiB"}) {
    INFO(value);
    CHECK(std::string(expect_error([&] { from_set({"chunk_size=" + value}); }).what()) ==
          "--set chunk_size=" + value + ": '" + value +
              "' is out of range (must be more than 0 and at most 4GiB)");
  }
}

TEST_CASE("config: an empty value is no value, except where empty means none", "[config]") {
  // `rendezvous.address: ''` became auto (127.0.0.1 or $MASTER_ADDR) without a word.
  test::TempDir dir;
  std::vector<std::string> keys;
  for (const auto& entry : YAML::Load(Config{}.to_yaml())) {
    keys.push_back(entry.first.as<std::string>());
  }
  REQUIRE(keys.size() >= 19);
  // Documented: no checkpoint (as without a config), no trace, the token from the environment.
  const std::vector<std::string> empty_means_none{"checkpoint", "trace", "rendezvous.token"};
  for (const auto& key : keys) {
    INFO(key);
    const bool none = std::count(empty_means_none.begin(), empty_means_none.end(), key) != 0;
    for (const std::string value : {"''", "\"\"", "' '"}) {
      INFO(value);
      const auto file = write_yaml(dir, "# line 1\n" + key + ": " + value + "\n");
      if (none && value != "' '") {
        CHECK_NOTHROW(load_config(file, {}));
        CHECK_NOTHROW(from_set({key + "=" + value}));
        continue;
      }
      if (none) continue;  // a path of one space is a path
      auto e = expect_error([&] { load_config(file, {}); });
      CHECK(e.code() == Errc::config);
      CHECK(std::string(e.what()) == file + ":2: " + key + ": has no value");
      auto s = expect_error([&] { from_set({key + "=" + value}); });
      CHECK(s.code() == Errc::config);
      CHECK_THAT(s.what(), Contains(": has no value"));
    }
    CHECK_THAT(expect_error([&] { from_set({key + "="}); }).what(), Contains("has no value"));
  }
  CHECK(from_set({"rendezvous.address=auto"}).rendezvous_address.empty());
}

TEST_CASE("config: YAML tags other than the core scalar ones are refused, naming the key "
          "and the tag",
          "[config]") {
  // `rendezvous.token: !!binary aGVsbG8=` was the token "aGVsbG8=", `!!float 3` was 3.
  test::TempDir dir;
  struct Case {
    std::string yaml;
    std::string message;  // after "PATH:"
  };
  const std::vector<Case> refused{
      {"rendezvous.token: !!binary aGVsbG8=\n",
       "1: rendezvous.token: the value has the YAML tag !!binary"},
      {"chunk_size: !foo 8MiB\n", "1: chunk_size: the value has the YAML tag !foo"},
      {"timeout: !!timestamp 2001-12-14\n",
       "1: timeout: the value has the YAML tag !!timestamp"},
      {"trace: !!binary dHJhY2U=\n", "1: trace: the value has the YAML tag !!binary"},
      {"checkpoint: !!seq x\n", "1: checkpoint: the value has the YAML tag !!seq"},
      {"io_depth: 4\nrendezvous: !!set {port: 1}\n",
       "2: rendezvous: the mapping has the YAML tag !!set"},
      {"!!binary Y2h1bmtfc2l6ZQ==: 1\n", "1: the key 'Y2h1bmtfc2l6ZQ==' has the YAML tag !!binary"},
      {"--- !foo\nio_depth: 4\n", "1: the top level has the YAML tag !foo"},
  };
  for (const auto& c : refused) {
    INFO(c.yaml);
    const auto path = write_yaml(dir, c.yaml);
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(path + ":" + c.message) && Contains("remove the tag"));
    CHECK_THAT(e.what(), !Contains("aGVsbG8"));
  }
  // The non-specific tags and the core scalar tags: the key's own parser reads the text.
  const Config ok = load_config(write_yaml(dir,
                                           "rendezvous.token: !!str abc\n"
                                           "chunk_size: ! 8MiB\n"
                                           "buffer_depth: !!int 3\n"
                                           "rendezvous: !!map {port: 29600}\n"
                                           "!!str io_depth: 2\n"),
                                {});
  CHECK(ok.rendezvous_token == "abc");
  CHECK(ok.chunk_bytes == 8ull << 20);
  CHECK(ok.buffer_depth == 3);
  CHECK(ok.rendezvous_port == 29600);
  CHECK(ok.io_depth == 2);
  // A core tag is no licence: the text must still be what the key reads.
  for (const std::string bad : {"chunk_size: !!int \"0x10\"\n", "buffer_depth: !!float 3.5\n",
                                "direct_io: !!bool maybe\n"}) {
    INFO(bad);
    auto e = expect_error([&] { load_config(write_yaml(dir, bad), {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), !Contains("YAML tag"));
  }
  // --set takes its value as written: `!foo` there is text, not a tag.
  CHECK(from_set({"rendezvous.token=!!binary aGVsbG8="}).rendezvous_token == "!!binary aGVsbG8=");
}

TEST_CASE("config: PyYAML's tagged scalars (default_style='\"', canonical) load as written",
          "[config]") {
  // yaml.dump(cfg, default_style='"') and canonical=True tag every scalar: they were refused
  // ("the value has the YAML tag !!int").
  test::TempDir dir;
  const auto quoted = write_yaml(dir,
                                 "\"chunk_size\": !!int \"16777216\"\n"
                                 "\"direct_io\": !!bool \"false\"\n"
                                 "\"rendezvous\":\n"
                                 "  \"port\": !!int \"29600\"\n"
                                 "\"timeout\": !!int \"300\"\n"
                                 "\"trace\": !!null \"null\"\n"
                                 "\"verify\": !!bool \"true\"\n"
                                 "\"world\":\n"
                                 "  \"rank\": !!int \"0\"\n"
                                 "  \"size\": !!int \"1\"\n"
                                 "\"buffer_depth\": !!float \"8\"\n"
                                 "\"checkpoint\": !!str \"/data/m\"\n");
  const Config q = load_config(quoted, {});
  CHECK(q.chunk_bytes == 16ull << 20);
  CHECK(q.direct_io == DirectIo::off);
  CHECK(q.rendezvous_port == 29600);
  CHECK(q.timeout == 300s);
  CHECK(q.trace.empty());
  CHECK(q.verify == Verify::digest);
  CHECK(q.world_rank == 0);
  CHECK(q.world_size == 1);
  CHECK(q.buffer_depth == 8);
  CHECK(q.checkpoint == "/data/m");
  const auto canonical = write_yaml(dir,
                                    "---\n"
                                    "!!map {\n"
                                    "  ? !!str \"chunk_size\"\n"
                                    "  : !!int \"16777216\",\n"
                                    "  ? !!str \"direct_io\"\n"
                                    "  : !!bool \"false\",\n"
                                    "  ? !!str \"rendezvous\"\n"
                                    "  : !!map {\n"
                                    "    ? !!str \"port\"\n"
                                    "    : !!int \"29600\",\n"
                                    "  },\n"
                                    "  ? !!str \"timeout\"\n"
                                    "  : !!int \"300\",\n"
                                    "  ? !!str \"trace\"\n"
                                    "  : !!null \"null\",\n"
                                    "  ? !!str \"verify\"\n"
                                    "  : !!bool \"true\",\n"
                                    "}\n",
                                    "c.yaml");
  const Config c = load_config(canonical, {});
  CHECK(c.chunk_bytes == 16ull << 20);
  CHECK(c.direct_io == DirectIo::off);
  CHECK(c.rendezvous_port == 29600);
  CHECK(c.timeout == 300s);
  CHECK(c.trace.empty());
  CHECK(c.verify == Verify::digest);
  // `world.rank: !!int auto` reads `auto`, as without the tag.
  CHECK(load_config(write_yaml(dir, "world.rank: !!int auto\nworld.size: !!int auto\n"), {})
            .world_rank == -1);
  // !!null is null: no value for a setting, none for a path; on other text it is refused.
  auto e = expect_error([&] { load_config(write_yaml(dir, "device: !!null \"null\"\n"), {}); });
  CHECK(e.code() == Errc::config);
  CHECK_THAT(e.what(), Contains("x.yaml:1: device: has no value"));
  e = expect_error([&] { load_config(write_yaml(dir, "trace: !!null t.json\n"), {}); });
  CHECK(e.code() == Errc::config);
  CHECK_THAT(e.what(), Contains("x.yaml:1: trace: ") && Contains("!!null") &&
                           Contains("'t.json'"));
}

TEST_CASE("config: a YAML null means none for checkpoint, trace and rendezvous.token",
          "[config]") {
  // `trace: null` (PyYAML's None), `trace: ~` and a bare `trace:` were "has no value", though
  // these keys take an empty value as none.
  test::TempDir dir;
  for (const std::string key : {"checkpoint", "trace", "rendezvous.token"}) {
    for (const std::string value : {" null", " ~", "", " Null", " NULL", " !!null", " null # c"}) {
      INFO(key << ":" << value);
      const Config c = load_config(write_yaml(dir, "io_depth: 2\n" + key + ":" + value +
                                                       "\nbuffer_depth: 3\n"),
                                   {"checkpoint=/c", "trace=/t", "rendezvous.token=tk"});
      CHECK(c.io_depth == 2);
      CHECK(c.buffer_depth == 3);
      CHECK(c.trace == "/t");
      // The file's null is applied, then --set overrides it; without --set it is empty.
      const Config plain = load_config(write_yaml(dir, key + ":" + value + "\n", "p.yaml"), {});
      CHECK(plain.checkpoint.empty());
      CHECK(plain.trace.empty());
      CHECK(plain.rendezvous_token.empty());
      CHECK(plain.where_set(key) == (dir / "p.yaml").string() + ":1");
    }
  }
  // In flow style too, and nested.
  const Config flow = load_config(
      write_yaml(dir, "{trace: null, rendezvous: {token: ~}, checkpoint: }\n"), {});
  CHECK(flow.trace.empty());
  // Every other key has no value, and the message says what was given.
  for (const std::string value : {"null", "~", "NULL"}) {
    INFO(value);
    const auto path = write_yaml(dir, "# 1\nchunk_size: " + value + "\n");
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    CHECK(std::string(e.what()) ==
          fmt::format("{}:2: chunk_size: has no value ('{}' given, which YAML reads as null)",
                      (dir / "x.yaml").string(), value));
  }
  CHECK(std::string(expect_error([&] {
          load_config(write_yaml(dir, "device:\nio_depth: 2\n"), {});
        }).what()) == (dir / "x.yaml").string() + ":1: device: has no value");
  // --set takes the value as written: `null` there is a path.
  CHECK(from_set({"trace=null"}).trace == "null");
}

TEST_CASE("config: CRs before a line feed or at the end of the file end the line", "[config]") {
  // A file converted to CRLF twice (`\r\r\n`) was refused as "lone CR line endings".
  test::TempDir dir;
  const Config doubled = load_config(
      write_yaml(dir, "chunk_size: 1MiB\r\r\ntrace: 't.json'\r\r\r\n# note\r\r\nio_depth: 3\r\r"),
      {});
  CHECK(doubled.chunk_bytes == 1ull << 20);
  CHECK(doubled.trace == "t.json");
  CHECK(doubled.io_depth == 3);
  CHECK(load_config(write_yaml(dir, "io_depth: 5\r"), {}).io_depth == 5);
  // A CR followed by more text: YAML 1.2 would break the line there, so `# note\rmore` would
  // turn comment text into content. Refused, naming the line.
  const auto in_comment = write_yaml(dir, "io_depth: 2\n# note\rchunk_size: 1MiB\n", "c.yaml");
  auto e = expect_error([&] { load_config(in_comment, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) ==
        in_comment + ":2: a carriage return inside the line (byte 18 of the file): a CR inside "
                     "a line is not supported (YAML would read it as a line break, so what "
                     "follows, comment text too, would become content); use LF or CRLF line "
                     "endings, and \"\\r\" in a double-quoted value");
}

TEST_CASE("config: the effective config prints control characters escaped and loads back",
          "[config]") {
  // A CR in a value was printed raw (`trace: a^Mb`): it reached the terminal, and the printout
  // did not load back (lone CR). DEL was printed raw too.
  test::TempDir dir;
  const std::vector<std::string> values{
      "a\rb", "a\x7f" "b", "a\tb", "a\x1b[2Jb", "a\nb", "a\xc2\x85" "b", "a\xc2\x9b" "b",
      "x\xe2\x80\xa8y", "\r\n lead", "q\"uo\\te\r", "modèle\x01", "null\r", "a\x80\xff" "b\r"};
  for (const auto& value : values) {
    INFO(value);
    Config original;
    original.checkpoint = value;
    original.trace = value;
    const std::string yaml = original.to_yaml();
    INFO(yaml);
    for (char c : yaml) {
      const auto byte = static_cast<unsigned char>(c);
      CHECK((byte == '\n' || (byte >= 0x20 && byte != 0x7f)));
    }
    CHECK(yaml.find("\xc2\x85") == std::string::npos);
    CHECK(yaml.find("\xc2\x9b") == std::string::npos);
    CHECK(yaml.find("\xe2\x80\xa8") == std::string::npos);
    const Config back = load_config(write_yaml(dir, yaml), {});
    CHECK(back.checkpoint == value);
    CHECK(back.trace == value);
    CHECK(back.to_yaml() == yaml);
  }
  Config tab;
  tab.trace = "a\tb\r";
  CHECK_THAT(tab.to_yaml(), Contains("trace: \"a\\tb\\r\"\n"));
}

TEST_CASE("config: a UTF-16 or UTF-32 file says so", "[config]") {
  // Notepad's "Unicode" gave "holds a NUL byte (byte 3 of the file)".
  test::TempDir dir;
  const auto utf16 = [](std::string_view text, bool little) {
    std::string out;
    for (char c : text) {
      out += little ? std::string{c, '\0'} : std::string{'\0', c};
    }
    return out;
  };
  struct Case {
    std::string bytes;
    std::string says;
  };
  const std::vector<Case> cases{
      {"\xff\xfe" + utf16("io_depth: 2\r\n", true), "is UTF-16 (byte-order mark FF FE)"},
      {"\xfe\xff" + utf16("io_depth: 2\n", false), "is UTF-16 (byte-order mark FE FF)"},
      {std::string("\xff\xfe\0\0i\0\0\0", 8), "is UTF-32 (byte-order mark FF FE 00 00)"},
      {std::string("\0\0\xfe\xff\0\0\0i", 8), "is UTF-32 (byte-order mark 00 00 FE FF)"},
      {utf16("io_depth: 2\n", true), "is UTF-16 (little-endian, without a byte-order mark)"},
      {utf16("io_depth: 2\n", false), "is UTF-16 (big-endian, without a byte-order mark)"},
  };
  for (const auto& c : cases) {
    INFO(c.says);
    const auto path = write_yaml(dir, c.bytes);
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    CHECK(std::string(e.what()) == path + ": " + c.says + ": save it as UTF-8");
  }
  // A UTF-8 byte-order mark is fine.
  CHECK(load_config(write_yaml(dir, "\xef\xbb\xbfio_depth: 2\n"), {}).io_depth == 2);
}

TEST_CASE("config: a number with an exponent is refused with the spelling to use", "[config]") {
  // Helm's toYaml writes `chunk_size: 1.6777216e+07`.
  auto e = expect_error([] { parse_size("1.6777216e+07", "chunk_size"); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) == "chunk_size: '1.6777216e+07' is not a size (an exponent is not "
                                 "a size: write 16777216 or 16MiB)");
  CHECK(std::string(expect_error([] { parse_size("1e3", "chunk_size"); }).what()) ==
        "chunk_size: '1e3' is not a size (an exponent is not a size: write 1000)");
  CHECK(std::string(expect_error([] { parse_size("1.5E-1", "chunk_size"); }).what()) ==
        "chunk_size: '1.5E-1' is not a size (an exponent is not a size: use bytes or a unit: "
        "16MiB, 1GiB)");
  CHECK(std::string(expect_error([] { parse_size("1e30", "chunk_size"); }).what()) ==
        "chunk_size: '1e30' is not a size (an exponent is not a size: use bytes or a unit: "
        "16MiB, 1GiB)");
  CHECK(std::string(expect_error([] { parse_duration("3e2", "timeout"); }).what()) ==
        "timeout: '3e2' is not a duration (an exponent is not a duration: write 300s)");
  auto i = expect_error([] { from_set({"buffer_depth=1.6e+01"}); });
  CHECK(i.code() == Errc::config);
  CHECK_THAT(i.what(), Contains("'1.6e+01' is not a whole number") &&
                           Contains("an exponent is not a whole number: write 16"));
  test::TempDir dir;
  auto f = expect_error([&] { load_config(write_yaml(dir, "chunk_size: 1.6777216e+07\n"), {}); });
  CHECK(f.code() == Errc::config);
  CHECK_THAT(f.what(), Contains("x.yaml:1: chunk_size: '1.6777216e+07' is not a size (an "
                                "exponent is not a size: write 16777216 or 16MiB)"));
}

TEST_CASE("config: the effective config's token mask is refused as a token", "[config]") {
  // Loading the printed effective config set the token to the literal "(set)".
  test::TempDir dir;
  Config original;
  original.rendezvous_token = "s3cret";
  const std::string yaml = original.to_yaml();
  REQUIRE_THAT(yaml, Contains("rendezvous.token: (set)"));
  const auto path = write_yaml(dir, "# 1\n" + yaml);
  const auto token_at = static_cast<std::ptrdiff_t>(yaml.find("rendezvous.token"));
  const std::string line =
      std::to_string(2 + std::count(yaml.begin(), yaml.begin() + token_at, '\n'));
  auto e = expect_error([&] { load_config(path, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) ==
        path + ":" + line + ": rendezvous.token: '(set)' is the mask the printed config shows in "
                            "place of the token: give the token itself (or leave it empty and set "
                            "$WEIGHTCAST_TOKEN)");
  CHECK_THAT(expect_error([] { from_set({"rendezvous.token=(set)"}); }).what(),
             Contains("--set rendezvous.token: '(set)' is the mask"));
  CHECK(from_set({"rendezvous.token=(set)x"}).rendezvous_token == "(set)x");
}

TEST_CASE("config: a YAML merge key is refused as such, with its line", "[config]") {
  // It read as the unknown key '<<.chunk_size'.
  test::TempDir dir;
  for (const std::string yaml : {"io_depth: 4\n<<: {chunk_size: 8MiB}\n",
                                 "io_depth: 4\n<<:\n  chunk_size: 8MiB\n",
                                 "base: &b {port: 1}\nrendezvous:\n  io: 1\n",
                                 "io_depth: 4\nrendezvous:\n  <<: {port: 29600}\n"}) {
    INFO(yaml);
    const auto path = write_yaml(dir, yaml);
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    if (yaml.find("<<") == std::string::npos) continue;  // an anchor alone: unknown key
    CHECK(std::string(e.what()) == fmt::format("{}:{}: YAML merge keys ('<<') are not "
                                               "supported: write the keys out",
                                               path,
                                               yaml.starts_with("io_depth: 4\nrend") ? 3 : 2));
  }
}

TEST_CASE("config: a raw CR is refused: lone CR line endings, a CR in a value", "[config]") {
  test::TempDir dir;
  // yaml-cpp said "illegal map value"; a CR inside a value became part of a path.
  const auto mac = write_yaml(dir, "chunk_size: 8MiB\rbuffer_depth: 2\r");
  auto e = expect_error([&] { load_config(mac, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) ==
        mac + ":1: a carriage return inside the line (byte 16 of the file): a CR inside a line "
              "is not supported (YAML would read it as a line break, so what follows, comment "
              "text too, would become content); use LF or CRLF line endings, and \"\\r\" in a "
              "double-quoted value");
  const auto in_value = write_yaml(dir, "checkpoint: x\ntrace: a\rb\n", "v.yaml");
  e = expect_error([&] { load_config(in_value, {}); });
  CHECK(e.code() == Errc::config);
  CHECK_THAT(e.what(), Contains(in_value + ":2: a carriage return inside the line"));
  // CRLF is a line break.
  const Config crlf =
      load_config(write_yaml(dir, "chunk_size: 8MiB\r\ntrace: t.json\r\n", "w.yaml"), {});
  CHECK(crlf.chunk_bytes == 8ull << 20);
  CHECK(crlf.trace == "t.json");
  // A control character asked for by name (YAML's "\r", or --set) is a path's own: Linux
  // allows one, and messages show it escaped, on one line.
  CHECK(load_config(write_yaml(dir, "trace: \"a\\rb\"\n", "e.yaml"), {}).trace == "a\rb");
  auto s = expect_error([&] { from_set({"device=a\rb\x1b[2J"}); });
  CHECK(s.code() == Errc::config);
  CHECK(std::string(s.what()) ==
        "--set device=a\\x0db\\x1b[2J: 'a\\x0db\\x1b[2J' is not one of auto, host, cuda");
}

TEST_CASE("config: a long value or key is echoed cut, with its length", "[config]") {
  // A 5000-digit value was echoed whole, twice (in `--set key=value` and in quotes).
  test::TempDir dir;
  const std::string digits(5000, '7');
  auto e = expect_error([&] { from_set({"buffer_depth=" + digits}); });
  CHECK(e.code() == Errc::config);
  const std::string cut(64, '7');
  CHECK(std::string(e.what()) ==
        fmt::format("--set buffer_depth={}… (5013 bytes): '{}…' (5000 bytes) is out of range "
                    "(must be 1 to 1024: staging ring slots)",
                    std::string(51, '7'), cut));
  for (const std::string key : {"chunk_size", "timeout", "device", "checkpoint"}) {
    INFO(key);
    // 5001 bytes each: a NUL for the checkpoint (YAML's "\0"), a bad unit for the others.
    const std::string escaped = key == "checkpoint" ? digits + "\\0" : digits + "x";
    const auto path = write_yaml(dir, key + ": \"" + escaped + "\"\n");
    auto f = expect_error([&] { load_config(path, {}); });
    CHECK(f.code() == Errc::config);
    CHECK_THAT(f.what(), Contains(path + ":1: " + key + ": '" + cut + "…' (5001 bytes)"));
    CHECK(std::string(f.what()).size() < path.size() + 300);
  }
  // Cut at a character, not inside one.
  const std::string wide = std::string(63, 'a') + "é" + std::string(100, 'b');
  CHECK_THAT(expect_error([&] { from_set({"device=" + wide}); }).what(),
             Contains("'" + std::string(63, 'a') + "…' (165 bytes)"));
  // An unknown key too, in a file (where YAML allows 1024 characters) and in --set.
  auto k = expect_error(
      [&] { load_config(write_yaml(dir, std::string(1000, 'k') + ": 1\n"), {}); });
  CHECK_THAT(k.what(), Contains("unknown key '" + std::string(64, 'k') + "…' (1000 bytes)"));
  CHECK(std::string(k.what()).size() < 600);
  const std::string key(5000, 'k');
  CHECK(std::string(expect_error([&] { from_set({key + "=1"}); }).what()).size() < 700);
}

TEST_CASE("config: a mapping key given twice is refused at any level, naming both lines",
          "[config]") {
  // Two `rendezvous:` blocks were merged without a word.
  test::TempDir dir;
  const auto path = write_yaml(dir,
                               "rendezvous:\n"
                               "  port: 29600\n"
                               "io_depth: 4\n"
                               "rendezvous:\n"
                               "  address: 10.0.0.1\n");
  auto e = expect_error([&] { load_config(path, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) == path + ":4: rendezvous: given twice (first at line 1)");
  const auto flow = write_yaml(dir, "world: {rank: 0}\nworld: {size: 2}\n", "f.yaml");
  CHECK_THAT(expect_error([&] { load_config(flow, {}); }).what(),
             Contains(flow + ":2: world: given twice (first at line 1)"));
  const auto deep = write_yaml(dir, "a:\n  b: {c: 1}\n  b: {d: 2}\n", "d.yaml");
  CHECK_THAT(expect_error([&] { load_config(deep, {}); }).what(),
             Contains(deep + ":3: a.b: given twice (first at line 2)"));
  // A scalar key twice, as before; nested and dotted spellings of one key.
  CHECK_THAT(expect_error([&] {
               load_config(write_yaml(dir, "rendezvous:\n  port: 1\nrendezvous.port: 2\n",
                                      "g.yaml"),
                           {});
             }).what(),
             Contains(":3: rendezvous.port: given twice (first at line 2)"));
  // Different keys under one prefix, nested and dotted, are fine.
  const Config ok = load_config(
      write_yaml(dir, "rendezvous:\n  port: 29600\nrendezvous.address: 10.0.0.1\n", "o.yaml"), {});
  CHECK(ok.rendezvous_port == 29600);
  CHECK(ok.rendezvous_address == "10.0.0.1");
}

TEST_CASE("config: a negative number is out of range for every numeric key", "[config]") {
  // chunk_size=-1 said "not a size" where rendezvous.port=-1 said "out of range".
  for (const std::string kv : {"chunk_size=-1", "chunk_size=-1MiB", "timeout=-5s",
                               "timeout=-1", "buffer_depth=-1", "io_depth=-4",
                               "rendezvous.port=-1", "world.size=-1", "world.rank=-1"}) {
    INFO(kv);
    auto e = expect_error([&] { from_set({kv}); });
    CHECK(e.code() == Errc::config);
    const std::string value = kv.substr(kv.find('=') + 1);
    CHECK_THAT(e.what(), Contains("'" + value + "' is out of range (must be"));
  }
  CHECK_THAT(expect_error([] { parse_size("-1", "x"); }).what(), Contains("out of range"));
  CHECK_THAT(expect_error([] { parse_duration("-1s", "x"); }).what(), Contains("out of range"));
}

TEST_CASE("config: units are case-sensitive, and a wrong case says the spelling", "[config]") {
  // `16mb` loaded as 16 MB (millibits?  MiB?) and `1b` as one byte (a bit?).
  struct Case {
    std::string value;
    std::string hint;
  };
  const std::vector<Case> sizes{
      {"16mb", "(write 16MB for decimal, or 16MiB for binary)"},
      {"1b", "(write 1B)"},
      {"1gib", "(write 1GiB)"},
      {"2 MIB", "(write 2MiB)"},
      {"4Kb", "(write 4KB for decimal, or 4KiB for binary)"},
  };
  for (const auto& c : sizes) {
    INFO(c.value);
    CHECK(std::string(expect_error([&] { from_set({"chunk_size=" + c.value}); }).what()) ==
          "--set chunk_size=" + c.value + ": '" + c.value +
              "' is not a size: units are case-sensitive " + c.hint);
  }
  for (const auto& [value, hint] : std::vector<std::pair<std::string, std::string>>{
           {"5S", "5s"}, {"250MS", "250ms"}, {"1H", "1h"}, {"2Min", "2min"}}) {
    INFO(value);
    CHECK(std::string(expect_error([&] { from_set({"timeout=" + value}); }).what()) ==
          "--set timeout=" + value + ": '" + value +
              "' is not a duration: units are case-sensitive (write " + hint + ")");
  }
  CHECK(from_set({"chunk_size=16MB"}).chunk_bytes == 16'000'000);
  CHECK(from_set({"chunk_size=512B"}).chunk_bytes == 512);
  CHECK(from_set({"timeout=2min"}).timeout == 2min);
}

TEST_CASE("config: a bad value in a file names file, line, key and value", "[config]") {
  test::TempDir dir;
  auto path = write_yaml(dir,
                         "checkpoint: /data/x\n"
                         "device: host\n"
                         "\n"
                         "# the next key is wrong\n"
                         "io_depth: 8\n"
                         "buffer_depth: 2\n"
                         "chunk_size: 16 parsecs\n");
  auto e = expect_error([&] { load_config(path, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) ==
        path + ":7: chunk_size: '16 parsecs' is not a size (use bytes or a unit: 16MiB, 1GiB)");
}

TEST_CASE("config: unknown keys are errors, with a suggestion when one is close", "[config]") {
  test::TempDir dir;
  auto path = write_yaml(dir, "device: host\nchunksize: 16MiB\n");
  auto e = expect_error([&] { load_config(path, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) == path + ":2: unknown key 'chunksize' (did you mean 'chunk_size'?)");

  auto s = expect_error([] { from_set({"bufer_depth=4"}); });
  CHECK(s.code() == Errc::config);
  CHECK(std::string(s.what()) ==
        "--set bufer_depth=4: unknown key 'bufer_depth' (did you mean 'buffer_depth'?)");
  CHECK_THAT(expect_error([] { from_set({"timeuot=5s"}); }).what(),
             Contains("did you mean 'timeout'?"));
  CHECK_THAT(expect_error([] { from_set({"Chunk-Size=1MiB"}); }).what(),
             Contains("did you mean 'chunk_size'?"));

  // Far from every key: no guess, the list of known keys instead.
  auto far = expect_error([] { from_set({"colour=blue"}); });
  CHECK_THAT(far.what(), Contains("unknown key 'colour'") && Contains("known keys:") &&
                             Contains("chunk_size") && !Contains("did you mean"));

  // A nested mapping is read as dotted keys: `rendezvous: {port: 29500}` is rendezvous.port.
  const Config nested = load_config(write_yaml(dir, "rendezvous:\n  port: 29500\n", "n.yaml"), {});
  CHECK(nested.rendezvous_port == 29500);
  auto nested_bad = expect_error(
      [&] { load_config(write_yaml(dir, "rendezvous:\n  prot: 1\n", "m.yaml"), {}); });
  CHECK(nested_bad.code() == Errc::config);
  CHECK_THAT(nested_bad.what(), Contains("m.yaml:2: unknown key 'rendezvous.prot'"));
}

TEST_CASE("config: malformed files", "[config]") {
  test::TempDir dir;

  SECTION("YAML syntax error names file and line") {
    auto path = write_yaml(dir, "device: host\nchunk_size: [16MiB\nio_depth: 4\n");
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(path + ":") && Contains("invalid YAML"));
  }
  SECTION("top level not a mapping") {
    auto e = expect_error([&] { load_config(write_yaml(dir, "- device\n- host\n"), {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains("top level must be a mapping") && Contains("a list"));
    auto s = expect_error([&] { load_config(write_yaml(dir, "just a string\n", "s.yaml"), {}); });
    CHECK(s.code() == Errc::config);
  }
  SECTION("a value that is not a scalar") {
    auto e = expect_error([&] { load_config(write_yaml(dir, "io_depth: [1, 2]\n"), {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(":1: io_depth: expects a single value, got a list"));
  }
  SECTION("a key with no value") {
    auto e = expect_error([&] { load_config(write_yaml(dir, "device:\n"), {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(":1: device: has no value"));
  }
  SECTION("a key given twice") {
    auto e = expect_error(
        [&] { load_config(write_yaml(dir, "io_depth: 4\ndevice: host\nio_depth: 8\n"), {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(":3: io_depth: given twice (first at line 1)"));
  }
  SECTION("missing file") {
    auto missing = (dir / "nope.yaml").string();
    auto e = expect_error([&] { load_config(missing, {}); });
    CHECK(e.code() == Errc::missing_input);
    CHECK_THAT(e.what(), Contains(missing));
  }
}

TEST_CASE("config: a second YAML document is refused with its line, not ignored",
          "[config]") {
  // yaml-cpp's Load reads the first document only: the rest, bad keys and all, went unread.
  test::TempDir dir;
  struct Case {
    std::string yaml;
    int line;  // where the second document begins
  };
  const std::vector<Case> cases{
      {"device: host\n---\nbogus_key: 1\n", 3},
      {"---\ndevice: host\n---\n# empty\n---\nio_depth: 8\n", 3},
      {"device: host\n---\n", 2},
      {"---\n---\ndevice: host\n", 3},
  };
  for (const auto& c : cases) {
    INFO(c.yaml);
    const auto path = write_yaml(dir, c.yaml);
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(fmt::format("{}:{}: a second YAML document", path, c.line)));
  }
  // One document with its optional markers is still one document.
  CHECK(load_config(write_yaml(dir, "---\ndevice: host\n...\n"), {}).device == DeviceKind::host);
  CHECK(load_config(write_yaml(dir, "# only a comment\n---\ndevice: host\n"), {}).device ==
        DeviceKind::host);
}

TEST_CASE("config: a checkpoint or an oversized file as the config is refused unread",
          "[config]") {
  test::TempDir dir;
  SECTION("a .safetensors name or safetensors bytes: the hint names --set checkpoint=") {
    const std::string tensors = test::make_safetensors(
        R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", test::zeros(8));
    for (const std::string name : {"model.safetensors", "weights.bin"}) {
      INFO(name);
      const auto path = dir / name;
      test::write_file(path, tensors);
      auto e = expect_error([&] { load_config(path.string(), {}); });
      CHECK(e.code() == Errc::config);
      CHECK_THAT(e.what(), Contains(path.string() + ": this looks like a checkpoint") &&
                               Contains("use --set checkpoint=" + path.string()));
    }
  }
  SECTION("larger than 1 MiB") {
    // Valid YAML of comments, so only the size can refuse it.
    const auto path = write_yaml(dir, std::string((1 << 20) + 1, '#'));
    auto e = expect_error([&] { load_config(path, {}); });
    CHECK(e.code() == Errc::config);
    CHECK_THAT(e.what(), Contains(path + ": is larger than a config file can be (1048576"));
    // 1 MiB itself is fine.
    CHECK_NOTHROW(load_config(write_yaml(dir, std::string(1 << 20, '#'), "max.yaml"), {}));
  }
}

TEST_CASE("config: a config path that leads to no file says why, a socket what it is",
          "[config]") {
  test::TempDir dir;
  test::write_file(dir / "afile", "x");
  auto e = expect_error([&] { load_config((dir / "afile" / "x.yaml").string(), {}); });
  CHECK(e.code() == Errc::missing_input);
  CHECK_THAT(e.what(), Contains("x.yaml: cannot open config file: Not a directory"));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string path = (dir / "s.yaml").string();
  REQUIRE(path.size() < sizeof(address.sun_path));
  std::copy(path.begin(), path.end(), address.sun_path);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  e = expect_error([&] { load_config(path, {}); });
  ::close(fd);
  CHECK(e.code() == Errc::config);  // was 74, "No such device or address"
  CHECK(std::string(e.what()) == path + ": is a socket, not a YAML config file");
}

TEST_CASE("config: a raw NUL byte in the file is refused with its line", "[config]") {
  // yaml-cpp read it as a backslash: `trace: my<NUL>nreport.json` wrote "my\nreport.json".
  test::TempDir dir;
  const auto path = write_yaml(dir, std::string("checkpoint: x\ntrace: my\0nreport.json\n", 37));
  auto e = expect_error([&] { load_config(path, {}); });
  CHECK(e.code() == Errc::config);
  CHECK(std::string(e.what()) ==
        path + ":2: holds a NUL byte (byte 23 of the file), which YAML does not allow");
}

TEST_CASE("config: --set syntax", "[config]") {
  auto no_eq = expect_error([] { from_set({"chunk_size"}); });
  CHECK(no_eq.code() == Errc::usage);
  CHECK_THAT(no_eq.what(), Contains("--set chunk_size") && Contains("key=value"));
  CHECK(expect_error([] { from_set({"=4"}); }).code() == Errc::usage);
  // The value is taken as written; a quoted one is YAML's quoted scalar.
  CHECK(from_set({"checkpoint='/x/y: z'"}).checkpoint == "/x/y: z");
  CHECK(from_set({"chunk_size=\"16 MiB\""}).chunk_bytes == 16ull << 20);
  CHECK(from_set({"trace=''"}).trace.empty());
  // As written: YAML would read a comment, a tag, an anchor, or no value at all.
  CHECK(from_set({"checkpoint=model #v2.safetensors"}).checkpoint == "model #v2.safetensors");
  CHECK(from_set({"rendezvous.token=abc #secretA"}).rendezvous_token == "abc #secretA");
  for (const std::string path : {"~", "null", "!bang.safetensors", "&amp.safetensors",
                                 "%pct.safetensors", "a: b", "[x]"}) {
    CHECK(from_set({"checkpoint=" + path}).checkpoint == path);
  }
  CHECK(from_set({"checkpoint=  /x/y  "}).checkpoint == "/x/y");
  for (const std::string bad : {"'q'.safetensors", "'a' # x'", "'a' 'b'", "\"a\" # \"", "'open"}) {
    INFO(bad);
    CHECK_THAT(expect_error([&] { from_set({"checkpoint=" + bad}); }).what(),
               Contains("must be one quoted string"));
  }
  CHECK(from_set({"checkpoint='it''s'"}).checkpoint == "it's");
  CHECK(from_set({"checkpoint=\"a\\\"b\""}).checkpoint == "a\"b");
  CHECK(expect_error([] { from_set({"io_depth=[1, 2]"}); }).code() == Errc::config);
  CHECK(expect_error([] { from_set({"io_depth=[1"}); }).code() == Errc::config);
  CHECK_THAT(expect_error([] { from_set({"io_depth="}); }).what(),
             Contains("--set io_depth=: has no value"));
}

TEST_CASE("config: to_yaml round-trips through load_config", "[config]") {
  test::TempDir dir;
  std::vector<Config> configs(4);
  configs[1] = from_set({"checkpoint=/data/llama-3-8b", "device=cuda", "transport=nccl",
                         "chunk_size=1000", "buffer_depth=1024", "io_depth=4096",
                         "direct_io=off", "timeout=250ms", "log_level=debug"});
  configs[2] = from_set({"chunk_size=1.5GiB", "timeout=2h", "direct_io=on", "transport=mpi"});
  configs[3].checkpoint = "weird: path # with 'quotes' and \"more\"";
  configs[3].chunk_bytes = 12345;
  configs[3].timeout = std::chrono::milliseconds(1);

  for (std::size_t i = 0; i < configs.size(); ++i) {
    const Config& original = configs[i];
    std::string yaml = original.to_yaml();
    INFO("config " << i << ":\n" << yaml);
    Config back = load_config(write_yaml(dir, yaml, "round" + std::to_string(i) + ".yaml"), {});
    CHECK(back.checkpoint == original.checkpoint);
    CHECK(back.device == original.device);
    CHECK(back.transport == original.transport);
    CHECK(back.chunk_bytes == original.chunk_bytes);
    CHECK(back.buffer_depth == original.buffer_depth);
    CHECK(back.io_depth == original.io_depth);
    CHECK(back.direct_io == original.direct_io);
    CHECK(back.timeout == original.timeout);
    CHECK(back.log_level == original.log_level);
    CHECK(back.to_yaml() == yaml);
  }
  std::string defaults = Config{}.to_yaml();
  for (const char* key : {"checkpoint:", "device: auto", "transport: auto", "chunk_size: 16MiB",
                          "buffer_depth: 4", "io_depth: 4", "direct_io: auto", "timeout: 300s",
                          "log_level: info"}) {
    CHECK_THAT(defaults, Contains(key));
  }
}

TEST_CASE("config: configs/default.yaml loads and documents every key", "[config]") {
  auto path = std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / "configs" / "default.yaml";
  REQUIRE(std::filesystem::exists(path));
  Config c = load_config(path.string(), {});
  CHECK(c.checkpoint == "/tmp/weightcast-demo");
  // The file restates the built-in defaults, so every other key must equal them.
  Config defaults;
  defaults.checkpoint = c.checkpoint;
  CHECK(c.to_yaml() == defaults.to_yaml());
}

TEST_CASE("config: configs/demo.yaml is the front page's job: fsdp on host memory, verified",
          "[config]") {
  // scripts/demo.sh launches 3 ranks with it; the README says what it shows, which holds only
  // while each rank receives its shard alone and every rank's bytes are checked.
  auto path = std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / "configs" / "demo.yaml";
  Config c = load_config(path.string(), {});
  CHECK(c.checkpoint == "/tmp/weightcast-demo");
  CHECK(c.device == DeviceKind::host);
  CHECK(c.placement.mode == PlacementMode::fsdp);
  CHECK(c.placement.rules.empty());
  CHECK(c.verify == Verify::digest);
  CHECK(c.destination == Destination::arena);
  CHECK(c.chunk_bytes * c.buffer_depth == 64ull << 20);  // the window the README names
  const std::string demo = weightcast::test::read_file(
      std::filesystem::path(WEIGHTCAST_SOURCE_DIR) / "scripts" / "demo.sh");
  CHECK(demo.find("launch -n 3 configs/demo.yaml") != std::string::npos);
  CHECK(demo.find("--target weightcast_cli") != std::string::npos);
}

TEST_CASE("config: format_bytes", "[config]") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1 KiB");
  CHECK(format_bytes(16ull << 20) == "16 MiB");
  CHECK(format_bytes(3ull << 29) == "1.50 GiB");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes((1ull << 30) - 1) == "1.00 GiB");
  CHECK(format_bytes(2023940592) == "1.88 GiB");
}
