// The test harness's own guarantee for sanitizer builds (scripts/sanitize.sh): a sanitizer
// report in a child's output fails the test that ran it, whatever the child's exit status.
#include "support/process.hpp"

#include <catch2/catch.hpp>

using namespace weightcast::test;

namespace {
// A child that exits 0 and writes @p line to stderr, as a sanitizer runtime would.
ProcessResult child_writing(const std::string& line) {
  return run_process({"/bin/sh", "-c", "printf '%s\\n' \"$0\" >&2; exit 0", line}, {}, 30);
}
}  // namespace

TEST_CASE("process: a child's plain stderr and status come back", "[process]") {
  const auto r = child_writing("==7== a line that merely mentions ERROR: and Sanitizer");
  CHECK(r.exit_status == 0);
  CHECK(r.err == "==7== a line that merely mentions ERROR: and Sanitizer\n");
}

// [!shouldfail]: Catch counts each of these as passed only if it failed; the child exits 0,
// so only check_no_sanitizer_report can fail it (the case above shows the same child passes).
TEST_CASE("process: an AddressSanitizer report in a child fails the test", "[process][!shouldfail]") {
  child_writing("==7==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000014");
}
TEST_CASE("process: a LeakSanitizer report in a child fails the test", "[process][!shouldfail]") {
  child_writing("==7==ERROR: LeakSanitizer: detected memory leaks");
}
TEST_CASE("process: a UBSan report in a child fails the test", "[process][!shouldfail]") {
  child_writing("src/plan/plan.cpp:12:5: runtime error: signed integer overflow");
}
TEST_CASE("process: a ThreadSanitizer report in a child fails the test", "[process][!shouldfail]") {
  child_writing("WARNING: ThreadSanitizer: data race (pid=7)");
}
