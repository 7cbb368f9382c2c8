// The launcher's command line (tools/weightcast.cpp): every subcommand's parse errors read like
// weightcast's other errors, and --help / --version still succeed.
#include "support/paths.hpp"
#include "support/process.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/core.h>

#include <filesystem>
#include <string>
#include <vector>

using namespace weightcast::test;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TEST_CASE("cli: launch --grace reads a duration as a config does", "[cli]") {
  // `5s` was refused as "not a number" while every duration in a config takes a unit. The
  // rank then fails on the checkpoint (66): the options parsed.
  for (const std::string grace : {"5s", "500ms", "2.5", "0"}) {
    INFO(grace);
    const auto r = run_cli({"launch", "-n", "1", "--spawner", "local", "--grace", grace, "--set",
                            "checkpoint=/does/not/exist.safetensors"},
                           {}, 60);
    CHECK(r.exit_status == 66);
    CHECK_THAT(r.err, !Contains("--grace"));
  }
}

TEST_CASE("cli: a parse error of any subcommand is one 'weightcast: error:' line, status 64",
          "[cli]") {
  struct Case {
    std::vector<std::string> args;
    std::string what;  // the part of the line that says what is wrong
    std::string help;  // the --help the line points to
  };
  const std::vector<Case> cases{
      {{"run", "--bogus"}, "run: The following argument was not expected: --bogus",
       "weightcast run --help"},
      {{"run", "--set"}, "run: --set: 1 required TEXT missing", "weightcast run --help"},
      {{"run", "a.yaml", "b.yaml"}, "run: The following argument was not expected: b.yaml",
       "weightcast run --help"},
      {{"launch"}, "launch: --ranks is required", "weightcast launch --help"},
      {{"launch", "-n", "0"}, "launch: --ranks: '0' is out of range (1 to 4096 ranks)",
       "weightcast launch --help"},
      {{"launch", "-n", "99999999999"}, "launch: --ranks: '99999999999' is out of range",
       "weightcast launch --help"},
      // CLI11 alone read 0x2 as 2 ranks, and called 1.5 and 1e3 out of range.
      {{"launch", "-n", "0x2"}, "launch: --ranks: '0x2' is not a whole number of ranks",
       "weightcast launch --help"},
      {{"launch", "-n", "1.5"}, "launch: --ranks: '1.5' is not a whole number of ranks",
       "weightcast launch --help"},
      {{"launch", "-n", "-1"}, "launch: --ranks: '-1' is not a whole number of ranks",
       "weightcast launch --help"},
      {{"launch", "-n", "2", "--spawner", "ssh"}, "launch: --spawner: ssh not in",
       "weightcast launch --help"},
      // NaN passes every range check made of comparisons.
      {{"launch", "-n", "2", "--grace", "nan"}, "launch: --grace: 'nan' is not a duration",
       "weightcast launch --help"},
      // std::stod read 0x10 as 16 seconds; --grace now reads durations as a config does.
      {{"launch", "-n", "2", "--grace", "0x10"}, "launch: --grace: '0x10' is not a duration",
       "weightcast launch --help"},
      {{"launch", "-n", "2", "--grace", "11m"}, "launch: --grace: '11m' is out of range",
       "weightcast launch --help"},
      // A negative grace named a duration's range (0 to 9223372036854775807 ms), not --grace's.
      {{"launch", "-n", "2", "--grace", "-1"},
       "launch: --grace: '-1' is out of range (0 to 600 seconds)", "weightcast launch --help"},
      {{"inspect"}, "inspect: path is required", "weightcast inspect --help"},
      {{"inspect", "a", "b"}, "inspect: The following argument was not expected: b",
       "weightcast inspect --help"},
      {{"synth"}, "synth: out_dir is required", "weightcast synth --help"},
      // CLI11 read "-1" and anything over 2^64 - 1 as 2^64 - 1, silently.
      {{"synth", "out", "--seed", "x"},
       "synth: --seed: 'x' is not a whole number from 0 to 18446744073709551615",
       "weightcast synth --help"},
      {{"synth", "out", "--seed", "-1"}, "synth: --seed: '-1' is not a whole number",
       "weightcast synth --help"},
      {{"synth", "out", "--seed", "18446744073709551616"},
       "synth: --seed: '18446744073709551616' is not a whole number", "weightcast synth --help"},
      {{}, "a subcommand is required: run, launch, inspect or synth", "weightcast --help"},
      {{"lod"}, "'lod' is not a subcommand: run, launch, inspect or synth", "weightcast --help"},
      {{"--bogus"}, "unknown option '--bogus'", "weightcast --help"},
      // CLI11 acts on --version as soon as it sees it and would ignore the rest.
      {{"--version", "extra"}, "--version takes no other arguments, got 'extra'",
       "weightcast --help"},
      {{"extra", "--version"}, "--version takes no other arguments, got 'extra'",
       "weightcast --help"},
      {{"--version", "run", "a.yaml"}, "--version takes no other arguments, got 'run'",
       "weightcast --help"},
  };
  for (const auto& c : cases) {
    const auto r = run_cli(c.args, {}, 30);
    INFO("args: " << (c.args.empty() ? std::string() : c.args.front()) << " ...\nstdout:\n"
                  << r.out << "\nstderr:\n" << r.err);
    CHECK(r.exit_status == 64);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, StartsWith("weightcast: error: " + c.what));
    CHECK_THAT(r.err, Contains("see '" + c.help + "'"));
    // One line, like every other weightcast error.
    CHECK(r.err.find('\n') == r.err.size() - 1);
  }
}

