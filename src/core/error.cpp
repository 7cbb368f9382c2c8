#include "weightcast/core/error.hpp"

#include <cstring>

namespace weightcast {

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::usage: return "usage";
    case Errc::invalid_checkpoint: return "invalid checkpoint";
    case Errc::missing_input: return "missing input";
    case Errc::unavailable: return "unavailable";
    case Errc::internal: return "internal error";
    case Errc::io: return "I/O error";
    case Errc::timeout: return "timeout";
    case Errc::config: return "config error";
    case Errc::interrupted: return "interrupted";
    case Errc::terminated: return "terminated";
  }
  return "error";
}

Error system_error(Errc code, int err, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  return Error(code, std::move(message));
}

namespace detail {
std::string escape_nul(std::string text) {
  for (auto at = text.find('\0'); at != std::string::npos; at = text.find('\0', at + 4)) {
    text.replace(at, 1, "\\x00");
  }
  return text;
}

void throw_error(Errc code, std::string message) { throw Error(code, std::move(message)); }
}  // namespace detail

}  // namespace weightcast
