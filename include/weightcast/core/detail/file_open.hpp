/**
 * @file file_open.hpp
 * @brief Opening inputs and outputs without blocking on what is not a regular file.
 *
 * Internal. open(2) of a FIFO blocks until the other end opens it, so a FIFO named as a
 * checkpoint, shard, index, config, report or trace would hang weightcast before any
 * `timeout` applies. These open with O_NONBLOCK (which makes open(2) of a FIFO return at
 * once), let the caller check the file type with fstat(2), and then clear O_NONBLOCK so
 * reads and writes behave as usual.
 */
#pragma once

#include "weightcast/core/error.hpp"

#include <sys/types.h>

#include <cerrno>

#include <filesystem>
#include <string>
#include <string_view>

namespace weightcast::detail {

/**
 * @brief Refuses a path that holds a NUL byte.
 *
 * The kernel reads a path up to its first NUL (open(2), stat(2)), so `model.safetensors\0x`
 * would quietly name `model.safetensors`. A path given through the API is checked here;
 * one from a config is refused before, when the config is read (config.hpp).
 * @param path the path to check.
 * @param what what the path is, for messages: "the checkpoint", "the report".
 * @throws Error `Errc::usage`: "WHAT path 'P\x00Q' holds a NUL byte at byte N: a path ends
 *         at its first NUL, so it would name 'P'".
 */
void expect_path_without_nul(const std::filesystem::path& path, std::string_view what);

/// @return whether @p err, from open(2) or stat(2) of a path, says the path leads to no
///         file (ENOENT, ENOTDIR: "a/b" where a is a file, ELOOP: a symlink loop,
///         ENAMETOOLONG): missing input, where other errors (EACCES, EIO) are I/O.
constexpr bool unreachable_path(int err) noexcept {
  return err == ENOENT || err == ENOTDIR || err == ELOOP || err == ENAMETOOLONG;
}

/**
 * @brief Throws the error for an input (a checkpoint, an index, a shard, a config file)
 *        whose open(2) or stat(2) failed with @p err.
 *
 * The one rule for every input weightcast reads, so that a path fault says the same words
 * and exits with the same status whichever input it hits: a path that leads to no file
 * (unreachable_path()) is missing input, since there is nothing to read and the path is
 * what to fix; any other failure (EACCES, EIO, EMFILE, ENXIO) is an I/O error, since the
 * file is there (docs/DESIGN.md § Errors: missing input 66, I/O 74). What is refused after a
 * successful open (a directory, a FIFO, a socket) is the caller's to say, with its status.
 * @param err the errno value open(2) or stat(2) left (positive).
 * @param name the input as messages name it: the path as given, or a shard's name.
 * @param what what the input is, for messages: "the checkpoint", "config file", "shard"; or
 *        empty, where @p name says it ("model.safetensors").
 * @throws Error always: `Errc::missing_input` (66) "NAME: no such file" for ENOENT, and
 *         "NAME: cannot open WHAT: REASON" (REASON from strerror(3): "Not a directory", "Too
 *         many levels of symbolic links") for the rest of unreachable_path(); `Errc::io` (74)
 *         "NAME: cannot open WHAT: REASON" for any other @p err ("Permission denied").
 */
[[noreturn]] void throw_open_failure(int err, std::string_view name, std::string_view what);

/**
 * @brief The file type of @p mode (`st_mode`) in words for a message: "a regular file",
 *        "a directory", "a FIFO", "a socket", "a character device", "a block device",
 *        "a symbolic link", or "a special file".
 */
std::string_view file_type_name(mode_t mode) noexcept;

/**
 * @brief open(2)s @p path read-only (O_CLOEXEC, plus @p extra_flags) without blocking: a
 *        FIFO with no writer opens at once instead of waiting for one.
 *
 * O_NONBLOCK is cleared again before returning. The caller fstat(2)s the descriptor and
 * refuses what is not a regular file (see file_type_name()). A socket, which open(2)
 * refuses with ENXIO, is opened with O_PATH so that the caller's fstat(2) can say so (reads
 * of that descriptor fail with EBADF).
 * @param path the file to open.
 * @param extra_flags further open flags, e.g. O_DIRECT.
 * @return the descriptor (the caller closes it), or -1 with errno set as open(2) left it,
 *         or to EINVAL for a path that holds a NUL byte (opened, it would name another file).
 */
int open_input_nonblocking(const std::filesystem::path& path, int extra_flags = 0) noexcept;

/**
 * @brief Opens @p path for writing, created with mode 0666 (less the umask) if missing,
 *        truncated when @p truncate, without ever blocking in open(2).
 *
 * Accepts a regular file or a character device (/dev/null, a terminal); refuses a FIFO, a
 * socket or a block device, since writing there blocks until a reader appears, cannot work
 * or overwrites a disk (a directory fails in open(2) with EISDIR).
 * The type is checked with stat(2) before opening, so a FIFO that has a reader is not
 * opened (its reader would see end-of-file), and with fstat(2) after, for a path replaced
 * in between. O_NONBLOCK is cleared before returning.
 * @param path the file to open.
 * @param what what the file is, for messages: "the report", "the trace file".
 * @param truncate true to empty an existing regular file (O_TRUNC).
 * @return the descriptor; the caller closes it.
 * @throws Error `Errc::usage` when @p path holds a NUL byte (expect_path_without_nul());
 *         `Errc::io` when the file cannot be opened ("PATH: cannot create WHAT: ..."
 *         for a missing one, "PATH: cannot open WHAT for writing: ..." for an existing one)
 *         or is of a refused type ("PATH: is a FIFO, not a regular file: ...").
 */
int open_output_file(const std::filesystem::path& path, std::string_view what, bool truncate);

/**
 * @brief Creates @p path afresh for writing (a temporary file of this process's): whatever
 *        holds the name (a file an earlier process of this pid left, a FIFO, a symlink) is
 *        removed first and never opened, since open(2) of a FIFO blocks and a symlink would
 *        send the write elsewhere.
 * @param mode the new file's mode, less the umask.
 * @return the descriptor (O_WRONLY, O_CLOEXEC), or -1 with errno set as open(2) left it.
 */
int create_fresh(const std::filesystem::path& path, mode_t mode) noexcept;

/**
 * @brief @p path with its last component's symbolic links followed, as open(2) follows
 *        them, even to a target that does not exist yet (a dangling link is written
 *        through); at most 40 hops, Linux's MAXSYMLINKS (past that open(2) says ELOOP).
 *
 * A relative link is read from its own directory. Links in the directories before the last
 * component are left to the kernel.
 */
std::filesystem::path follow_links(const std::filesystem::path& path);

/**
 * @brief An output file (the report, the trace) that replaces the previous one whole or not
 *        at all.
 *
 * For a regular file, or a path that names none yet, the bytes go to a temporary file
 * `NAME.partial-PID` beside the target, which commit() fsyncs and renames over the target
 * once every byte is written: a write that fails (a full file system, a quota, RLIMIT_FSIZE)
 * leaves the previous file as it was, byte for byte, and removes the temporary. The target
 * is the file a write to the path reaches: a symbolic link, a dangling one too, is written
 * through and stays a link (follow_links()). An existing file keeps its permission bits (and
 * its owner and group where this process may set them); a new one gets 0666 less the umask.
 *
 * Written in place, as open_output_file() with truncation does: a character device
 * (/dev/null, a terminal), which cannot be renamed over; a regular file that the path
 * reaches through a procfs link (/dev/stdout redirected to a file, /proc/self/fd/N), which
 * names an open file rather than a place in a directory; and a path whose
 * directory takes no new name for this process (EACCES, EPERM, EROFS, or a name too long to
 * add ".partial-PID" to), where a writable existing file is still written as it always was.
 * Except: a procfs link to this process's own stdout or stderr (`--report /dev/stdout >
 * out.txt`) is written through a duplicate of that descriptor, at its offset and not
 * truncated, so what stdout wrote before (a `>>` log too) stays and what it writes after
 * follows.
 */
class OutputFile {
 public:
  /**
   * @brief Opens @p path for writing, checked as open_output_file() checks it (an existing
   *        file is opened for writing first, untruncated), and creates the temporary file.
   * @param path the file to write.
   * @param what what the file is, for messages: "the report", "the trace file".
   * @throws Error as open_output_file(); `Errc::io` "PATH: cannot create WHAT: ..." when
   *         the temporary file for a missing @p path cannot be created, "PATH: cannot create
   *         TEMP to write WHAT: ..." for an existing one.
   */
  OutputFile(const std::filesystem::path& path, std::string_view what);
  /// Closes the descriptor; removes the temporary file unless commit() succeeded.
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  /// @return the descriptor to write to (owned by this object).
  [[nodiscard]] int fd() const noexcept { return _fd; }

