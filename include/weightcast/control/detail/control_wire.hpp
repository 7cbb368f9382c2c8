/**
 * @file control/detail/control_wire.hpp
 * @brief The control plane's messages as bytes: framing, hello, status (ABORT, verdict,
 *        refusal) and the final report. Pure functions, no sockets and no Boost.Asio, so the
 *        fuzzer (fuzz/fuzz_control_message.cpp) links them alone.
 *
 * A frame is a header — type u8, payload length u32, little-endian — then the payload. Who
 * reads a frame decides which types it accepts and how long each may be
 * (`decode_frame_header`), so a hostile length is refused from the 5 header bytes, before
 * any payload is read or allocated. Every payload decoder checks each length against the
 * bytes left (`detail::WireReader`) and refuses trailing bytes; a failure is an `Error`
 * `unavailable` (69) naming the sender and the field.
 */
#pragma once

#include "weightcast/control/control_plane.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/control/world.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace weightcast::detail {

/// Control-plane message types (the first header byte).
enum class Frame : std::uint8_t {
  hello = 1,    ///< peer → 0: magic, protocol version, rank, world size, job token, job id
  welcome = 2,  ///< 0 → peer: accepted (empty payload)
  reject = 3,   ///< 0 → peer: the reason, as text
  share = 4,    ///< 0 → peer: opaque bytes (the catalogue, an NCCL unique id), or their last
                ///< piece after `share_part` frames
  abort = 5,    ///< any → any: status and message (`encode_status`)
  report = 6,   ///< peer → 0: the final report (`encode_report`)
  done = 7,     ///< 0 → peer: the verdict (`encode_status`)
  progress = 8,  ///< any → any after the rendezvous: chunks landed so far (`encode_progress`);
                 ///< sent as a heartbeat, so silence means a stopped or hung process
  share_part = 9,  ///< 0 → peer: a piece of shared bytes longer than one frame carries; the
                   ///< pieces that follow, up to the next `share`, complete them
  report_part = 10,  ///< peer → 0: a piece of a report longer than one frame carries; the
                     ///< pieces that follow, up to the next `report`, complete it
};

/// Bytes of a frame header: type u8, payload length u32.
inline constexpr std::size_t frame_header_bytes = 5;
/// Longest payload of one SHARE, SHARE_PART, REPORT or REPORT_PART frame, bytes. What grows
/// with the checkpoint has no fixed limit of its own (the catalogue and every rank's placement
/// wants, shared by rank 0; a rank's wants and its per-tensor digests, reported to rank 0):
/// longer bytes travel as SHARE_PART (REPORT_PART) frames of this size and a last SHARE
/// (REPORT); each frame's length is still checked from its header before its payload is read
/// or allocated.
inline constexpr std::uint32_t max_share_bytes = (64u << 20) + 4096;
/// Longest HELLO payload, bytes: rank 0 reads at most this much from a connection that has
/// not shown the job token yet.
inline constexpr std::uint32_t max_hello_bytes = 4096;
/// Longest ABORT, verdict or refusal payload, bytes (`encode_status` keeps messages shorter).
inline constexpr std::uint32_t max_status_bytes = 64 * 1024;
/// Longest message `encode_status` and a refusal carry, bytes; longer ones are cut.
inline constexpr std::size_t max_status_message_bytes = 60'000;
/// First field of a HELLO ("HELO" little-endian): tells weightcast from a stray client.
inline constexpr std::uint32_t hello_magic = 0x4f4c4548;
/// PROGRESS payload, bytes: chunks landed, u64.
inline constexpr std::uint32_t progress_bytes = 8;
/// Control-plane protocol version; rank 0 refuses a peer speaking another (2: PROGRESS, and
/// the job id in HELLO; 3: SHARE_PART; 4: REPORT_PART; 5: a REPORT carries the digests a
/// rank hashed of its own expected bytes).
inline constexpr std::uint32_t protocol_version = 5;

/// Who reads a frame; decides the types accepted and each one's length limit.
enum class FrameReader {
  greeting,  ///< rank 0, from a connection not yet accepted: HELLO only
  root,      ///< rank 0, from an accepted peer: REPORT, REPORT_PART, ABORT, PROGRESS
  joining,   ///< a peer, rank 0's answer to its HELLO: WELCOME, REJECT, ABORT
  peer,      ///< a peer, after the rendezvous: SHARE, SHARE_PART, ABORT, verdict, PROGRESS
};

