/**
 * @file safetensors.hpp
 * @brief The safetensors header parser.
 *
 * A safetensors file is: 8 bytes little-endian `N`; `N` bytes of UTF-8 JSON; the data
 * section. The JSON is an object mapping tensor name to
 * `{"dtype": STR, "shape": [UINT...], "data_offsets": [BEGIN, END]}` with offsets relative
 * to the data section, plus an optional `"__metadata__"` object of string values.
 *
 * The checks run in the reference implementation's order (safetensors crate,
 * `SafeTensors::read_metadata` then `Metadata::validate`), so that a file with several faults
 * reports the one the reference reports:
 *  1. file ≥ 8 bytes;  2. N ≤ 100,000,000;  3. 8 + N ≤ file size;  4. header is UTF-8;
 *  5. header is JSON (serde_json: no BOM, no NUL, at most 127 nested containers);  6. a JSON
 *  object;  7. no repeated struct field: `__metadata__` once, dtype, shape and data_offsets
 *  once per entry, a dtype object of one key (a repeated tensor name or `__metadata__` key
 *  keeps its last value, as the reference's maps do; every copy must pass 8 and 9);
 *  8. `__metadata__` is null or an object of strings;  9. each entry has dtype, shape and
 *  data_offsets (other keys are ignored, as the reference's `TensorInfo` ignores them; serde
 *  also reads the entry as the array [dtype, shape, data_offsets] and a dtype as
 *  {"F32": null}) with a known dtype and non-negative integer shape and offsets (not `-0`,
 *  `2.0` or `1e3`: serde_json reads those as floats);  then, tensors sorted by offsets:
 *  10. begin equals the previous end (no hole, no overlap);  11. end ≥ begin;
 *  12. element count fits 64 bits;  13. whole bytes (sub-byte dtypes);  14. size equals
 *  end − begin;  and finally 15. the data section ends exactly at the end of the file.
 * Whitespace padding after the JSON, zero-size and scalar tensors are valid.
 */
#pragma once

#include "weightcast/format/limits.hpp"
#include "weightcast/format/tensor_info.hpp"

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace weightcast {

/// A parsed, validated shard header.
struct SafetensorsHeader {
  std::uint64_t header_bytes = 0;  ///< N: length of the JSON header, bytes.
  std::uint64_t data_bytes = 0;    ///< Size of the data section, bytes.
  /// Tensors sorted by data offset; `file_offset` is absolute (8 + N + begin), `shard` is 0.
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;  ///< `__metadata__`, empty when absent/null.
  /// The file read (`st_dev`, `st_ino` of the open descriptor); 0, 0 for a header parsed
  /// from memory (parse_safetensors_header).
  std::uint64_t device = 0;
  std::uint64_t inode = 0;  ///< See `device`.
  /// Modification and status-change times of the file read (`st_mtim`, `st_ctim`), ns since
  /// the epoch; 0 for a header parsed from memory. With `device`, `inode` and the size they
  /// tell a rewrite in place from the file whose header this is.
  std::int64_t modified_ns = 0;
  std::int64_t changed_ns = 0;  ///< See `modified_ns`.
};

/**
 * @brief Validates a header's JSON text (checks 4–15 above).
 *
 * @param json the N header bytes, exactly as in the file (may hold invalid UTF-8).
 * @param data_bytes bytes in the file after the header (file size − 8 − N).
 * @param file the file name used in messages.
 * @throws Error `invalid_checkpoint` (65) naming @p file, the tensor and the numbers
 *         involved.
 */
SafetensorsHeader parse_safetensors_header(std::string_view json, std::uint64_t data_bytes,
                                           std::string_view file);

/// A safetensors file's header bytes, read but not parsed (read_safetensors_header_text()).
struct SafetensorsHeaderText {
  std::string json;              ///< The N header bytes, exactly as in the file.
  std::uint64_t file_bytes = 0;  ///< Size of the whole file, bytes.
  std::uint64_t device = 0;      ///< `st_dev` of the file read.
  std::uint64_t inode = 0;       ///< `st_ino` of the file read.
  std::int64_t modified_ns = 0;  ///< `st_mtim` of the file read, ns since the epoch.
  std::int64_t changed_ns = 0;   ///< `st_ctim` of the file read, ns since the epoch.
  /// Bytes after the header (file size − 8 − N): the data section as the file holds it.
  [[nodiscard]] std::uint64_t data_bytes() const noexcept { return file_bytes - 8 - json.size(); }
};

/**
 * @brief Reads the header bytes of the safetensors file at @p path (checks 1–3), without
 *        parsing them or looking at the data section.
 *
 * For a reader that wants the header of a file whose data may be damaged or cut short
 * (`weightcast synth` reading its own marker in `__metadata__`); a loader uses
 * read_safetensors_header(). Opens without blocking and refuses what is not a regular file
 * (a FIFO would block the read forever). A Git LFS pointer file (text starting
 * "version https://git-lfs") is reported as such: the real file was never fetched.
 *
 * @param path the shard file.
 * @param name the name used in messages (defaults to the path as given).
 * @throws Error `missing_input` (66) if the path leads to no file (it does not exist, a
 *         symlink loop: detail::throw_open_failure()) or to one that is not a regular file,
 *         `invalid_checkpoint` (65) for checks 1–3 and an LFS pointer, `io` (74) if it cannot
 *         be opened otherwise (EACCES), fstat(2) or a read fails, or the file ends before the
 *         bytes its size promised (it changed while read), `usage` (64) if @p path holds a
 *         NUL byte.
 */
SafetensorsHeaderText read_safetensors_header_text(const std::filesystem::path& path,
                                                   std::string_view name = {});

/**
 * @brief Reads and validates the header of the safetensors file at @p path (checks 1–15):
 *        read_safetensors_header_text(), then parse_safetensors_header().
 *
 * Reads only the first 8 + N bytes. A Git LFS pointer file (text starting
 * "version https://git-lfs") is reported as such: the real file was never fetched.
 *
 * @param path the shard file.
 * @param name the name used in messages (defaults to the path as given).
 * @throws Error as read_safetensors_header_text() (`missing_input` (66), `io` (74), `usage`
 *         (64)), and `invalid_checkpoint` (65) for any format fault (checks 1–15).
 */
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path,
                                          std::string_view name = {});

}  // namespace weightcast
