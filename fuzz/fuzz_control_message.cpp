// Fuzzes the control plane's message decoders: what rank 0 reads from a connection that has
// not shown the job token (HELLO), from a peer (REPORT, ABORT), and what a peer reads from
// rank 0 (its answer to the HELLO; SHARE carrying the catalogue, ABORT, the verdict).
//
// The first input byte picks the reader; the rest is the byte stream off its socket, read as
// frames until it ends (mode 4: the rest is one encoded catalogue). Every frame header must
// be refused or bounded before its payload is taken, and every payload must decode into
// something that re-encodes to the same bytes, or throw weightcast::Error (unavailable).
#include "weightcast/checkpoint/catalogue_wire.hpp"
#include "weightcast/control/detail/control_wire.hpp"
#include "weightcast/core/error.hpp"

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace wire = weightcast::detail;
using weightcast::Errc;
using weightcast::Error;

namespace {

void check_error(const Error& e, bool from_stranger) {
  const std::string_view message = e.what();
  if (e.code() != Errc::unavailable || message.empty()) std::abort();
  // Rank 0 logs why it refused a stranger: the line must stay one line.
  if (from_stranger && message.find('\n') != std::string_view::npos) std::abort();
}

void round_trip_catalogue(std::string_view bytes) {
  const weightcast::Catalogue catalogue = weightcast::decode_catalogue(bytes, "fuzz");
  const std::string again = weightcast::encode_catalogue(catalogue);
  const weightcast::Catalogue back = weightcast::decode_catalogue(again, "fuzz again");
  if (weightcast::encode_catalogue(back) != again) std::abort();
  if (back.tensors.size() != catalogue.tensors.size()) std::abort();
}

void decode_payload(wire::Frame type, std::string_view payload) {
  switch (type) {
    case wire::Frame::hello: {
      const wire::Hello hello = wire::decode_hello(payload, "hello");
      if (wire::encode_hello(hello) != payload) std::abort();
      // Equal tokens compare equal, and a changed byte does not.
      if (!wire::tokens_equal(hello.token, hello.token)) std::abort();
      if (!hello.token.empty()) {
        std::string other = hello.token;
        other.back() = static_cast<char>(other.back() ^ 1);
        if (wire::tokens_equal(other, hello.token)) std::abort();
      }
      return;
    }
    case wire::Frame::report: {
      const weightcast::RankReport report = wire::decode_report(payload, "report");
      if (wire::encode_report(report) != payload) std::abort();
      return;
    }
    case wire::Frame::abort:
    case wire::Frame::done: {
      const wire::StatusMessage status = wire::decode_status(payload, "status");
      // 0..125, or a rank's interrupt (130 SIGINT, 143 SIGTERM), which passes as it is.
      const bool interrupt = status.status == 130 || status.status == 143;
      if ((status.status < 0 || status.status > 125) && !interrupt) std::abort();
      if (status.message.size() <= wire::max_status_message_bytes &&
          wire::encode_status(status.status, status.message).size() != payload.size()) {
        std::abort();
      }
      return;
    }
    case wire::Frame::share:
      // The first SHARE is the catalogue; its decoder must hold on any bytes.
      round_trip_catalogue(payload);
      return;
    case wire::Frame::share_part:
      return;  // opaque bytes: a piece of a SHARE, judged once whole (as above)
    case wire::Frame::report_part:
      return;  // opaque bytes: a piece of a REPORT, judged once whole (as above)
    case wire::Frame::welcome:
      if (!payload.empty()) std::abort();  // the header check allows none
      return;
    case wire::Frame::reject:
      return;  // text, shown to the user as it is
    case wire::Frame::progress:
      if (wire::encode_progress(wire::decode_progress(payload, "progress")) != payload) {
        std::abort();
      }
      return;
  }
  std::abort();  // decode_frame_header let an unknown type through
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 5;
  std::string_view stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode == 4) {
    try {
      round_trip_catalogue(stream);
    } catch (const Error& e) {
      check_error(e, false);
    }
    return 0;
  }
  const wire::FrameReader reader = static_cast<wire::FrameReader>(mode);
  const bool from_stranger = reader == wire::FrameReader::greeting;
  while (stream.size() >= wire::frame_header_bytes) {
    std::array<char, wire::frame_header_bytes> header{};
    std::memcpy(header.data(), stream.data(), header.size());
    stream.remove_prefix(header.size());
    wire::FrameHeader frame{};
    try {
      frame = wire::decode_frame_header(header, reader, "fuzz");
    } catch (const Error& e) {
      check_error(e, from_stranger);
      return 0;  // the connection is dropped
    }
    std::uint32_t claimed = 0;
    std::memcpy(&claimed, header.data() + 1, sizeof claimed);
    if (frame.payload_bytes != claimed || frame.payload_bytes > wire::max_share_bytes) {
      std::abort();
    }
    if (frame.payload_bytes > stream.size()) return 0;  // the connection closed mid-frame
    try {
      decode_payload(frame.type, stream.substr(0, frame.payload_bytes));
    } catch (const Error& e) {
      check_error(e, from_stranger);
      return 0;
    }
    stream.remove_prefix(frame.payload_bytes);
    if (from_stranger) return 0;  // rank 0 reads one frame from a stranger
  }
  return 0;
}
