/**
 * @file core/detail/wire.hpp
 * @brief Little-endian byte writer and a bounds-checked reader for control-plane payloads.
 *
 * The reader never trusts its input: every read checks the bytes left first and a failure
 * throws `Error` (`unavailable`: a peer sent something weightcast cannot use) naming what was
 * being read.
 */
#pragma once

#include "weightcast/core/error.hpp"

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace weightcast::detail {

static_assert(std::endian::native == std::endian::little,
              "the control-plane wire format is little-endian; add byte swaps for this host");

/// Appends fixed-width little-endian integers and length-prefixed strings.
class WireWriter {
 public:
  template <typename T>
    requires std::is_integral_v<T>
  void put(T value) {
    const auto* bytes = reinterpret_cast<const char*>(&value);
    _bytes.append(bytes, sizeof value);
  }
  /// A string as a u32 byte count and the bytes. @p text must be under 4 GiB (not checked:
  /// every caller's strings are bounded far below, e.g. `max_status_message_bytes`).
  void put_string(std::string_view text) {
    put(static_cast<std::uint32_t>(text.size()));
    _bytes.append(text);
  }
  /// @return what was written so far (move it out when done).
  [[nodiscard]] std::string& bytes() noexcept { return _bytes; }

 private:
  std::string _bytes;
};

/// Reads what `WireWriter` wrote, checking every length against the bytes left.
class WireReader {
 public:
  /// @param what names the payload in messages, e.g. "catalogue from rank 0".
  WireReader(std::string_view bytes, std::string_view what) : _left(bytes), _what(what) {}

  /// @return the next `sizeof(T)` bytes as a little-endian @p T.
  /// @throws Error `unavailable` (69) naming @p field when fewer bytes are left ("truncated").
  template <typename T>
    requires std::is_integral_v<T>
  T get(std::string_view field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, _left.data(), sizeof value);
    _left.remove_prefix(sizeof value);
    return value;
  }
  /// @return the next string (u32 byte count, then the bytes).
  /// @throws Error `unavailable` (69) naming @p field when the count or the bytes are
  ///         truncated (checked before anything is allocated).
  std::string get_string(std::string_view field) {
    const auto size = get<std::uint32_t>(field);
    need(size, field);
    std::string text(_left.substr(0, size));
    _left.remove_prefix(size);
    return text;
  }
  /// Checks that @p count items of at least @p min_item_bytes each can still follow, before a
  /// caller reserves memory for them: a hostile count cannot make us allocate.
  /// @throws Error `unavailable` (69) naming @p field when they cannot.
  void need_items(std::uint64_t count, std::uint64_t min_item_bytes, std::string_view field) {
    if (min_item_bytes != 0 && count > _left.size() / min_item_bytes) {
      fail(field, "claims more entries than the payload holds");
    }
  }
  /// @return the bytes not read yet.
  [[nodiscard]] std::size_t left() const noexcept { return _left.size(); }
  /// @throws Error `unavailable` (69): "WHAT: FIELD: WHY", always.
  [[noreturn]] void fail(std::string_view field, std::string_view why) const {
    throw Error(Errc::unavailable, std::string(_what) + ": " + std::string(field) + ": " +
                                       std::string(why));
  }

 private:
  void need(std::uint64_t bytes, std::string_view field) {
    if (bytes > _left.size()) fail(field, "truncated");
  }
  std::string_view _left;
  std::string_view _what;
};

}  // namespace weightcast::detail
