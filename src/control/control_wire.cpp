// The control plane's messages as bytes. No sockets here: rank 0's listener, the peers and
// the fuzzer all decode through these functions.
#include "weightcast/control/detail/control_wire.hpp"

#include "weightcast/core/detail/wire.hpp"
#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <cstring>
#include <limits>

namespace weightcast::detail {

namespace {

std::string_view frame_name(std::uint8_t type) {
  switch (static_cast<Frame>(type)) {
    case Frame::hello: return "hello";
    case Frame::welcome: return "welcome";
    case Frame::reject: return "refusal";
    case Frame::share: return "share";
    case Frame::abort: return "abort";
    case Frame::report: return "report";
    case Frame::done: return "verdict";
    case Frame::progress: return "progress";
    case Frame::share_part: return "share part";
    case Frame::report_part: return "report part";
  }
  return "unknown";
}

// The longest payload @p reader takes in a frame of @p type; 0 with `accepted` false when it
// takes no such frame.
std::uint32_t payload_limit(Frame type, FrameReader reader, bool& accepted) {
  accepted = true;
  switch (reader) {
    case FrameReader::greeting:
      if (type == Frame::hello) return max_hello_bytes;
      break;
    case FrameReader::root:
      if (type == Frame::report || type == Frame::report_part) return max_share_bytes;
      if (type == Frame::abort) return max_status_bytes;
      if (type == Frame::progress) return progress_bytes;
      break;
    case FrameReader::joining:
      if (type == Frame::welcome) return 0;
      if (type == Frame::reject || type == Frame::abort) return max_status_bytes;
      break;
    case FrameReader::peer:
      if (type == Frame::share || type == Frame::share_part) return max_share_bytes;
      if (type == Frame::abort || type == Frame::done) return max_status_bytes;
      if (type == Frame::progress) return progress_bytes;
      break;
  }
  accepted = false;
  return 0;
}

void refuse_trailing(const WireReader& in) {
  if (in.left() != 0) in.fail("end", fmt::format("{} trailing bytes", in.left()));
}

}  // namespace

FrameHeader decode_frame_header(const std::array<char, frame_header_bytes>& bytes,
                                FrameReader reader, std::string_view what) {
  const auto type = static_cast<std::uint8_t>(bytes[0]);
  std::uint32_t length = 0;
  std::memcpy(&length, bytes.data() + 1, sizeof length);
  bool accepted = false;
  const std::uint32_t limit = payload_limit(static_cast<Frame>(type), reader, accepted);
  if (!accepted) {
    throw Error(Errc::unavailable,
                fmt::format("{}: unexpected message type {} ({})", what, type, frame_name(type)));
  }
  if (length > limit) {
    throw Error(Errc::unavailable,
                fmt::format("{}: {} message of {} bytes, over the limit of {}", what,
                            frame_name(type), length, limit));
  }
  return {static_cast<Frame>(type), length};
}

std::string frame_bytes(Frame type, std::string_view payload) {
  if (payload.size() > std::numeric_limits<std::uint32_t>::max()) {
    throw Error(Errc::internal, fmt::format("control plane: a {} message of {} bytes does not "
                                            "fit a frame",
                                            frame_name(static_cast<std::uint8_t>(type)),
                                            payload.size()));
  }
  std::string bytes(frame_header_bytes, '\0');
  bytes[0] = static_cast<char>(type);
  const auto length = static_cast<std::uint32_t>(payload.size());
  std::memcpy(bytes.data() + 1, &length, sizeof length);
  bytes.append(payload);
  return bytes;
}

std::string encode_hello(const Hello& hello) {
  WireWriter out;
  out.put(hello_magic);
  out.put(protocol_version);
  out.put(hello.rank);
  out.put(hello.world_size);
  out.put_string(hello.token);
  out.put_string(hello.job_id);
  return std::move(out.bytes());
}

Hello decode_hello(std::string_view payload, std::string_view what) {
  WireReader in(payload, what);
  if (in.get<std::uint32_t>("magic") != hello_magic) in.fail("magic", "not weightcast");
  if (const auto version = in.get<std::uint32_t>("version"); version != protocol_version) {
    in.fail("version", fmt::format("protocol version {}, rank 0 speaks {} (mixed weightcast "
                                   "builds?)",
                                   version, protocol_version));
  }
  Hello hello;
  hello.rank = in.get<std::int32_t>("rank");
  hello.world_size = in.get<std::int32_t>("world size");
  hello.token = in.get_string("token");
  hello.job_id = in.get_string("job id");
  refuse_trailing(in);
  return hello;
}

std::string encode_status(int status, std::string_view message) {
  WireWriter out;
  out.put(static_cast<std::int32_t>(status));
  out.put_string(message.substr(0, max_status_message_bytes));
  return std::move(out.bytes());
}

StatusMessage decode_status(std::string_view payload, std::string_view what) {
  WireReader in(payload, what);
  const auto status = in.get<std::int32_t>("status");
  std::string message = in.get_string("message");
  refuse_trailing(in);
  // A status outside 0..125 would read as a signal to the shell; only a rank's interrupt
  // (130, 143: it got SIGINT or SIGTERM) passes as one, so that every rank ends as it did.
  const bool interrupt =
      status == exit_status(Errc::interrupted) || status == exit_status(Errc::terminated);
  return {(status >= 0 && status < 126) || interrupt ? status : exit_status(Errc::unavailable),
          std::move(message)};
}

std::string encode_report(const RankReport& report) {
  WireWriter out;
  out.put(static_cast<std::int32_t>(report.rank));
  out.put(report.bytes);
  std::uint64_t seconds_bits = 0;
  std::memcpy(&seconds_bits, &report.seconds, sizeof seconds_bits);
  out.put(seconds_bits);
  out.put(static_cast<std::uint32_t>(report.digests.size()));
  for (const std::uint64_t digest : report.digests) out.put(digest);
  out.put(static_cast<std::uint32_t>(report.expected.size()));
  for (const std::uint64_t digest : report.expected) out.put(digest);
  return std::move(out.bytes());
}

RankReport decode_report(std::string_view payload, std::string_view what) {
  WireReader in(payload, what);
  RankReport report;
  report.rank = in.get<std::int32_t>("rank");
  report.bytes = in.get<std::uint64_t>("bytes");
  const auto seconds_bits = in.get<std::uint64_t>("seconds");
  std::memcpy(&report.seconds, &seconds_bits, sizeof seconds_bits);
  const auto count = in.get<std::uint32_t>("digest count");
  in.need_items(count, sizeof(std::uint64_t), "digests");
  report.digests.resize(count);
  for (std::uint64_t& digest : report.digests) digest = in.get<std::uint64_t>("digest");
  const auto expected = in.get<std::uint32_t>("expected digest count");
  in.need_items(expected, sizeof(std::uint64_t), "expected digests");
  report.expected.resize(expected);
  for (std::uint64_t& digest : report.expected) digest = in.get<std::uint64_t>("expected digest");
  refuse_trailing(in);
  return report;
}

std::string encode_progress(std::uint64_t chunks_landed) {
  WireWriter out;
  out.put(chunks_landed);
  return std::move(out.bytes());
}

std::uint64_t decode_progress(std::string_view payload, std::string_view what) {
  WireReader in(payload, what);
  const auto chunks = in.get<std::uint64_t>("chunks landed");
  refuse_trailing(in);
  return chunks;
}

bool tokens_equal(std::string_view presented, std::string_view expected) noexcept {
  // Every byte of the expected token is compared whatever the presented one holds; only the
  // lengths' equality shows in the time taken.
  unsigned char differ = presented.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const char p = i < presented.size() ? presented[i] : '\0';
    differ |= static_cast<unsigned char>(p ^ expected[i]);
  }
  return differ == 0;
}

}  // namespace weightcast::detail
