/**
 * @file config.hpp
 * @brief The launcher's configuration: YAML file, `--set key=value` overrides, defaults.
 *
 * Every key of docs/DESIGN.md § Configuration; `configs/default.yaml` documents each one.
 * Sizes accept a plain byte count or a unit (`16MiB`, `1 GiB`, `64KiB`, `16MB` = 16e6),
 * durations a plain number of seconds or a unit (`300s`, `5m`, `250ms`, `1h`).
 */
#pragma once

#include "weightcast/plan/placement.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/core/units.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace weightcast {

/// Effective configuration of one rank. Each default is its setting's in the registry
/// (core/settings.hpp), as are the bounds the loader checks.
struct Config {
  std::string checkpoint;                           ///< File, directory or index path.
  DeviceKind device = default_choice<DeviceKind>(setting::device);  ///< `auto|host|cuda`.
  /// `auto|local|mpi|nccl|tcp`.
  TransportKind transport = default_choice<TransportKind>(setting::transport);
  /// `chunk_size`: bytes per chunk.
  std::uint64_t chunk_bytes = static_cast<std::uint64_t>(setting::chunk_size.default_value);
  /// Staging ring slots.
  std::uint32_t buffer_depth = static_cast<std::uint32_t>(setting::buffer_depth.default_value);
  /// io_uring reads in flight.
  std::uint32_t io_depth = static_cast<std::uint32_t>(setting::io_depth.default_value);
  DirectIo direct_io = default_choice<DirectIo>(setting::direct_io);  ///< O_DIRECT policy.
  ReaderKind reader = default_choice<ReaderKind>(setting::reader);  ///< `auto|uring|pread`.
  /// `destination`: `arena` (load), or `discard` (read and digest every tensor, keep nothing;
  /// with `verify: none` read only, digest nothing: the read stage alone).
  Destination destination = default_choice<Destination>(setting::destination);
  /// Longest any wait may last.
  std::chrono::milliseconds timeout{setting::timeout.default_value};
  /// `verify`: `digest` hashes every tensor on every rank after the load (XXH3-64; a cuda
  /// arena is read back to host for it) and rank 0 compares them; `none` skips that work
  /// (no verdict beyond the load itself, no `xxh3` in `--report`; with `destination: discard`
  /// no hashing at all).
  Verify verify = default_choice<Verify>(setting::verify);
  /// `placement` (`replicate|fsdp`, the default for tensors no rule names) and
  /// `placement_rules` (a list, first match wins; docs/placement.md): which part of each
  /// tensor each rank receives. `replicate` with no rules is the whole checkpoint everywhere.
  PlacementSpec placement;
  std::string trace;  ///< Chrome trace-event JSON to write ("" for none); `weightcast/pipeline/trace.hpp`.
  LogLevel log_level = default_choice<LogLevel>(setting::log_level);
  /// `world.rank`: this process's rank; -1 (`auto`) takes it from the launcher's environment
  /// (see world.hpp for the order). Set with `world.size`.
  int world_rank = static_cast<int>(setting::world_rank.default_value);
  /// `world.size`: number of ranks; 0 (`auto`) takes it from the environment.
  int world_size = static_cast<int>(setting::world_size.default_value);
  /// `world.local_rank`: rank among this node's processes; -1 (`auto`): environment, else rank.
  int world_local_rank = static_cast<int>(setting::world_local_rank.default_value);
  /// `rendezvous.address`: where rank 0 listens and the others connect. Empty (`auto`):
  /// `$MASTER_ADDR` when set, else 127.0.0.1. Rank 0 binds only this address, never the
  /// wildcard: the loopback default keeps a listener nobody configured (one node, `launch`)
  /// unreachable from other hosts; a multi-node job names rank 0's routable address.
  std::string rendezvous_address;
  /// `rendezvous.port`: rank 0's control-plane TCP port (`setting::rendezvous_port`: its
  /// default is apart from torchrun's `MASTER_PORT`, which its own store may be using).
  std::uint16_t rendezvous_port =
      static_cast<std::uint16_t>(setting::rendezvous_port.default_value);
  /// `rendezvous.token`: the job token every rank must present. Empty: `$WEIGHTCAST_TOKEN`,
  /// else no token (any peer of the right world size is accepted). Printed masked, as
  /// `(set)`; that mask given as the token is refused (the printed config loaded back). At
  /// most `detail::max_token_bytes` bytes, what a rank's hello carries.
  std::string rendezvous_token;

  /// Where `load_config` last set each key: "x.yaml:7" (file and line) or "--set"; a key left
  /// at its default has no entry. For messages about keys that must agree (`world.rank` with
  /// `world.size`: world.hpp).
  std::map<std::string, std::string, std::less<>> set_at;

  /// @return the config as YAML, one `key: value` line per key (the "effective config"),
  ///         which `load_config` reads back to the same config (the token aside: it is
  ///         printed masked). A value holding a control character (C0, DEL, C1) or U+2028/
  ///         U+2029 is printed double-quoted with YAML escapes (`"a\rb"`), never raw.
  [[nodiscard]] std::string to_yaml() const;

  /// @return where @p key was set ("x.yaml:7", "--set"), or "" when it has its default.
  [[nodiscard]] std::string_view where_set(std::string_view key) const;
};

/// A config key whose value is read and printed as its setting's type says (a size, count,
/// whole number or `auto`, duration, choice, or text): the field @p Member of `Config`, the
/// setting @p S of the registry.
template <auto Member, const Setting& S>
struct PlainKey {
  static constexpr auto member = Member;
  static constexpr const Setting& setting = S;
};