TEST_CASE("cli: a parse error quotes the command line with its control characters escaped",
          "[cli]") {
  const auto r = run_cli({"run", "--\x1b[2Jx"}, {}, 30);
  INFO(r.err);
  CHECK(r.exit_status == 64);
  CHECK_THAT(r.err, Contains("--\\x1b[2Jx"));
  CHECK(r.err.find('\x1b') == std::string::npos);
}

TEST_CASE("cli: --help of every subcommand and --version exit 0 on stdout", "[cli]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--help"}, "SUBCOMMAND"},          {{"run", "--help"}, "--quiet"},
      {{"launch", "--help"}, "--spawner"}, {{"launch", "-h"}, "--ranks"},
      {{"inspect", "--help"}, "path"},     {{"synth", "--help"}, "--shard-size"},
      {{"--version"}, "weightcast "},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = run_cli(args, {}, 30);
    INFO(args.front() << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(r.exit_status == 0);
    CHECK(r.err.empty());
    CHECK_THAT(r.out, Contains(expected));
  }
}

TEST_CASE("cli: a pipe closed early is a failed write to stdout, 74 with the reason",
          "[cli][stdout]") {
  // `inspect big | head -c1` died of SIGPIPE (141) with no word.
  TempDir dir;
  std::string header = "{";
  for (int i = 0; i < 4000; ++i) {  // some 300 KiB of table, well over a pipe's 64 KiB
    header += fmt::format(R"({}"tensor.{:05}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})",
                          i == 0 ? "" : ",", i, i, i + 1);
  }
  header += "}";
  const auto many = dir / "many.safetensors";
  write_file(many, make_safetensors(header, zeros(4000)));
  const auto r = run_process({"/bin/bash", "-c",
                              "\"$0\" inspect \"$1\" | head -c1 >/dev/null; "
                              "exit ${PIPESTATUS[0]}",
                              cli_path().string(), many.string()},
                             {}, 60);
  INFO(r.err);
  CHECK(r.exit_status == 74);
  CHECK_THAT(r.err, Catch::Contains("weightcast: error: cannot write to stdout: Broken pipe"));
}

TEST_CASE("cli: an error with stderr closed or full still exits with its own status",
          "[cli][stdout]") {
  // Printing the error threw from main's handler (fmt::print meets EBADF or ENOSPC), and the
  // process died of SIGABRT, 134, whatever had failed.
  if (!std::filesystem::exists("/dev/full")) return;
  TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, int>> commands{
      {{"inspect", (dir / "absent").string()}, 66},
      {{"inspect", (corpus_dir() / "malformed" / "bad_hole.safetensors").string()}, 65},
      {{"run", "--set", "bogus=1"}, 78},
      {{"run", "--bogus"}, 64},
      {{"synth", (dir / "s").string(), "--params", "abc"}, 64},
      {{"launch", "-n", "1", "--set", "checkpoint=" + (dir / "absent").string()}, 66},
  };
  for (const auto& [args, status] : commands) {
    for (const std::string redirect : {"2> /dev/full", "2>&-"}) {
      std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" " + redirect,
                                    cli_path().string()};
      argv.insert(argv.end(), args.begin(), args.end());
      const auto r = run_process(argv, {}, 60);
      INFO(args.front() << " " << args.back() << " " << redirect << "\nstdout:\n" << r.out);
      CHECK(r.exit_status == status);
    }
  }
}

