/**
 * @file log.hpp
 * @brief weightcast's log: spdlog to stderr, one line per event, prefixed with the rank.
 *
 * Library code logs notices (a fallback taken, a mode chosen) through these functions;
 * trainers that embed weightcast may replace the sink with `spdlog::set_default_logger`.
 */
#pragma once

#include "weightcast/config.hpp"

#include <spdlog/spdlog.h>

namespace weightcast {

/**
 * @brief Sets the level and the line prefix of the log ("weightcast[rank R]: ").
 * @param rank this process's rank, or -1 before it is known.
 */
void configure_log(LogLevel level, int rank = -1);

}  // namespace weightcast
