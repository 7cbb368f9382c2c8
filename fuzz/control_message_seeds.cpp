// Writes the seed corpus of fuzz_control_message: real encoded messages, each prefixed with
// the fuzzer's mode byte (the reader), the catalogues of the given safetensors files among
// them. Usage: control_message_seeds OUT_DIR [FILE.safetensors...]
#include "weightcast/checkpoint/catalogue_wire.hpp"
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/error.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace wire = weightcast::detail;
using wire::Frame;

namespace {

int written = 0;

void seed(const std::filesystem::path& dir, const char* name, int mode, const std::string& bytes) {
  std::ofstream out(dir / (std::string(name) + "-" + std::to_string(written++)),
                    std::ios::binary | std::ios::trunc);
  out.put(static_cast<char>(mode));
  out << bytes;
}

std::string status_frame(Frame type, int status, const std::string& message) {
  return wire::frame_bytes(type, wire::encode_status(status, message));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [FILE.safetensors...]\n", argv[0]);
    return 64;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const int greeting = static_cast<int>(wire::FrameReader::greeting);
  const int root = static_cast<int>(wire::FrameReader::root);
  const int joining = static_cast<int>(wire::FrameReader::joining);
  const int peer = static_cast<int>(wire::FrameReader::peer);

  seed(dir, "hello", greeting, wire::frame_bytes(Frame::hello, wire::encode_hello({1, 2, "t0ken"})));
  seed(dir, "hello", greeting, wire::frame_bytes(Frame::hello, wire::encode_hello({7, 8, ""})));
  seed(dir, "hello", greeting,
       wire::frame_bytes(Frame::hello, wire::encode_hello({3, 4, std::string(4000, 'k')})));
  seed(dir, "stranger", greeting, "GET / HTTP/1.1\r\nHost: rank0\r\n\r\n");
  seed(dir, "report", root,
       wire::frame_bytes(Frame::report, wire::encode_report({1, 4096, 0.5, {1, 2, 3}})) +
           status_frame(Frame::abort, 74, "rank 1: reading shard 'model-00001-of-00002'"));
  seed(dir, "report", root, wire::frame_bytes(Frame::report, wire::encode_report({2, 0, 0, {}})));
  {
    // A report in pieces: REPORT_PART frames, then the REPORT that ends them.
    const std::string whole = wire::encode_report({1, 64, 0.5, {1, 2, 3, 4, 5, 6, 7, 8}});
    seed(dir, "report_part", root,
         wire::frame_bytes(Frame::report_part, whole.substr(0, 30)) +
             wire::frame_bytes(Frame::report, whole.substr(30)));
  }
  seed(dir, "progress", root,
       wire::frame_bytes(Frame::progress, wire::encode_progress(0)) +
           wire::frame_bytes(Frame::progress, wire::encode_progress(139)) +
           wire::frame_bytes(Frame::report, wire::encode_report({1, 8, 0.1, {5}})));
  seed(dir, "progress", peer,
       wire::frame_bytes(Frame::progress, wire::encode_progress(7)) +
           status_frame(Frame::abort, 75, "rank 0: no progress for 3000 ms (timeout)"));
  seed(dir, "welcome", joining, wire::frame_bytes(Frame::welcome, {}));
  seed(dir, "reject", joining, wire::frame_bytes(Frame::reject, "wrong job token"));
  seed(dir, "abort", joining,
       status_frame(Frame::abort, 75, "rank 0: rendezvous: rank(s) 2 did not join"));
  seed(dir, "verdict", peer,
       wire::frame_bytes(Frame::share, weightcast::encode_catalogue(weightcast::Catalogue{})) +
           status_frame(Frame::done, 0, "3 ranks x 291 tensors bit-exact"));
  for (int i = 2; i < argc; ++i) {
    try {
      const std::string catalogue =
          weightcast::encode_catalogue(weightcast::open_checkpoint(argv[i]));
      seed(dir, "catalogue", 4, catalogue);
      seed(dir, "share", peer,
           wire::frame_bytes(Frame::share, catalogue) + status_frame(Frame::done, 70, "differs"));
    } catch (const weightcast::Error& e) {
      std::fprintf(stderr, "control_message_seeds: skipping %s: %s\n", argv[i], e.what());
    }
  }
  std::printf("control_message_seeds: %d seeds in %s\n", written, dir.c_str());
  return 0;
}