TEST_CASE("cli: a failed write to stdout exits 74 with one line on stderr, for every command",
          "[cli][stdout]") {
  // The JSON summary to a full disk was lost with exit 0; inspect's larger output became
  // "internal error" (70). /dev/full fails every write with ENOSPC.
  if (!std::filesystem::exists("/dev/full")) return;
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  // Over 4 KiB of inspect output (stdio's buffer), so fmt::print itself meets the error.
  std::string header = "{";
  for (int i = 0; i < 300; ++i) {
    header += fmt::format(R"({}"tensor.{:04}":{{"dtype":"U8","shape":[1],"data_offsets":[{},{}]}})",
                          i == 0 ? "" : ",", i, i, i + 1);
  }
  header += "}";
  const auto many = dir / "many.safetensors";
  write_file(many, make_safetensors(header, zeros(300)));
  const std::string checkpoint = "checkpoint=" + file.string();
  const std::vector<std::vector<std::string>> commands{
      {"run", "-q", "--json", "--set", checkpoint},
      {"run", "--set", checkpoint},
      {"inspect", file.string()},
      {"inspect", many.string()},
      {"synth", (dir / "synth").string(), "--params", "1M"},
      {"run", "--help"},
      {"--version"},
  };
  for (const auto& args : commands) {
    for (const std::string redirect : {"> /dev/full", ">&-"}) {
      std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" " + redirect,
                                    cli_path().string()};
      argv.insert(argv.end(), args.begin(), args.end());
      const auto r = run_process(argv, {}, 60);
      INFO(args.front() << " " << args.back() << " " << redirect << "\nstderr:\n" << r.err);
      CHECK(r.exit_status == 74);
      // With the reason, also where a flush had met the error first (`run --json`).
      CHECK_THAT(r.err, Catch::Contains(redirect == ">&-"
                                            ? "weightcast: error: cannot write to stdout: Bad "
                                              "file descriptor\n"
                                            : "weightcast: error: cannot write to stdout: No "
                                              "space left on device\n"));
      CHECK_THAT(r.err, !Catch::Contains("internal error"));
      std::filesystem::remove_all(dir / "synth");
    }
  }
}

TEST_CASE("cli: --set takes one value, so a config path after it is the config", "[cli]") {
  // `--set device=host c.yaml` was read as two overrides, the second "c.yaml: expected
  // key=value" (64).
  const auto file = weightcast::test::small_checkpoint();
  TempDir dir;
  const auto config = dir / "c.yaml";
  write_file(config, "checkpoint: " + file.string() + "\ndestination: discard\n");
  const std::vector<std::vector<std::string>> commands{
      {"run", "-q", "--set", "device=host", config.string()},
      {"run", "-q", "--set", "device=host", "--set", "transport=local", config.string()},
      {"launch", "-n", "1", "--spawner", "local", "-q", "--set", "device=host", "--set",
       "transport=local", config.string()},
  };
  for (const auto& args : commands) {
    const auto r = run_cli(args, {}, 60);
    INFO(args.front() << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(r.exit_status == 0);
    CHECK_THAT(r.out, Contains("# rank 0 of 1: "));
  }
  // Two values after one --set: the second is the config, and a third is one too many.
  const auto r = run_cli({"run", "--set", "device=host", "a.yaml", "b.yaml"}, {}, 30);
  CHECK(r.exit_status == 64);
  CHECK_THAT(r.err, StartsWith("weightcast: error: run: The following argument was not "
                               "expected: b.yaml"));
}

TEST_CASE("cli: an empty path on the command line is refused naming what it is, status 64",
          "[cli]") {
  // `inspect ''` said "error: : no such file or directory"; `run ''` ran on built-in defaults,
  // `--report ''` wrote no report, `synth ''` was an internal error.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"run", ""}, "run: config: the config path is empty"},
      {{"run", "--report", "", "--set", "checkpoint=x"}, "run: --report: the report path is empty"},
      {{"run", "--trace", "", "--set", "checkpoint=x"}, "run: --trace: the trace path is empty"},
      {{"launch", "-n", "2", ""}, "launch: config: the config path is empty"},
      {{"launch", "-n", "2", "--report", ""}, "launch: --report: the report path is empty"},
      {{"launch", "-n", "2", "--trace", ""}, "launch: --trace: the trace path is empty"},
      {{"inspect", ""}, "inspect: path: the checkpoint path is empty"},
      {{"synth", ""}, "synth: out_dir: the output directory path is empty"},
  };
  for (const auto& [args, what] : cases) {
    const auto r = run_cli(args, {}, 30);
    INFO(args.front() << " " << args.at(1) << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
    CHECK(r.exit_status == 64);
    CHECK(r.out.empty());
    CHECK_THAT(r.err, StartsWith("weightcast: error: " + what + "; see 'weightcast " +
                                 args.front() + " --help'"));
  }
}
