/**
 * @file log.hpp
 * @brief weightcast's log: spdlog to stderr, one line per event, prefixed with the rank.
 *
 * Library code logs notices (a fallback taken, a mode chosen) through these functions;
 * trainers that embed weightcast may replace the sink with `spdlog::set_default_logger`.
 */
#pragma once

#include "weightcast/core/settings.hpp"

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

namespace weightcast {

/**
 * @brief @p text made safe to print on a terminal, on one line.
 *
 * Tensor and shard names come from the checkpoint's header, and abort messages from other
 * ranks: untrusted text. JSON lets a name hold any character ("\u001b[2J" decodes to an
 * escape sequence that a terminal would obey), so everything weightcast prints to a
 * terminal or its log goes through this:
 * - C0 controls (U+0000–U+001F, newline and tab included), DEL (U+007F) and C1 controls
 *   (U+0080–U+009F) become `\xHH`, the code point in two hex digits;
 * - bytes that are not well-formed UTF-8 (Unicode Table 3-7) become `\xHH`, the byte (a
 *   raw 0x9B is the 8-bit CSI on some terminals);
 * - bidirectional formatting controls (U+061C, U+200E/F, U+202A–U+202E, U+2066–U+2069)
 *   become `\uHHHH`: they would reorder how the line displays;
 * - everything else is kept: UTF-8 names print as written, and a backslash stays one (so
 *   a name that holds the text `\x1b` prints like one that held the escape; the point is
 *   that the terminal never sees the control).
 */
[[nodiscard]] std::string printable(std::string_view text);

/**
 * @brief Makes a fresh logger "weightcast" (stderr, single-threaded sink) the default, with
 *        @p level and the line prefix "weightcast[rank R]: LEVEL: " ("weightcast: LEVEL: "
 *        for rank -1); every message passes through printable(). Calling it again replaces
 *        the logger (and any default logger an embedder set).
 * @param rank this process's rank, or -1 before it is known.
 */
void configure_log(LogLevel level, int rank = -1);

}  // namespace weightcast
