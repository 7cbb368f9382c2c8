#include "weightcast/core/log.hpp"

#include <fmt/core.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>

namespace weightcast {

namespace {

/// Bidirectional formatting controls (Unicode TR9): they reorder how a line displays, so a
/// name could show as something else ("Trojan Source", CVE-2021-42574).
bool is_bidi_control(char32_t c) {
  return c == 0x061c || c == 0x200e || c == 0x200f || (c >= 0x202a && c <= 0x202e) ||
         (c >= 0x2066 && c <= 0x2069);
}

/// Length of the well-formed UTF-8 sequence at @p text (Unicode Table 3-7), 0 when the bytes
/// there are not one; @p code_point receives its value.
std::size_t utf8_sequence(std::string_view text, char32_t& code_point) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // no overlong forms
    if (lead == 0xed) high = 0x9f;  // no surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < low || byte(1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xbf) return 0;
  }
  code_point = lead & (0xff >> (length + 1));
  for (std::size_t i = 1; i < length; ++i) code_point = (code_point << 6) | (byte(i) & 0x3f);
  return length;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte < 0x80) {
      if (byte < 0x20 || byte == 0x7f) {
        out += fmt::format("\\x{:02x}", byte);
      } else {
        out += static_cast<char>(byte);
      }
      ++i;
      continue;
    }
    char32_t code_point = 0;
    const std::size_t length = utf8_sequence(text.substr(i), code_point);
    if (length == 0) {  // not UTF-8: a raw 0x9b would be the 8-bit CSI on some terminals
      out += fmt::format("\\x{:02x}", byte);
      ++i;
      continue;
    }
    if (code_point <= 0x9f) {  // C1 controls, U+0080..U+009F
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(code_point));
    } else if (is_bidi_control(code_point)) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(code_point));
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

namespace {

/// `%*` in the log pattern: the message, through `printable`.
class PrintablePayload final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*time*/,
              spdlog::memory_buf_t& dest) override {
    const std::string text = printable(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(text.data(), text.data() + text.size());
  }
  [[nodiscard]] std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<PrintablePayload>();
  }
};

}  // namespace

void configure_log(LogLevel level, int rank) {
  // Replace any logger of that name, so that calling this again (a new rank, a new level)
  // does not throw "logger with name 'weightcast' already exists".
  spdlog::drop("weightcast");
  // The _mt sink: the interrupt watcher, load_async's thread and the control plane's
  // reader log beside the main thread (a single-threaded sink races on its buffer).
  auto logger = spdlog::stderr_logger_mt("weightcast");
  auto formatter = std::make_unique<spdlog::pattern_formatter>();
  formatter->add_flag<PrintablePayload>('*').set_pattern(
      rank < 0 ? "weightcast: %^%l%$: %*"
               : "weightcast[rank " + std::to_string(rank) + "]: %^%l%$: %*");
  logger->set_formatter(std::move(formatter));
  switch (level) {
    case LogLevel::error: logger->set_level(spdlog::level::err); break;
    case LogLevel::warn: logger->set_level(spdlog::level::warn); break;
    case LogLevel::info: logger->set_level(spdlog::level::info); break;
    case LogLevel::debug: logger->set_level(spdlog::level::debug); break;
  }
  spdlog::set_default_logger(logger);
}

}  // namespace weightcast