  /**
   * @brief Writes all of @p data at the descriptor's offset.
   * @throws Error `Errc::io` "PATH: cannot write WHAT: ..." (a write that wrote nothing
   *         reads as ENOSPC); the previous file stays as it was.
   */
  void write(std::string_view data);

  /**
   * @brief Makes the written bytes the file: fsync(2) and close(2) of the temporary file,
   *        each checked, then rename(2) over the target (written in place: close(2) alone).
   *        Where the target may be written but not replaced (a bind-mounted file: EBUSY;
   *        another user's file in a sticky directory: EPERM; EACCES, EROFS, EXDEV), the
   *        temporary's bytes are copied into it in place, as a report was always written
   *        before, and the temporary removed.
   * @throws Error `Errc::io` "PATH: cannot write WHAT: ..." when any step fails; the
   *         temporary file is removed and the previous file stays as it was (except where a
   *         copy in place fails part way).
   */
  void commit();

 private:
  [[noreturn]] void fail(int err, std::string_view how);
  // commit() where the rename is refused: the temporary's bytes written into the target.
  void copy_temp_in_place();

  std::filesystem::path _path;    // as given, for messages
  std::string _what;
  std::filesystem::path _target;  // the file the temporary replaces
  std::filesystem::path _temp;    // empty when written in place
  int _fd = -1;
};

}  // namespace weightcast::detail
