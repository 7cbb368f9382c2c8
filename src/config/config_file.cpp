// Reading a config file's bytes: a regular file of a config's size, UTF-8, no NUL byte, and
// not a checkpoint named by mistake.
#include "weightcast/config/detail/config_parts.hpp"

#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/detail/regular_file.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/limits.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

namespace weightcast::detail {

namespace {

// A config is a few hundred bytes of key: value lines; 1 MiB leaves ample room for comments
// and refuses a checkpoint or /dev/zero named by mistake before it is read into memory.
constexpr std::size_t max_config_bytes = 1 << 20;

// The safetensors layout: a little-endian u64 header length within the format's limit
// (format/limits.hpp),
// then the header's opening brace. YAML text never starts with such a length (its first
// eight bytes are printable, so the u64 is far above the limit).
bool looks_like_safetensors(std::string_view path, std::string_view first_bytes) {
  if (path.ends_with(".safetensors") || path.ends_with(".safetensors.index.json")) return true;
  if (first_bytes.size() < 9 || first_bytes[8] != '{') return false;
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(first_bytes[i]);
  }
  return header_bytes >= 2 && header_bytes <= max_header_bytes;
}

[[noreturn]] void refuse_checkpoint_as_config(const std::string& path) {
  throw Error(Errc::config,
              fmt::format("{}: this looks like a checkpoint, not a YAML config file: use --set "
                          "checkpoint={}",
                          path, path));
}

/// What a config in UTF-16 or UTF-32 (Notepad's "Unicode") is, from its byte-order mark or,
/// without one, its first NULs as YAML 1.2 §5.2 tells them apart: "UTF-16 (byte-order mark
/// FF FE)"; "" for anything else. Otherwise such a file said "holds a NUL byte (byte 3)".
std::string utf16_or_utf32(std::string_view text) {
  const auto bytes = [&](std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n; ++i) {
      out += fmt::format("{}{:02X}", i == 0 ? "" : " ", static_cast<unsigned char>(text[i]));
    }
    return out;
  };
  using namespace std::string_view_literals;
  if (text.starts_with("\xff\xfe\0\0"sv) || text.starts_with("\0\0\xfe\xff"sv)) {
    return fmt::format("UTF-32 (byte-order mark {})", bytes(4));
  }
  if (text.starts_with("\xff\xfe"sv) || text.starts_with("\xfe\xff"sv)) {
    return fmt::format("UTF-16 (byte-order mark {})", bytes(2));
  }
  if (text.size() >= 4 && text[0] != '\0' && text.substr(1, 3) == "\0\0\0"sv) {
    return "UTF-32 (little-endian, without a byte-order mark)";
  }
  if (text.size() >= 4 && text.substr(0, 3) == "\0\0\0"sv && text[3] != '\0') {
    return "UTF-32 (big-endian, without a byte-order mark)";
  }
  if (text.size() >= 2 && text[0] != '\0' && text[1] == '\0') {
    return "UTF-16 (little-endian, without a byte-order mark)";
  }
  if (text.size() >= 2 && text[0] == '\0' && text[1] != '\0') {
    return "UTF-16 (big-endian, without a byte-order mark)";
  }
  return {};
}

}  // namespace

std::string read_config_file(const std::string& path) {
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    detail::throw_open_failure(ec ? ec.value() : ENOENT, path, "config file");
  }
  if (std::filesystem::is_directory(status)) {
    throw Error(Errc::config, fmt::format("{}: is a directory, not a YAML config file (a "
                                          "checkpoint directory? use --set checkpoint={})",
                                          path, path));
  }
  if (looks_like_safetensors(path, {})) refuse_checkpoint_as_config(path);
  // At most one byte past the limit: enough to tell "too large", also where st_size says 0
  // (files in /proc) or the file grows while it is read.
  std::string text = detail::read_regular_file(
      path, {path, "config file", "not a YAML config file", Errc::config}, max_config_bytes);
  const std::size_t done = text.size();
  if (looks_like_safetensors("", text)) refuse_checkpoint_as_config(path);
  if (const auto encoding = utf16_or_utf32(text); !encoding.empty()) {
    throw Error(Errc::config, fmt::format("{}: is {}: save it as UTF-8", path, encoding));
  }
  // YAML allows no NUL byte in a stream (YAML 1.2 §5.1), and yaml-cpp reads a raw one as if
  // it were a backslash: `trace: my<NUL>nreport.json` wrote to "my\nreport.json".
  if (const auto nul = text.find('\0'); nul != std::string::npos && done <= max_config_bytes) {
    const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(nul), '\n');
    throw Error(Errc::config, fmt::format("{}:{}: holds a NUL byte (byte {} of the file), which "
                                          "YAML does not allow",
                                          path, line, nul));
  }
  if (done > max_config_bytes) {
    throw Error(Errc::config,
                fmt::format("{}: is larger than a config file can be ({} bytes at most; a config "
                            "is a few lines of YAML key: value)",
                            path, max_config_bytes));
  }
  return text;
}


}  // namespace weightcast::detail
