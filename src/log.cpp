#include "weightcast/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace weightcast {

void configure_log(LogLevel level, int rank) {
  auto logger = spdlog::stderr_logger_st("weightcast");
  spdlog::drop("weightcast");
  logger = spdlog::stderr_logger_st("weightcast");
  logger->set_pattern(rank < 0 ? "weightcast: %^%l%$: %v"
                               : "weightcast[rank " + std::to_string(rank) + "]: %^%l%$: %v");
  switch (level) {
    case LogLevel::error: logger->set_level(spdlog::level::err); break;
    case LogLevel::warn: logger->set_level(spdlog::level::warn); break;
    case LogLevel::info: logger->set_level(spdlog::level::info); break;
    case LogLevel::debug: logger->set_level(spdlog::level::debug); break;
  }
  spdlog::set_default_logger(logger);
}

}  // namespace weightcast
