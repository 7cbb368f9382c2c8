// A NUL byte in a path or a config value. The kernel reads a path up to its first NUL, so
// `checkpoint: "model.safetensors\0x"` loaded model.safetensors with exit 0, and `trace:` wrote
// the file named by the part before the NUL; messages, C strings, were cut at it. Every such
// path and value is refused before anything is opened, and messages keep what follows a NUL.
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/config.hpp"
#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/pipeline/loader.hpp"
#include "weightcast/format/safetensors.hpp"
#include "weightcast/checkpoint/synth.hpp"
#include "weightcast/pipeline/trace.hpp"

#include "support/expect_error.hpp"
#include "support/paths.hpp"
#include "support/process.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

using namespace weightcast;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using weightcast::test::expect_error;
namespace fs = std::filesystem;

namespace {

using namespace std::string_literals;

/// The names in @p dir.
std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

/// A one-tensor checkpoint at @p path.
void write_checkpoint(const fs::path& path) {
  test::write_file(path, test::make_safetensors(
                             R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "abcd"));
}

}  // namespace

TEST_CASE("nul: an Error's message keeps what follows a NUL byte, escaped", "[nul]") {
  const Error e(Errc::io, "a\0b\0\0c"s);
  CHECK(std::string(e.what()) == "a\\x00b\\x00\\x00c");
  CHECK(std::string(Error(Errc::io, "no nul").what()) == "no nul");
}

TEST_CASE("nul: a config value holding a NUL byte is refused for every key, in a file and "
          "in --set",
          "[nul][config]") {
  test::TempDir dir;
  // Every key the config has, from its own effective-config listing.
  std::vector<std::string> keys;
  for (const auto& entry : YAML::Load(Config{}.to_yaml())) {
    keys.push_back(entry.first.as<std::string>());
  }
  REQUIRE(keys.size() >= 19);
  for (const auto& key : keys) {
    INFO(key);
    const bool secret = key == "rendezvous.token";
    const std::string shown = secret ? "the value" : "'16\\x00MiB'";
    const std::string reason =
        " holds a NUL byte at byte 2: no setting can hold one, and a path would end there";

    const auto file = dir / "c.yaml";
    test::write_file(file, key + ": \"16\\0MiB\"\n");
    auto e = expect_error([&] { load_config(file.string(), {}); });
    CHECK(e.code() == Errc::config);
    CHECK(std::string(e.what()) == fmt::format("{}:1: {}: {}{}", file.string(), key, shown, reason));

    auto set = expect_error([&] { load_config("", {key + "=\"16\\0MiB\""}); });
    CHECK(set.code() == Errc::config);
    const std::string where = secret ? "--set " + key : "--set " + key + "=\"16\\0MiB\"";
    CHECK(std::string(set.what()) == fmt::format("{}: {}{}", where, shown, reason));
  }
}

TEST_CASE("nul: a key holding a NUL byte is named whole", "[nul][config]") {
  test::TempDir dir;
  const auto file = dir / "c.yaml";
  test::write_file(file, "\"chunk_size\\0x\": 1MiB\n");
  auto e = expect_error([&] { load_config(file.string(), {}); });
  CHECK(e.code() == Errc::config);
  CHECK_THAT(e.what(), Contains("unknown key 'chunk_size\\x00x'"));
}

TEST_CASE("nul: API paths holding a NUL byte are usage (64), never the shorter path",
          "[nul][checkpoint]") {
  test::TempDir dir;
  write_checkpoint(dir / "model.safetensors");
  const fs::path nul = (dir / "model.safetensors").string() + "\0x"s;
  const std::string shown = (dir / "model.safetensors").string() + "\\x00x";

  auto opened = expect_error([&] { open_checkpoint(nul); });
  CHECK(opened.code() == Errc::usage);
  CHECK(std::string(opened.what()) ==
        fmt::format("the checkpoint path '{}' holds a NUL byte at byte {}: a path ends at its "
                    "first NUL, so it would name '{}'",
                    shown, (dir / "model.safetensors").string().size(),
                    (dir / "model.safetensors").string()));
  CHECK(expect_error([&] { load(nul); }).code() == Errc::usage);
  auto header = expect_error([&] { read_safetensors_header(nul); });
  CHECK(header.code() == Errc::usage);
  CHECK_THAT(header.what(), Contains(shown));
  // The lowest layer refuses too, for any caller that did not check.
  errno = 0;
  CHECK(detail::open_input_nonblocking(nul) == -1);
  CHECK(errno == EINVAL);
}

TEST_CASE("nul: an output path holding a NUL byte creates nothing", "[nul]") {
  test::TempDir dir;
  const fs::path trace_path = (dir / "t.json").string() + "\0x"s;
  auto trace = expect_error([&] { TraceRecorder(0).write(trace_path); });
  CHECK(trace.code() == Errc::usage);
  CHECK_THAT(trace.what(), StartsWith("the trace file path '") && Contains("t.json\\x00x'"));

  auto synth = expect_error([&] {
    write_synthetic_checkpoint((dir / "ckpt").string() + "\0x"s, SynthOptions{1000, Dtype::F16, 1 << 20, 1});
  });
  CHECK(synth.code() == Errc::usage);
  CHECK_THAT(synth.what(), Contains("ckpt\\x00x"));
  CHECK(names_in(dir.path()).empty());
}

TEST_CASE("nul: run refuses a NUL in checkpoint and trace with 78 before loading",
          "[nul][cli]") {
  test::TempDir dir;
  write_checkpoint(dir / "model.safetensors");
  // Before: exit 0, model.safetensors loaded, and the trace written to t.json.
  const auto config = dir / "c.yaml";
  test::write_file(config, fmt::format("checkpoint: \"{}\\0x\"\ntrace: \"{}\\0x\"\n",
                                       (dir / "model.safetensors").string(),
                                       (dir / "t.json").string()));
  auto r = test::run_cli({"run", config.string()});
  INFO(r.out << r.err);
  CHECK(r.exit_status == 78);
  CHECK_THAT(r.err, Contains("checkpoint: '") && Contains("model.safetensors\\x00x' holds a NUL"));
  CHECK(names_in(dir.path()) == std::set<std::string>{"c.yaml", "model.safetensors"});
}
