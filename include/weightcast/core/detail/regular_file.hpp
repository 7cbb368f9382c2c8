/**
 * @file regular_file.hpp
 * @brief Internal: opening and reading a file that must be a regular file (a shard's header,
 *        an index, a config file) without ever blocking on a FIFO or a device.
 */
#pragma once

#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/core/error.hpp"

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace weightcast::detail {

/// How open_regular_file() and read_regular_file() name a file in their messages.
struct RegularFileNames {
  /// The file as messages name it; empty: the path as given.
  std::string_view name;
  /// What the file is to the caller ("config file"), for "<name>: cannot open <what>" and
  /// "cannot stat <what>"; empty for plain "cannot open".
  std::string_view what;
  /// The end of the refusal of another type: "<name>: is a FIFO, <not_regular>" (say,
  /// "expected a .safetensors file").
  std::string_view not_regular;
  /// The status of that refusal.
  Errc not_regular_status = Errc::missing_input;
};

/// A regular file opened for reading, and what fstat(2) said of it at open.
struct OpenRegularFile {
  UniqueFd fd;        ///< Open for reading, blocking mode (O_NONBLOCK cleared).
  struct stat st {};  ///< fstat(2) of `fd`.
};

/**
 * @brief Opens @p path for reading without blocking (open_input_nonblocking(): a FIFO with
 *        no writer would block open(2) forever) and refuses what is not a regular file.
 * @throws Error as throw_open_failure() when open(2) fails (`missing_input` (66) for no such
 *         file or an unreachable path, else `io` (74) with errno's text),
 *         `io` (74) when fstat(2) fails, and `names.not_regular_status` for a FIFO, a socket,
 *         a device or a directory, naming its type. The caller checks @p path for a NUL byte
 *         first (expect_path_without_nul()) where it wants that refused as `usage`; here it is
 *         an open failure (EINVAL).
 */
OpenRegularFile open_regular_file(const std::filesystem::path& path,
                                  const RegularFileNames& names);

/**
 * @brief Reads @p fd from its offset to the end, or to @p max_bytes + 1 bytes, whichever
 *        comes first: a result longer than @p max_bytes tells the caller the file is too
 *        large, also where `st_size` said less (files in /proc say 0; a file may grow).
 * @param size_hint the expected size (`st_size`), to size the first allocation.
 * @throws Error `io` (74) when read(2) fails, with errno's text, naming @p names and the
 *         offset.
 */
std::string read_to_end(const UniqueFd& fd, std::uint64_t size_hint, std::uint64_t max_bytes,
                        const std::filesystem::path& path, const RegularFileNames& names);

/**
 * @brief open_regular_file(), then read_to_end(): the whole file, or its first
 *        @p max_bytes + 1 bytes when it is larger.
 * @throws Error as those two.
 */
std::string read_regular_file(const std::filesystem::path& path, const RegularFileNames& names,
                              std::uint64_t max_bytes);

}  // namespace weightcast::detail
