/**
 * @file settings.hpp
 * @brief The kinds a load is set up with (device, transport, reader, O_DIRECT policy,
 *        destination, verify, log level) and the rendezvous token's bound, without the
 *        YAML loader.
 *
 * The reader, device, world and log layers take these values; only the launcher reads them
 * from YAML (config.hpp, which includes this header). Each enum's spelling is the config's
 * (configs/default.yaml documents each key).
 */
#pragma once

#include <cstddef>
#include <string_view>

namespace weightcast {

/// `device:` where tensors land: a GPU if one is visible (auto), host memory, or a GPU.
enum class DeviceKind { automatic, host, cuda };
/// `transport:` the data plane: auto (local for one rank, mpi on host, nccl on cuda),
/// local (world size 1), mpi (host memory, OpenMPI), nccl (device memory).
enum class TransportKind { automatic, local, mpi, nccl };
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

/// @return the config spelling of a value ("auto", "host", "uring", …), as `to_yaml` prints it.
std::string_view to_string(DeviceKind) noexcept;
std::string_view to_string(TransportKind) noexcept;
std::string_view to_string(DirectIo) noexcept;
std::string_view to_string(ReaderKind) noexcept;
std::string_view to_string(Destination) noexcept;
std::string_view to_string(Verify) noexcept;
std::string_view to_string(LogLevel) noexcept;

namespace detail {
/// `rendezvous.token`: the longest job token, bytes: what a rank's HELLO carries after its
/// fixed fields and the longest job id (control/detail/control_wire.hpp asserts the sum). Kept here
/// so that the config checks it without reaching up to the control plane's wire format.
inline constexpr std::size_t max_token_bytes = 3816;
}  // namespace detail

}  // namespace weightcast
