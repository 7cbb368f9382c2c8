// Untrusted text (tensor and shard names from a checkpoint's header, messages from other
// ranks) never reaches the terminal as control characters: everything weightcast prints goes
// through weightcast::printable.
#include "support/paths.hpp"
#include "support/process.hpp"
#include "weightcast/core/log.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

using namespace weightcast;
using weightcast::test::run_cli;
using weightcast::test::TempDir;

namespace {

/// A name that would clear the screen and turn the text red, with an 8-bit CSI (U+009B).
const std::string hostile = "embed\x1b[2J\x1b[31mred\r\n\xc2\x9b" "0m\x7f";

/// Whether @p text holds a C0 control other than the newline ending a line, DEL, or the
/// UTF-8 form of a C1 control.
bool has_control(const std::string& text) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == '\n') continue;
    if (byte < 0x20 || byte == 0x7f) return true;
    if (byte == 0xc2 && i + 1 < text.size() &&
        static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      return true;
    }
  }
  return false;
}

/// Writes a one-tensor safetensors file whose tensor is named @p name (JSON-escaped the way a
/// hostile writer would: `\u001b`), F32 [1], with @p data_bytes of data (4 is right).
void write_checkpoint(const std::string& path, const std::string& json_name,
                      std::uint64_t end_offset, std::size_t data_bytes) {
  std::string header = "{\"" + json_name + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0," +
                       std::to_string(end_offset) + "]}}";
  std::ofstream out(path, std::ios::binary);
  const std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((length >> (8 * i)) & 0xff));
  out << header << std::string(data_bytes, '\0');
}

const std::string hostile_json = "embed\\u001b[2J\\u001b[31mred\\r\\n\\u009b0m\\u007f";

/// What the log wrote to stderr while @p body ran, with the log configured for rank @p rank
/// (then back to the default: level warn, no rank).
template <typename Body>
std::string log_output(int rank, Body body) {
  TempDir dir;
  const std::string path = (dir / "stderr.txt").string();
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  {
    FILE* file = std::fopen(path.c_str(), "w");
    REQUIRE(file != nullptr);
    dup2(fileno(file), STDERR_FILENO);
    std::fclose(file);
  }
  configure_log(LogLevel::info, rank);
  body();
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  configure_log(LogLevel::warn);
  return weightcast::test::read_file(path);
}

}  // namespace

TEST_CASE("printable escapes C0, DEL and C1 controls and keeps everything else", "[log]") {
  CHECK(printable(hostile) == "embed\\x1b[2J\\x1b[31mred\\x0d\\x0a\\x9b0m\\x7f");
  CHECK(printable("model.layers.0.self_attn.q_proj.weight") ==
        "model.layers.0.self_attn.q_proj.weight");
  CHECK(printable("é → ✓ \\x1b") == "é → ✓ \\x1b");  // UTF-8 and backslashes stay
  CHECK(printable(std::string("a\0b", 3)) == "a\\x00b");
  CHECK_FALSE(has_control(printable(hostile)));
}

TEST_CASE("printable escapes bytes that are not UTF-8, and bidi controls", "[log]") {
  CHECK(printable("bad\x9b" "31m") == "bad\\x9b31m");  // a raw 8-bit CSI
  CHECK(printable("\xff\xfe") == "\\xff\\xfe");
  CHECK(printable("\xc2") == "\\xc2");                      // cut short at the end
  CHECK(printable("\xc0\x80") == "\\xc0\\x80");           // overlong NUL
  CHECK(printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate
  CHECK(printable("\xf4\x90\x80\x80") == "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  // U+202E RIGHT-TO-LEFT OVERRIDE would show "weight.txt" for "weight\u202etxt.";
  // U+2066 LEFT-TO-RIGHT ISOLATE likewise reorders.
  CHECK(printable("a\u202eb\u2066c") == "a\\u202eb\\u2066c");
  // Well-formed text of every length is kept: 2, 3 and 4 bytes.
  CHECK(printable("\u00e9\u4e2d\U0001F600") == "\u00e9\u4e2d\U0001F600");
}

TEST_CASE("the log escapes controls in every message", "[log]") {
  const std::string text = log_output(3, [] { spdlog::warn("shard '{}' is odd", hostile); });
  INFO(text);
  CHECK(text.find("weightcast[rank 3]: ") != std::string::npos);
  CHECK(text.find("shard 'embed\\x1b[2J\\x1b[31mred\\x0d\\x0a\\x9b0m\\x7f' is odd") !=
        std::string::npos);
  CHECK_FALSE(has_control(text));
}

TEST_CASE("inspect and errors print a hostile tensor name escaped", "[log][cli]") {
  TempDir dir;
  const std::string good = (dir / "hostile.safetensors").string();
  write_checkpoint(good, hostile_json, 4, 4);
  auto listed = run_cli({"inspect", good});
  INFO(listed.out << listed.err);
  REQUIRE(listed.exit_status == 0);
  CHECK(listed.out.find("embed\\x1b[2J\\x1b[31mred\\x0d\\x0a\\x9b0m\\x7f") != std::string::npos);
  CHECK_FALSE(has_control(listed.out));
  CHECK_FALSE(has_control(listed.err));

  // The same name on a tensor whose bytes run past the file: the error names it, escaped.
  const std::string bad = (dir / "bad.safetensors").string();
  write_checkpoint(bad, hostile_json, 64, 4);
  auto failed = run_cli({"inspect", bad});
  INFO(failed.out << failed.err);
  CHECK(failed.exit_status == 65);
  CHECK(failed.err.find("embed\\x1b[2J") != std::string::npos);
  CHECK_FALSE(has_control(failed.err));
  CHECK_FALSE(has_control(failed.out));
}

TEST_CASE("the log takes lines from several threads at once, each whole", "[log]") {
  // The interrupt watcher, load_async's thread and the control plane's reader log beside the
  // main thread. The logger's sink was single-threaded: a data race (scripts/sanitize.sh
  // runs this under TSan, which halts on it).
  constexpr int threads = 4;
  constexpr int lines = 200;
  const std::string text = log_output(1, [] {
    std::vector<std::jthread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([t] {
        for (int i = 0; i < lines; ++i) spdlog::warn("thread {} line {} of the test", t, i);
      });
    }
  });
  for (int t = 0; t < threads; ++t) {
    for (int i = 0; i < lines; ++i) {
      const std::string line =
          fmt::format("weightcast[rank 1]: warning: thread {} line {} of the test\n", t, i);
      INFO(line);
      REQUIRE(text.find(line) != std::string::npos);
    }
  }
  CHECK(std::count(text.begin(), text.end(), '\n') == threads * lines);
}
