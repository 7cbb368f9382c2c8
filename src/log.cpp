#include "weightcast/log.hpp"

#include <fmt/core.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <memory>

namespace weightcast {

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0u;
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else if (byte == 0xc2 && next >= 0x80 && next <= 0x9f) {  // UTF-8 of U+0080..U+009F
      out += fmt::format("\\x{:02x}", next);
      ++i;
    } else {
      out += static_cast<char>(byte);
    }
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
  auto logger = spdlog::stderr_logger_st("weightcast");
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
