/**
 * @file settings.hpp
 * @brief Every setting of a load in one registry: its config key, type, default, bounds,
 *        spellings and one line of documentation; and the kinds a load is set up with
 *        (device, transport, reader, O_DIRECT policy, destination, verify, log level).
 *
 * The one home of each setting's default and bounds: `Config` and `LoadOptions` take their
 * defaults from here, the YAML loader, `--set` and the Python keywords check values against
 * these bounds, and `check_load_options` checks an embedder's `LoadOptions` against the same
 * ones, with the same message (`out_of_range`). Each enum's spellings are the config's
 * (configs/default.yaml documents each key; a test checks that file against this registry).
 * Only the launcher reads YAML (config.hpp, which includes this header).
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace weightcast {

/// `device:` where tensors land: a GPU if one is visible (auto), host memory, or a GPU.
enum class DeviceKind { automatic, host, cuda };
/// `transport:` the data plane: auto (local for one rank; on host mpi where an MPI world is
/// there, else tcp; nccl on cuda), local (world size 1), mpi (host memory, OpenMPI), nccl
/// (device memory), shm (host memory, every rank on rank 0's node: one staging ring shared by
/// the node's ranks), tcp (host memory over plain TCP sockets from rank 0, no MPI needed).
enum class TransportKind { automatic, local, mpi, nccl, shm, tcp };
/// `direct_io:` O_DIRECT policy for rank 0's reads: auto (buffered when the shard is in the
/// page cache or O_DIRECT is refused), on (refusal is an error, 74), off (buffered).
enum class DirectIo { automatic, on, off };
/// `reader:` the read back end (reader.hpp): io_uring, a pread thread pool, or auto.
enum class ReaderKind { automatic, uring, pread };
/// `destination:` where tensor bytes go: an arena, or nowhere (digested and dropped).
enum class Destination { arena, discard };
/// `verify:` after a load, compare every rank's per-tensor XXH3-64 with rank 0's (`digest`),
/// or skip the digests (`none`).
enum class Verify { none, digest };
/// `log_level:` the least severe log line printed to stderr.
enum class LogLevel { error, warn, info, debug };
/// `placement:` which part of each tensor each rank receives, for tensors no rule names
/// (plan/placement.hpp applies it).
enum class PlacementMode : std::uint8_t {
  replicate,  ///< Every tensor whole on every rank (torch `Replicate()`): today's broadcast.
  fsdp,       ///< FSDP2's `Shard(0)` over every rank with `torch.chunk`'s split (`chunk_rows`);
              ///< 0-dim tensors whole on every rank.
};
/// `weightcast launch --spawner`: how the launcher starts its ranks.
enum class Spawner { automatic, mpirun, local };

/// What a setting's value is, which says how it is read, bounded and printed.
enum class SettingType {
  size,        ///< bytes: "16MiB", "1GiB", "4096"; `min`/`max` in bytes.
  count,       ///< a whole number; `min`/`max` inclusive.
  auto_count,  ///< a whole number or `auto` (stored as `default_value`); `min`/`max` bound
               ///< the number.
  duration,    ///< "300s", "5m", "250ms", a plain number of seconds; `min`/`max` in ms.
  choice,      ///< one of `spellings` (case-insensitive); stored as the enum's value.
  text,        ///< a path or a secret: taken as written, "" (or a YAML null) for none.
  address,     ///< a host name or address, or `auto` (stored as ""); never empty.
  rules,       ///< a YAML list (`placement_rules`); docs/placement.md.
};

/// One accepted spelling of a choice: the enum's value as an int. The first spelling of each
/// value is the one printed (`to_string`, the effective config); the others are aliases
/// (`true` for `on`, `io_uring` for `uring`).
struct Spelling {
  std::string_view name;
  int value;
};

/// One setting: the single definition of its default and bounds.
struct Setting {
  std::string_view name;  ///< The config key ("chunk_size", "rendezvous.port").
  SettingType type;
  /// The default: bytes (size), the number (count), ms (duration), the enum's value
  /// (choice); for auto_count the number `auto` is stored as; unused for text and rules
  /// (whose default is empty).
  std::int64_t default_value = 0;
  std::int64_t min = 0;  ///< Least value (size, count, auto_count, duration).
  std::int64_t max = 0;  ///< Greatest value (size, count, auto_count, duration).
  std::span<const Spelling> spellings = {};  ///< choice: every accepted spelling.
  /// choice: the spellings a message lists ("auto, on, off (or true, false)"); count and
  /// auto_count: what the number counts ("staging ring slots"), said in range messages.
  std::string_view what = {};
  std::string_view doc = {};  ///< One line: what the setting does.

  /// @return whether @p value is within [`min`, `max`] (size, count, auto_count, duration).
  [[nodiscard]] constexpr bool admits(std::int64_t value) const noexcept {
    return value >= min && value <= max;
  }
  /// @return whether @p value, unsigned, is within [`min`, `max`].
  [[nodiscard]] constexpr bool admits(std::uint64_t value) const noexcept {
    return value <= static_cast<std::uint64_t>(max) && admits(static_cast<std::int64_t>(value));
  }
};

namespace setting {

inline constexpr std::array<Spelling, 3> device_spellings{{
    {"auto", static_cast<int>(DeviceKind::automatic)},
    {"host", static_cast<int>(DeviceKind::host)},
    {"cuda", static_cast<int>(DeviceKind::cuda)}}};
inline constexpr std::array<Spelling, 6> transport_spellings{{
    {"auto", static_cast<int>(TransportKind::automatic)},
    {"local", static_cast<int>(TransportKind::local)},
    {"mpi", static_cast<int>(TransportKind::mpi)},
    {"nccl", static_cast<int>(TransportKind::nccl)},
    {"shm", static_cast<int>(TransportKind::shm)},
    {"tcp", static_cast<int>(TransportKind::tcp)}}};
// YAML 1.1 booleans are accepted because `direct_io: true` is what people write.
inline constexpr std::array<Spelling, 7> direct_io_spellings{{
    {"auto", static_cast<int>(DirectIo::automatic)}, {"on", static_cast<int>(DirectIo::on)},
    {"off", static_cast<int>(DirectIo::off)}, {"true", static_cast<int>(DirectIo::on)},
    {"false", static_cast<int>(DirectIo::off)}, {"yes", static_cast<int>(DirectIo::on)},
    {"no", static_cast<int>(DirectIo::off)}}};
inline constexpr std::array<Spelling, 4> reader_spellings{{
    {"auto", static_cast<int>(ReaderKind::automatic)},
    {"uring", static_cast<int>(ReaderKind::uring)},
    {"io_uring", static_cast<int>(ReaderKind::uring)},
    {"pread", static_cast<int>(ReaderKind::pread)}}};
inline constexpr std::array<Spelling, 2> destination_spellings{{
    {"arena", static_cast<int>(Destination::arena)},
    {"discard", static_cast<int>(Destination::discard)}}};
// As for direct_io, `verify: false` is what people write.
inline constexpr std::array<Spelling, 8> verify_spellings{{
    {"digest", static_cast<int>(Verify::digest)}, {"none", static_cast<int>(Verify::none)},
    {"true", static_cast<int>(Verify::digest)}, {"false", static_cast<int>(Verify::none)},
    {"yes", static_cast<int>(Verify::digest)}, {"no", static_cast<int>(Verify::none)},
    {"on", static_cast<int>(Verify::digest)}, {"off", static_cast<int>(Verify::none)}}};
inline constexpr std::array<Spelling, 2> placement_spellings{{
    {"replicate", static_cast<int>(PlacementMode::replicate)},
    {"fsdp", static_cast<int>(PlacementMode::fsdp)}}};
// torch's word for host memory: a Python `device=` takes it beside the config's spellings,
// which keep `host` alone so that a config reads one way.
inline constexpr std::array<Spelling, 1> device_aliases{{
    {"cpu", static_cast<int>(DeviceKind::host)}}};
inline constexpr std::array<Spelling, 3> spawner_spellings{{
    {"auto", static_cast<int>(Spawner::automatic)}, {"mpirun", static_cast<int>(Spawner::mpirun)},
    {"local", static_cast<int>(Spawner::local)}}};
inline constexpr std::array<Spelling, 5> log_level_spellings{{
    {"error", static_cast<int>(LogLevel::error)}, {"warn", static_cast<int>(LogLevel::warn)},
    {"warning", static_cast<int>(LogLevel::warn)}, {"info", static_cast<int>(LogLevel::info)},
    {"debug", static_cast<int>(LogLevel::debug)}}};

/// The most ranks a world may have (`world.size`; a rank is below it).
inline constexpr std::int64_t max_world_size = std::int64_t{1} << 20;

inline constexpr Setting checkpoint{"checkpoint", SettingType::text, 0, 0, 0, {}, {},
                                    "file, directory or index to load (rank 0 opens it)"};
inline constexpr Setting device{"device", SettingType::choice,
                                static_cast<int>(DeviceKind::automatic), 0, 0,
                                device_spellings, "auto, host, cuda", "where tensors land"};
inline constexpr Setting transport{"transport", SettingType::choice,
                                   static_cast<int>(TransportKind::automatic), 0, 0,
                                   transport_spellings, "auto, local, mpi, nccl, shm, tcp",
                                   "how tensor bytes travel from rank 0 to the others"};
// The staging ring allocates chunk_size bytes per slot and io_uring reads at most 2^31 bytes
// per request anyway; 4 GiB keeps every size in 32-bit arithmetic of the kernel's iovecs safe
// while allowing anything a user sensibly asks for.
inline constexpr Setting chunk_size{"chunk_size", SettingType::size, std::int64_t{16} << 20, 1,
                                    std::int64_t{4} << 30, {}, {},
                                    "bytes per chunk: one read, one copy, one broadcast"};
inline constexpr Setting buffer_depth{"buffer_depth", SettingType::count, 4, 1, 1024, {},
                                      "staging ring slots",
                                      "staging slots of chunk_size bytes in rank 0's ring"};
inline constexpr Setting io_depth{"io_depth", SettingType::count, 4, 1, 4096, {},
                                  "reads in flight", "reads in flight on rank 0"};
inline constexpr Setting direct_io{"direct_io", SettingType::choice,
                                   static_cast<int>(DirectIo::automatic), 0, 0,
                                   direct_io_spellings, "auto, on, off (or true, false)",
                                   "O_DIRECT reads on rank 0"};
inline constexpr Setting reader{"reader", SettingType::choice,
                                static_cast<int>(ReaderKind::automatic), 0, 0, reader_spellings,
                                "auto, uring, pread", "rank 0's read back end"};
inline constexpr Setting destination{"destination", SettingType::choice,
                                     static_cast<int>(Destination::arena), 0, 0,
                                     destination_spellings, "arena, discard",
                                     "where tensor bytes go: an arena, or nowhere"};
// At most a week: long enough for any real load, short enough that a typo (`300h` for
// `300s`) is still a finite wait, and far from overflowing milliseconds. Durations are whole
// milliseconds, so the least is 1ms.
inline constexpr Setting timeout{"timeout", SettingType::duration, 300'000, 1,
                                 std::int64_t{7} * 24 * 3600 * 1000, {}, {},
                                 "longest any single wait may last"};
inline constexpr Setting verify{"verify", SettingType::choice, static_cast<int>(Verify::digest),
                                0, 0, verify_spellings, "none, digest",
                                "compare every rank's tensor digests with rank 0's"};
inline constexpr Setting placement{"placement", SettingType::choice, 0, 0, 0,
                                   placement_spellings, "replicate, fsdp",
                                   "which part of each tensor each rank receives"};
inline constexpr Setting placement_rules{"placement_rules", SettingType::rules, 0, 0, 0, {}, {},
                                         "placement rules by tensor name, first match wins"};
inline constexpr Setting trace{"trace", SettingType::text, 0, 0, 0, {}, {},
                               "Chrome trace-event JSON to write"};
inline constexpr Setting log_level{"log_level", SettingType::choice,
                                   static_cast<int>(LogLevel::info), 0, 0, log_level_spellings,
                                   "error, warn, info, debug",
                                   "the least severe log line printed"};
// The world (world.hpp): `auto` defers to the launcher's environment.
inline constexpr Setting world_rank{"world.rank", SettingType::auto_count, -1, 0,
                                    max_world_size, {}, "a whole number or auto",
                                    "this process's rank"};
inline constexpr Setting world_size{"world.size", SettingType::auto_count, 0, 1, max_world_size,
                                    {}, "a whole number or auto", "number of ranks"};
inline constexpr Setting world_local_rank{"world.local_rank", SettingType::auto_count, -1, 0,
                                          max_world_size, {}, "a whole number or auto",
                                          "rank among this node's processes"};
// The control plane (control_plane.hpp). The port differs from torchrun's MASTER_PORT
// (29500), which its own store may be using.
inline constexpr Setting rendezvous_address{"rendezvous.address", SettingType::address, 0, 0, 0,
                                            {}, {}, "where rank 0 listens (auto: MASTER_ADDR)"};
inline constexpr Setting rendezvous_port{"rendezvous.port", SettingType::count, 29555, 1, 65535,
                                         {}, "TCP port", "rank 0's control-plane TCP port"};
/// `rendezvous.token`: `max` is the longest job token, bytes: what a rank's HELLO carries
/// after its fixed fields and the longest job id (control/detail/control_wire.hpp asserts the
/// sum), so that the config checks it without reaching up to the control plane's wire format.
inline constexpr Setting rendezvous_token{"rendezvous.token", SettingType::text, 0, 0, 3816, {},
                                          {}, "the job token every rank must present"};

/// Every config key's setting, in the order the effective config prints them: a new setting
/// is its entry above and its line here (`settings()`, `find_setting`).
inline constexpr std::array<Setting, 21> registry{{
    checkpoint, device, transport, chunk_size, buffer_depth, io_depth, direct_io, reader,
    destination, timeout, verify, placement, placement_rules, trace, log_level, world_rank,
    world_size, world_local_rank, rendezvous_address, rendezvous_port, rendezvous_token,
}};

// The launcher's own options (`weightcast launch`), not config keys: every rank of a job reads
// the same config, and these only shape how the ranks are started and ended.
inline constexpr Setting launch_spawner{"--spawner", SettingType::choice,
                                        static_cast<int>(Spawner::automatic), 0, 0,
                                        spawner_spellings, "auto, mpirun, local",
                                        "auto (mpirun for transport mpi, else local), mpirun, or "
                                        "local"};
// Ten minutes: longer than any rank takes to write its report and close, short enough that
// a rank ignoring SIGTERM is still ended.
inline constexpr Setting launch_grace{"--grace", SettingType::duration, 5'000, 0, 600'000, {},
                                      {},
                                      "seconds between SIGTERM and SIGKILL when ending the other "
                                      "ranks (a duration as in a config: 5, 2.5s, 500ms)"};

/// Where each tensor starts in an arena (`LoadOptions::tensor_alignment`), bytes. No config
/// key: the entry point decides, as it knows who views the arena. The library's default packs
/// tensors (the CLI keeps no views); torch views a host arena through DLPack, and 8 B aligns
/// every element of every dtype at no cost for files whose offsets are aligned (the
/// safetensors writer sorts by alignment); a cuda arena keeps cudaMalloc's own 256 B for every
/// tensor, so each view suits vectorised kernels (a job raises any load's to it:
/// detail::planned_tensor_alignment). At most 1 GiB, a power of two (check_load_options).
inline constexpr std::uint64_t tensor_alignment_packed = 1;
inline constexpr std::uint64_t tensor_alignment_torch_host = 8;
inline constexpr std::uint64_t tensor_alignment_cuda = 256;
inline constexpr std::uint64_t tensor_alignment_max = std::uint64_t{1} << 30;

/// @return the arena alignment torch's views want on @p kind (host or cuda), bytes.
constexpr std::uint64_t torch_tensor_alignment(DeviceKind kind) noexcept {
  return kind == DeviceKind::cuda ? tensor_alignment_cuda : tensor_alignment_torch_host;
}

}  // namespace setting

/// @return every setting, in the order the effective config prints them.
std::span<const Setting> settings() noexcept;

/// @return the setting named @p name ("chunk_size"), or nullptr.
const Setting* find_setting(std::string_view name) noexcept;

/// @return the value of spelling @p text (case-insensitive, surrounding spaces ignored) of the
///         choice @p setting, or -1 when it is none of them.
int choice_value(const Setting& setting, std::string_view text) noexcept;

/// @return the device a Python `device=` names by @p text, exactly as spelt ("cpu", "host",
///         "cuda": the config's spellings and `setting::device_aliases`), or nullopt for any
///         other (`auto` too, which the caller resolves first, and "Host").
std::optional<DeviceKind> device_kind(std::string_view text) noexcept;

/// @return the printed spelling of @p value of the choice @p setting ("" if none).
std::string_view choice_name(const Setting& setting, int value) noexcept;

/// @return the default of @p setting as the config spells it ("16MiB", "300s", "auto", "4").
std::string default_text(const Setting& setting);

/// @return @p value of @p setting as the config spells it: "16MiB" (size), "300s"
///         (duration), "4" (count), "auto" (auto_count at its `default_value`).
std::string spell(const Setting& setting, std::int64_t value);

/// @return the bound @p value of @p setting as range messages say it: "4GiB" (size), "7 days",
///         "1ms" (duration), "1024" (the others).
std::string bound_text(const Setting& setting, std::int64_t value);

/**
 * @brief Why a value of @p setting is refused as out of bounds, the same from every surface
 *        (YAML, `--set`, `LoadOptions`, Python keywords).
 * @param shown the value as a message shows it, quoted ("'0'", "'5GiB'").
 * @return "'0' is out of range (must be more than 0 and at most 4GiB)",
 *         "'0' is out of range (must be 1 to 1024: staging ring slots)".
 */
std::string out_of_range(const Setting& setting, std::string_view shown);

/// @return "'x' is not one of auto, uring, pread": why @p shown is no spelling of @p setting.
std::string not_a_choice(const Setting& setting, std::string_view shown);

/// @return the config spelling of a value ("auto", "host", "uring", …), as `to_yaml` prints it.
std::string_view to_string(DeviceKind) noexcept;
std::string_view to_string(TransportKind) noexcept;
std::string_view to_string(DirectIo) noexcept;
std::string_view to_string(ReaderKind) noexcept;
std::string_view to_string(Destination) noexcept;
std::string_view to_string(Verify) noexcept;
std::string_view to_string(LogLevel) noexcept;

/// @return @p setting's default as its enum @p E (a choice).
template <typename E>
constexpr E default_choice(const Setting& setting) noexcept {
  return static_cast<E>(setting.default_value);
}

namespace detail {
/// `rendezvous.token`: the longest job token, bytes (the registry's bound).
inline constexpr std::size_t max_token_bytes =
    static_cast<std::size_t>(setting::rendezvous_token.max);
}  // namespace detail

}  // namespace weightcast
