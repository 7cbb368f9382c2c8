// Opening and reading a file that must be a regular file, for every reader of a whole small
// file (an index, a config file) and of a shard's header: one place that refuses a FIFO or a
// device before a read could block on it.
#include "weightcast/core/detail/regular_file.hpp"

#include "weightcast/core/detail/file_open.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <unistd.h>

namespace weightcast::detail {
namespace {

std::string file_name(const std::filesystem::path& path, const RegularFileNames& names) {
  return names.name.empty() ? path.string() : std::string(names.name);
}

std::string with_what(std::string_view action, std::string_view what) {
  return what.empty() ? std::string(action) : fmt::format("{} {}", action, what);
}

}  // namespace

OpenRegularFile open_regular_file(const std::filesystem::path& path,
                                  const RegularFileNames& names) {
  OpenRegularFile file{UniqueFd(open_input_nonblocking(path)), {}};
  if (file.fd.get() < 0) throw_open_failure(errno, file_name(path, names), names.what);
  if (::fstat(file.fd.get(), &file.st) != 0) {
    throw system_error(Errc::io, errno, fmt::format("{}: {}", file_name(path, names),
                                                    with_what("cannot stat", names.what)));
  }
  // A FIFO or a device: reading it could block or never end.
  if (!S_ISREG(file.st.st_mode)) {
    throw Error(names.not_regular_status,
                fmt::format("{}: is {}, {}", file_name(path, names),
                            file_type_name(file.st.st_mode), names.not_regular));
  }
  return file;
}

std::string read_to_end(const UniqueFd& fd, std::uint64_t size_hint, std::uint64_t max_bytes,
                        const std::filesystem::path& path, const RegularFileNames& names) {
  const std::uint64_t limit = max_bytes + 1;
  // One byte past the expected size: a file that grew is seen to, without a second pass.
  std::string text(std::min(size_hint, max_bytes) + 1, '\0');
  std::size_t done = 0;
  while (done < limit) {
    if (done == text.size()) text.resize(std::min<std::uint64_t>(text.size() * 2, limit));
    const ssize_t got = ::read(fd.get(), text.data() + done, text.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw system_error(Errc::io, errno,
                         fmt::format("{}: {} at offset {}", file_name(path, names),
                                     with_what("cannot read", names.what), done));
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  text.resize(done);
  return text;
}

std::string read_regular_file(const std::filesystem::path& path, const RegularFileNames& names,
                              std::uint64_t max_bytes) {
  const OpenRegularFile file = open_regular_file(path, names);
  return read_to_end(file.fd, static_cast<std::uint64_t>(file.st.st_size), max_bytes, path,
                     names);
}

}  // namespace weightcast::detail