/// The plain keys. The key table (src/config/keys.cpp) is built from this list and the few
/// keys read in a way of their own (placement, rendezvous.address, rendezvous.token), in the
/// registry's order: a new setting of a plain type is its registry entry
/// (core/settings.hpp), a field above and a line here, plus its row in docs/config.md.
using PlainKeys = std::tuple<
    PlainKey<&Config::checkpoint, setting::checkpoint>,
    PlainKey<&Config::device, setting::device>,
    PlainKey<&Config::transport, setting::transport>,
    PlainKey<&Config::chunk_bytes, setting::chunk_size>,
    PlainKey<&Config::buffer_depth, setting::buffer_depth>,
    PlainKey<&Config::io_depth, setting::io_depth>,
    PlainKey<&Config::direct_io, setting::direct_io>,
    PlainKey<&Config::reader, setting::reader>,
    PlainKey<&Config::destination, setting::destination>,
    PlainKey<&Config::timeout, setting::timeout>,
    PlainKey<&Config::verify, setting::verify>,
    PlainKey<&Config::trace, setting::trace>,
    PlainKey<&Config::log_level, setting::log_level>,
    PlainKey<&Config::world_rank, setting::world_rank>,
    PlainKey<&Config::world_size, setting::world_size>,
    PlainKey<&Config::world_local_rank, setting::world_local_rank>,
    PlainKey<&Config::rendezvous_port, setting::rendezvous_port>>;

/**
 * @brief Builds a `Config` from defaults, then @p yaml_path (if not empty), then @p overrides.
 *
 * @param yaml_path YAML mapping of config keys; empty for defaults only.
 * @param overrides `key=value` strings (from `--set`); a value is read as a YAML scalar.
 * @param origin what gave @p overrides, for messages and `Config::set_at`: "--set" (the CLI),
 *        "keyword" (the Python package's keyword arguments). A bad value's message is
 *        "ORIGIN key=value: " then the same reason a config file's line gets ("--set
 *        chunk_size=0: '0' is out of range (must be more than 0 and at most 4GiB)").
 * Values are read as text: the YAML core schema's scalar tags (`!!str`, `!!int`, `!!bool`,
 * `!!float`, `!!null`, as PyYAML writes with `default_style='"'` or `canonical=True`) are
 * taken on any key, whose parser reads the text as written; any other tag (`!!binary`,
 * `!!timestamp`, `!foo`) is refused naming it, as are merge keys (`<<`) and a key given
 * twice in one mapping (a nested one too). CRs directly before an LF or at the end of the
 * file are part of the line ending (CRLF, CRCRLF); a CR followed by other text is refused
 * naming its line. A UTF-16 or UTF-32 file is refused as such. An empty value (`''`) or a
 * YAML null (`null`, `~`, nothing, `!!null`; in a file, not in @p overrides, whose values
 * are taken as written) is "no value" except for `checkpoint`, `trace` and
 * `rendezvous.token`, where it means none. A number with an exponent (`1.6e+07`) is no
 * key's value; the message gives the plain spelling when it is a whole number.
 * A message quotes at most the first 64 bytes of a value or key, then its length, with
 * control bytes as `\xHH`.
 *
 * @throws Error `config` (78) for an unknown key or a bad value, naming the key, the value
 *         and the file and line (or `--set`), and for a value that holds a NUL byte (YAML's
 *         `"\0"`: a path would end there) and for a @p yaml_path that is a directory, a
 *         FIFO, a socket or a device; `missing_input` (66) if @p yaml_path leads to no file
 *         (it does not exist, "a/b" where a is a file, a symlink loop); `io` (74) if it cannot
 *         be opened otherwise ("Permission denied") or read.
 */
Config load_config(const std::string& yaml_path, const std::vector<std::string>& overrides,
                   std::string_view origin = "--set");

/// Sets @p overrides (`key=value`) over @p config as `load_config` does, recording @p origin
/// in `Config::set_at`: a second layer with an origin of its own (the Python package's keys
/// from a torch process group over its keywords).
/// @throws Error as `load_config` does for an override.
void apply_overrides(Config& config, const std::vector<std::string>& overrides,
                     std::string_view origin);

/// @return bytes for "16MiB", "1 GiB", "4096", "16MB", "512B" (binary KiB/MiB/GiB/TiB,
///         decimal KB/MB/GB/TB, B; units are case-sensitive, and a bare K/M/G/T is refused
///         as ambiguous). A fraction is taken when it makes whole bytes ("1.5GiB"), with
///         any number of digits.
/// @throws Error `config` naming @p key and @p text when the text is not a size (a unit in
///         another case says the right spelling), is not a whole number of bytes ("0.1KiB"),
///         or is out of range: negative, or over 2^64 - 1 bytes.
std::uint64_t parse_size(std::string_view text, std::string_view key);

/// @return the duration for "300s", "5m", "250ms", "1h", "1.5s" or a plain number of
///         seconds (units `ms`, `s`/`sec`, `m`/`min`, `h`/`hr`, `d`/`day`, case-sensitive).
/// @throws Error `config` naming @p key and @p text when the text is not a duration, is not
///         a whole number of milliseconds ("0.5ms", "1.0005s": never rounded), or is out of
///         range: negative, or over 2^63 - 1 ms.
std::chrono::milliseconds parse_duration(std::string_view text, std::string_view key);

}  // namespace weightcast
