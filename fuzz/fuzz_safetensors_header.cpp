// Fuzzes the safetensors header parser with whole files: the input is the file's bytes
// (8-byte length, header, data). Every input must either parse or throw weightcast::Error
// with a one-line message; anything else (a crash, a sanitizer report, another exception)
// is a bug.
#include "weightcast/core/error.hpp"
#include "weightcast/format/safetensors.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <string>
#include <unistd.h>

namespace {

std::string scratch_file() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/weightcast-fuzz-header-" +
         std::to_string(getpid()) + ".safetensors";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::string path = scratch_file();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  if (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size)) std::abort();
  ::close(fd);
  try {
    const auto header = weightcast::read_safetensors_header(path, "fuzz.safetensors");
    // A header that parses must describe bytes inside the file.
    for (const auto& tensor : header.tensors) {
      if (tensor.file_offset + tensor.bytes > size) std::abort();
    }
    if (8 + header.header_bytes + header.data_bytes != size) std::abort();
  } catch (const weightcast::Error& e) {
    const std::string message = e.what();
    if (message.empty() || message.find('\n') != std::string::npos) std::abort();
    if (e.code() != weightcast::Errc::invalid_checkpoint) std::abort();
  }
  return 0;
}
