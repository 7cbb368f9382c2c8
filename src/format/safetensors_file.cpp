// Reading a safetensors file's header bytes (checks 1–3 of safetensors.hpp), and telling
// what a file given as safetensors is when it is not one: a Git LFS pointer never fetched,
// a zip or pickle torch.save wrote, GGUF, HDF5, or text.
#include "weightcast/format/safetensors.hpp"

#include "weightcast/format/detail/safetensors_rules.hpp"
#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/detail/regular_file.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/detail/header_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <sys/stat.h>
#include <unistd.h>

namespace weightcast {

using detail::quote;
using detail::safetensors::fail;

namespace {

/// Reads exactly @p size bytes at @p offset, or throws: a short file here means the file
/// changed after fstat, which is an I/O condition, not a format fault.
void read_exact(int fd, char* out, std::size_t size, std::uint64_t offset, std::string_view file) {
  std::size_t done = 0;
  while (done < size) {
    ssize_t got = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw system_error(Errc::io, errno,
                         fmt::format("{}: read of {} bytes at offset {} failed", file,
                                     size - done, offset + done));
    }
    if (got == 0) {
      throw Error(Errc::io, fmt::format("{}: file ended at offset {} while reading {} bytes at "
                                        "offset {} (did it change while being read?)",
                                        file, offset + done, size, offset));
    }
    done += static_cast<std::size_t>(got);
  }
}

std::int64_t nanoseconds(const timespec& time) noexcept {
  return static_cast<std::int64_t>(time.tv_sec) * 1'000'000'000 + time.tv_nsec;
}

bool looks_like_text(std::string_view bytes) {
  return !bytes.empty() && std::all_of(bytes.begin(), bytes.end(), [](char c) {
    auto byte = static_cast<unsigned char>(c);
    return (byte >= 0x20 && byte < 0x7F) || c == '\n' || c == '\r' || c == '\t';
  });
}

std::string text_hint(std::string_view first_bytes) {
  if (!looks_like_text(first_bytes)) return {};
  return fmt::format("; the file starts with text ({}), it does not look like a safetensors file",
                     quote(first_bytes));
}

constexpr std::string_view lfs_prefix = "version https://git-lfs";

[[noreturn]] void fail_lfs_pointer(std::string_view file, std::string_view pointer) {
  // The pointer's "size N" line says how big the missing file is; worth showing, since a
  // user may not know the shard was never fetched.
  std::string size_note;
  if (auto at = pointer.find("\nsize "); at != std::string_view::npos) {
    auto digits = pointer.substr(at + 6);
    digits = digits.substr(0, digits.find_first_not_of("0123456789"));
    if (!digits.empty()) size_note = fmt::format(" of {} bytes", digits);
  }
  fail(file, fmt::format("is a Git LFS pointer file, not safetensors data: the real file{} was "
                         "never fetched (run `git lfs pull` in its repository)",
                         size_note));
}

// What a file given as safetensors looks like when its first bytes are another format's
// magic: the message for a header length that fails rule 2 or 3 (a safetensors file whose
// length happens to start "PK\3\4" is still read as one). Empty: none recognised.
std::string foreign_format(std::string_view file, std::string_view first_bytes) {
  const auto convert = fmt::format(
      "convert it with `python -c \"import torch, safetensors.torch as st; "
      "st.save_file(torch.load('{}', map_location='cpu', weights_only=True), "
      "'model.safetensors')\"`",
      file);
  if (first_bytes.starts_with("PK\x03\x04") || first_bytes.starts_with("PK\x05\x06")) {
    return fmt::format("is a zip archive, as torch.save writes a PyTorch .bin/.pt (or numpy "
                       "an .npz), not safetensors; {}",
                       convert);
  }
  if (first_bytes.size() >= 2 && first_bytes[0] == '\x80' && first_bytes[1] >= 2 &&
      first_bytes[1] <= 5) {
    return fmt::format("is a Python pickle (protocol {}), as an older torch.save writes a "
                       "PyTorch .bin/.pt, not safetensors; {}",
                       static_cast<int>(first_bytes[1]), convert);
  }
  if (first_bytes.starts_with("GGUF")) {
    return "is a GGUF file (llama.cpp), not safetensors; weightcast reads safetensors only";
  }
  if (first_bytes.starts_with("\x89HDF\r\n\x1a\n")) {
    return "is an HDF5 file (a Keras/TensorFlow .h5), not safetensors; weightcast reads "
           "safetensors only";
  }
  return {};
}

}  // namespace

SafetensorsHeaderText read_safetensors_header_text(const std::filesystem::path& path,
                                                   std::string_view name) {
  detail::expect_path_without_nul(path, "the safetensors file");
  std::string file = name.empty() ? path.string() : std::string(name);
  const detail::OpenRegularFile opened = detail::open_regular_file(
      path, {file, "", "expected a .safetensors file", Errc::missing_input});
  const detail::UniqueFd& fd = opened.fd;
  const struct stat& st = opened.st;
  auto file_bytes = static_cast<std::uint64_t>(st.st_size);

  std::array<char, 8> prefix{};
  std::size_t prefix_bytes = std::min<std::uint64_t>(file_bytes, prefix.size());
  read_exact(fd.get(), prefix.data(), prefix_bytes, 0, file);
  std::string_view first_bytes(prefix.data(), prefix_bytes);
  // A pointer file is ~130 bytes of text; only read further when the first bytes say so.
  if (first_bytes == lfs_prefix.substr(0, 8)) {
    std::string pointer(std::min<std::uint64_t>(file_bytes, 1024), '\0');
    read_exact(fd.get(), pointer.data(), pointer.size(), 0, file);
    if (pointer.starts_with(lfs_prefix)) fail_lfs_pointer(file, pointer);
  }
  // 1.
  if (file_bytes < 8) {
    fail(file, fmt::format("file is {} bytes, shorter than the 8-byte header length{}",
                           file_bytes, text_hint(first_bytes)));
  }
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) {
    header_bytes = (header_bytes << 8) | static_cast<unsigned char>(prefix[i]);
  }
  if (header_bytes > max_header_bytes || 8 + header_bytes > file_bytes) {
    if (auto what = foreign_format(file, first_bytes); !what.empty()) fail(file, what);
  }
  // 2.
  if (header_bytes > max_header_bytes) {
    fail(file, fmt::format("header length {} is larger than the format's limit of {} bytes{}",
                           header_bytes, max_header_bytes, text_hint(first_bytes)));
  }
  // 3.
  if (8 + header_bytes > file_bytes) {
    fail(file, fmt::format("header length {} runs past the end of the file: 8 + {} > {} bytes "
                           "(truncated file?){}",
                           header_bytes, header_bytes, file_bytes, text_hint(first_bytes)));
  }
  SafetensorsHeaderText text{std::string(header_bytes, '\0'), file_bytes,
                             static_cast<std::uint64_t>(st.st_dev),
                             static_cast<std::uint64_t>(st.st_ino), nanoseconds(st.st_mtim),
                             nanoseconds(st.st_ctim)};
  read_exact(fd.get(), text.json.data(), text.json.size(), 8, file);
  return text;
}

}  // namespace weightcast