/// A decoded frame header.
struct FrameHeader {
  Frame type;                  ///< One @p reader accepts.
  std::uint32_t payload_bytes;  ///< Within that type's limit for @p reader.
};

/**
 * @brief Decodes a frame header and checks it before anything is read or allocated.
 * @param bytes the 5 header bytes as received.
 * @param reader who reads it.
 * @param what names the sender in messages, e.g. "hello from 10.0.0.7:51234".
 * @return the type and payload length.
 * @throws Error `unavailable` (69) naming the type and length when @p reader does not accept
 *         that type, or the length is over its limit (e.g. a 4 GiB length).
 */
FrameHeader decode_frame_header(const std::array<char, frame_header_bytes>& bytes,
                                FrameReader reader, std::string_view what);

/// @return a frame: the header for @p type and `payload.size()`, then @p payload.
/// @throws Error `internal` (70) when @p payload is over 4 GiB − 1 bytes.
std::string frame_bytes(Frame type, std::string_view payload);

/// What a peer tells rank 0 when it connects.
struct Hello {
  std::int32_t rank = 0;        ///< The peer's rank.
  std::int32_t world_size = 0;  ///< The world size the peer was started with.
  std::string token;            ///< The job token it presents ("" = none).
  std::string job_id;           ///< Its launcher's job id (`World::job_id`; "" = none).
};

/// `max_token_bytes` (settings.hpp, where the config checks it) is the longest job token a
/// HELLO carries: what is left of `max_hello_bytes` after the fixed fields (magic, version,
/// rank, world size, two string lengths) and the longest job id.
static_assert(max_token_bytes == max_hello_bytes - 6 * 4 - World::max_job_id_bytes);

/// @return the HELLO payload of @p hello (magic, protocol version, rank, world size, token,
///         job id). Never checks the token's length: the caller refuses one over
///         `max_token_bytes`, which rank 0 would refuse unread.
std::string encode_hello(const Hello& hello);

/**
 * @brief Decodes a HELLO payload.
 * @param what names the sender, e.g. "hello from 10.0.0.7:51234".
 * @throws Error `unavailable` (69): "not weightcast" for another magic, the two versions for
 *         another protocol version, the field when truncated, "trailing bytes" when longer.
 */
Hello decode_hello(std::string_view payload, std::string_view what);

/// An exit status and a message: the payload of ABORT and of the verdict.
struct StatusMessage {
  int status = 0;       ///< Exit status, 0 to 125, or 130/143 (a rank's SIGINT/SIGTERM).
  std::string message;  ///< One line for the user.
};

/// @return the payload for @p status and @p message (cut to `max_status_message_bytes`).
std::string encode_status(int status, std::string_view message);

/**
 * @brief Decodes what `encode_status` wrote.
 * @return the status, or 69 (`unavailable`) when the sender's is outside 0..125 (it would
 *         read as a signal to the shell) other than 130 or 143 (a rank interrupted by SIGINT
 *         or SIGTERM: `Errc::interrupted`, `Errc::terminated`), and the message.
 * @throws Error `unavailable` (69) naming the field when truncated or followed by bytes.
 */
StatusMessage decode_status(std::string_view payload, std::string_view what);

/// @return the REPORT payload of @p report (rank, bytes, seconds as IEEE bits, digests, then
/// the expected digests a rank hashed itself: count and values).
std::string encode_report(const RankReport& report);

/**
 * @brief Decodes a REPORT payload; the digest count is checked against the bytes left
 *        before the digests are allocated.
 * @throws Error `unavailable` (69) naming the field when truncated or followed by bytes.
 */
RankReport decode_report(std::string_view payload, std::string_view what);

/// @return the PROGRESS payload for @p chunks_landed (u64, little-endian).
std::string encode_progress(std::uint64_t chunks_landed);

/**
 * @brief Decodes a PROGRESS payload.
 * @return the sender's chunks landed so far.
 * @throws Error `unavailable` (69) naming the field when truncated or followed by bytes.
 */
std::uint64_t decode_progress(std::string_view payload, std::string_view what);

/// @return whether @p presented equals @p expected, in a time that depends on the expected
///         length only, not on where they differ (a stranger cannot find the token byte by
///         byte).
bool tokens_equal(std::string_view presented, std::string_view expected) noexcept;

}  // namespace weightcast::detail
