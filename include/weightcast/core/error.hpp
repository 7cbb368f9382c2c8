/**
 * @file error.hpp
 * @brief weightcast's one exception type and its mapping onto process exit statuses.
 *
 * Every failure weightcast reports is a `weightcast::Error` carrying an `Errc`, a library
 * error code. `exit_status` is the one mapping onto `<sysexits.h>` process exit statuses
 * (the CLI's, and Python's `weightcast.Error.status`), so a job scheduler or a shell script
 * can tell a bad checkpoint (65) from a dead peer (69) from a stalled job (75) without
 * parsing the message (docs/DESIGN.md § Errors).
 */
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace weightcast {

/// What went wrong, in the coarse classes a caller acts on. Use `exit_status` for a process
/// status; the enumerators' values equal those statuses only so that the control plane's
/// wire format (which carries statuses) stays as it was, and are not to be relied on.
enum class Errc : int {
  usage = 64,               ///< EX_USAGE: wrong command line.
  invalid_checkpoint = 65,  ///< EX_DATAERR: a checkpoint, shard or index breaks the format.
  missing_input = 66,       ///< EX_NOINPUT: a checkpoint path or shard does not exist.
  unavailable = 69,         ///< EX_UNAVAILABLE: a peer or transport cannot be reached or died.
  internal = 70,            ///< EX_SOFTWARE: a bug in weightcast; please report it.
  io = 74,                  ///< EX_IOERR: a read failed, a file changed under the reader.
  timeout = 75,             ///< EX_TEMPFAIL: a wait exceeded the configured `timeout`.
  config = 78,              ///< EX_CONFIG: an unknown config key or a bad value.
  /// 128 + SIGINT, the shell's status for Ctrl-C: the load was stopped on request
  /// (`LoadOptions::stop`; `weightcast run` on SIGINT). Not a `<sysexits.h>` status.
  interrupted = 130,
  /// 128 + SIGTERM: `weightcast run` was stopped by SIGTERM (a scheduler, `kill`).
  terminated = 143,
};

/// @return the `<sysexits.h>` process exit status for @p code (128 + signal for
///         `interrupted` and `terminated`, as a shell reports them).
constexpr int exit_status(Errc code) noexcept {
  switch (code) {
    case Errc::usage: return 64;               // EX_USAGE
    case Errc::invalid_checkpoint: return 65;  // EX_DATAERR
    case Errc::missing_input: return 66;       // EX_NOINPUT
    case Errc::unavailable: return 69;         // EX_UNAVAILABLE
    case Errc::internal: return 70;            // EX_SOFTWARE
    case Errc::io: return 74;                  // EX_IOERR
    case Errc::timeout: return 75;             // EX_TEMPFAIL
    case Errc::config: return 78;              // EX_CONFIG
    case Errc::interrupted: return 130;        // 128 + SIGINT
    case Errc::terminated: return 143;         // 128 + SIGTERM
  }
  return 70;
}

/// @return the `Errc` whose `exit_status` is @p status; `unavailable` for any other status
///         (another rank's ABORT carries a status: control_plane.hpp).
constexpr Errc errc_for_exit_status(int status) noexcept {
  for (const Errc code : {Errc::usage, Errc::invalid_checkpoint, Errc::missing_input,
                          Errc::unavailable, Errc::internal, Errc::io, Errc::timeout,
                          Errc::config, Errc::interrupted, Errc::terminated}) {
    if (exit_status(code) == status) return code;
  }
  return Errc::unavailable;
}

/// @return a short lowercase name for @p code, e.g. "invalid checkpoint".
std::string_view to_string(Errc code) noexcept;

namespace detail {
/// @return @p text with each NUL byte replaced by the four characters `\x00`.
[[nodiscard]] std::string escape_nul(std::string text);
}  // namespace detail

/**
 * @brief The exception every weightcast API throws.
 *
 * `what()` is one line that says what failed, where (file, offset, tensor, config key) and,
 * where there is one, what to do. It never ends in a newline.
 */
class Error : public std::runtime_error {
 public:
  /// @param code the class of failure (decides the exit status).
  /// @param message the full one-line message. A NUL byte in it (from a config value, a
  ///        tensor name, a path given to the API) is kept as the text `\x00`, since `what()`
  ///        is a C string that would otherwise end there.
  Error(Errc code, std::string message)
      : std::runtime_error(detail::escape_nul(std::move(message))), _code(code) {}

  /// @return the class of failure.
  [[nodiscard]] Errc code() const noexcept { return _code; }

 private:
  Errc _code;
};

/// @return an `Error` of class `io` for a failed system call: "<what>: <strerror(err)>".
/// @param err the positive `errno` value (io_uring's `-res`).
[[nodiscard]] Error system_error(Errc code, int err, std::string_view what);

namespace detail {
[[noreturn]] void throw_error(Errc code, std::string message);
}  // namespace detail

}  // namespace weightcast

/// Throws `weightcast::Error(code, message)` when @p cond is false. The message expression is
/// evaluated only on failure, so it may format freely.
#define WEIGHTCAST_EXPECT(cond, code, message)                  \
  do {                                                          \
    if (!(cond)) [[unlikely]] {                                 \
      ::weightcast::detail::throw_error((code), (message));     \
    }                                                           \
  } while (0)
