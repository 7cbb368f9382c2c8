/**
 * @file control_plane.hpp
 * @brief The control plane: TCP from rank 0 to every other rank (docs/DESIGN.md § Control plane).
 *
 * Rank 0 listens on `rendezvous.address:rendezvous.port` (that address only); the other ranks
 * connect, retrying with backoff until `timeout`, and introduce themselves (protocol version,
 * rank, world size, job token). Rank 0 checks the token first and refuses a wrong one (logged
 * on both sides) before it says anything about the job.
 *
 * The listener is open to whoever can route to it, so it never trusts a connection before the
 * token: it keeps accepting through failed accepts (out of file descriptors: it retries every
 * 100 ms), reads at most 4 KiB from a connection that has not shown the token, gives each such
 * connection min(`timeout`, 5 s) to say hello, and lets at most 64 wait at once (one more
 * closes the oldest), so a flood of silent or slow connections neither exhausts descriptors
 * nor locks the real peers out.
 *
 * The connection then carries framed messages (type u8, length u32, payload; little-endian;
 * control/detail/control_wire.hpp). Each side accepts only the types the other sends and checks the
 * length against that type's limit (64 MiB + 4 KiB for a frame of shared bytes and reports,
 * 64 KiB for ABORT and the verdict) before it allocates anything. What grows with the
 * checkpoint travels whatever its size, in frames of at most that limit:
 *  - what rank 0 shares with every rank (the catalogue, every rank's placement wants, an NCCL
 *    unique id): longer bytes go as SHARE_PART pieces and a last SHARE;
 *  - what each rank reports to rank 0 (its placement wants, its per-tensor digests): longer
 *    reports go as REPORT_PART pieces and a last REPORT;
 *  - ABORT(status, message): any failure on any rank ends every rank with that message and
 *    exit status; rank 0 relays a peer's ABORT to the others;
 *  - rank 0's verdict;
 *  - PROGRESS, a heartbeat both ways (`note_progress`): the chunks a rank has landed. When a
 *    load stalls, rank 0 names the ranks that fell silent (stopped or hung) and how far
 *    each got (`stall_report`), and the other ranks leave that diagnosis to rank 0
 *    (`defer_to_root`).
 *
 * From the end of the rendezvous the control plane's own thread reads and writes every
 * connection (each a reader and a writer coroutine on the control plane's io_context; a
 * caller's send hands its frame to the writer and waits for it). An ABORT, or a
 * connection lost before the verdict (a dead process), is this job's end: rank 0 passes it on
 * to every other rank, every wait of the control plane's on the main thread throws it as a
 * `RemoteAbort` (`remote_failure`), and the ending hook (`on_ending`) runs on the control
 * plane's thread, to stop a load in progress. The control plane never ends the process: a
 * rank blocked in a call that cannot be unwound (an `MPI_Ibcast` in flight cannot be
 * cancelled) is the caller's to end (weightcast/distributed/job.hpp, "The failure model").
 * Every wait is bounded by `timeout` (or the bound it names) of the time this process ran: a
 * rank stopped (SIGSTOP, a debugger) and resumed does not count the time it was stopped, and
 * looks at what arrived meanwhile (the catalogue, a verdict, an ABORT, the heartbeats)
 * before it gives up or calls another rank silent; the other ranks, meanwhile, meet its
 * stall and name it.
 *
 * Boost.Asio stays inside control/'s sources (pimpl), so this header is cheap to include.
 */
#pragma once

#include "weightcast/core/error.hpp"
#include "weightcast/core/settings.hpp"
#include "weightcast/control/world.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weightcast {

/// Where and how ranks meet. `rendezvous_options()` (weightcast/config/launch_options.hpp)
/// fills it from a config and the world.
struct RendezvousOptions {
  std::string address = "127.0.0.1";  ///< IP address (or host name) rank 0 binds and peers dial.
  /// TCP port of rank 0's listener.
  std::uint16_t port = static_cast<std::uint16_t>(setting::rendezvous_port.default_value);
  std::string token;                  ///< Job token every peer must present ("" = none).
  /// This rank's launcher's job id (`World::job_id`, "" = none); rank 0 refuses a peer whose
  /// job id differs from its own when both have one (a rank of another job on the port).
  std::string job_id;
  std::string job_id_source;          ///< Where `job_id` came from, for messages.
  /// Where `address` came from, for messages: "rendezvous.address", "MASTER_ADDR", the
  /// launcher (`World::root_host_source`) or "the default".
  std::string address_source = "the default";
  /// `World::spans_hosts`: what says the ranks are on more than one host ("" = one host, or
  /// unknown). With it, a loopback `address` is refused before anything listens or dials.
  std::string spans_hosts;
  std::chrono::milliseconds timeout{setting::timeout.default_value};  ///< Bound on every wait.
  /// Ends the rendezvous early: a stop requested while rank 0 waits for its peers, or a peer
  /// for rank 0, is seen within 100 ms and thrown as `interrupted` (130) (rank 0 first tells
  /// the ranks that joined). `run_job` passes `LoadOptions::stop` here.
  std::stop_token stop;
};

/// One rank's final report: what landed there.
struct RankReport {
  int rank = 0;
  std::uint64_t bytes = 0;              ///< Tensor bytes delivered.
  double seconds = 0;                   ///< Load wall time.
  std::vector<std::uint64_t> digests;   ///< XXH3-64 per tensor, catalogue order.
  /// A placed load's local reads: XXH3-64 per want of the bytes this rank read from the files
  /// for it (`LoadResult::self_expected_digests`), which rank 0 compares `digests` with; empty
  /// where rank 0 hashed them itself.
  std::vector<std::uint64_t> expected;
};

/// An ABORT that came from another rank: its message already names the failing rank; pass
/// it on unchanged (do not prefix it or send it back).
class RemoteAbort : public Error {
 public:
  using Error::Error;
};

/// The job's outcome as rank 0 decides it.
struct Verdict {
  int status = 0;       ///< Exit status every rank ends with.
  std::string message;  ///< Summary line (e.g. "3 ranks × 291 tensors bit-exact").
};

class ControlPlane {
 public:
  /**
   * @brief Rendezvous: rank 0 accepts `world_size - 1` peers; the others connect to rank 0.
   *
   * Blocks at most `options.timeout`. Starts the control plane's thread on success. At world
   * size 1 does nothing (no socket, no thread).
   * @throws Error `config` (78) on every rank at once when `options.address` is a loopback
   *         address (127.0.0.0/8, ::1; a host name that resolves to one, as Debian's
   *         /etc/hosts maps a host's own name to 127.0.1.1) and `options.spans_hosts` says
   *         the ranks are on more than one host: the message names the evidence and the fix.
   * @throws Error `unavailable` (69) when `options.address` does not resolve, rank 0 cannot
   *         listen (names address and port), a peer cannot reach rank 0 in time, or rank 0
   *         answers a peer's hello with a malformed or unknown message (another service on
   *         the port); `config` (78) on a peer whose token is longer than rank 0 takes
   *         (`detail::max_token_bytes`), or when rank 0 refuses it (wrong token, another
   *         job's id, world size, rank taken); `interrupted` (130) once `options.stop` is
   *         requested before the rendezvous is over; `timeout` (75) on rank 0 when some rank
   *         did not join in time (names the ranks, and any refused connection; the ranks that
   *         joined get that as an ABORT), and on a peer whose hello rank 0 accepted but did
   *         not answer in time.
   * @throws RemoteAbort with rank 0's status and message on a peer that rank 0 aborts during
   *         the rendezvous (e.g. its own `timeout` for the ranks that did not join).
   */
  ControlPlane(const World& world, const RendezvousOptions& options);
  /// Closes every connection and joins the control plane's thread. Never blocks longer than
  /// a moment.
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  /// @return this rank (`World::rank` as constructed).
  [[nodiscard]] int rank() const noexcept;
  /// @return the number of ranks (`World::world_size` as constructed).
  [[nodiscard]] int world_size() const noexcept;

  /**
   * @brief Rank 0 sends @p bytes to every rank; the others receive what rank 0 sent.
   * Calls must match in number and order on every rank (e.g. catalogue, then NCCL id).
   * Bytes of any length travel: over `detail::max_share_bytes` (64 MiB + 4 KiB) as pieces
   * of that size, each frame's length checked before its payload is allocated, the whole
   * growing only by what arrives (a catalogue is bounded by the checkpoint's headers, not by
   * the control plane: catalogue_wire.hpp; every rank's wants by the catalogue and the world
   * size: placement.hpp).
   * @return @p bytes on rank 0, rank 0's bytes elsewhere (@p bytes at world size 1).
   * @throws Error `timeout` (75) when nothing arrives (or a send cannot finish) in `timeout`;
   *         `unavailable` (69) when a send to a peer fails (the peer is gone); `RemoteAbort`
   *         once another rank's failure has ended the job (`remote_failure`: a send that
   *         failed because the peer hung up after its ABORT throws that ABORT).
   */
  std::string share(std::string bytes);

  /**
   * @brief Tells every rank this rank failed with @p error (whose message should name the
   *        rank), so each ends with the same message and status. Rank 0 then waits (at most
   *        `timeout`, and 10 s) for the others to hang up. Never throws.
   */
  void abort(const Error& error) noexcept;

  /**
   * @brief Sends this rank's report to rank 0; on rank 0 collects everyone's. May be called
   *        more than once (each call collects one report per rank), provided no rank sends
   *        its next report before rank 0 has collected this call's (e.g. rank 0 `share`s
   *        between them). A report of any length travels, as `share`'s bytes do: over
   *        `detail::max_share_bytes` as pieces of that size, rank 0's copy growing only by
   *        what arrives (digests are 8 bytes a tensor of the catalogue or of this rank's wants).
   * @param what names the report in a timeout's message ("final report").
   * @return on rank 0 the reports of every rank, indexed by rank; elsewhere empty. The
   *         report's `rank` is set to this rank.
   * @throws Error `timeout` (75) on rank 0 naming the ranks whose report did not arrive in
   *         `timeout`; elsewhere as `share` does when the send fails or stalls;
   *         `RemoteAbort` once another rank's failure has ended the job (`remote_failure`).
   */
  std::vector<RankReport> gather(RankReport mine, std::string_view what = "final report");

  /**
   * @brief Rank 0 tells every rank the outcome; the others wait for it.
   * @param verdict rank 0's verdict (ignored elsewhere).
   * @return rank 0's verdict, on every rank.
   * @throws Error `timeout` (75) when no verdict arrives in `timeout`.
   */
  Verdict finish(Verdict verdict);

  /**
   * @brief Records that this rank's load has landed @p chunks_landed chunks (cheap: an atomic
   *        store; any thread, e.g. from `LoadOptions::on_progress`).
   *
   * From the rendezvous on, the control plane's thread sends a heartbeat (PROGRESS:
   * this count) on every connection each `timeout`/10, clamped to 10 ms..1 s, whatever the
   * main thread is blocked in (an MPI or NCCL wait, `MPI_Init_thread`). A rank that sends
   * nothing for four such intervals is stopped (SIGSTOP, a debugger) or its process hung.
   */
  void note_progress(std::uint64_t chunks_landed) noexcept;

  /**
   * @brief What this rank knows of the others, for a stall's message: on rank 0 the ranks
   *        silent on the control plane (and for how long) and the chunks each other rank has
   *        landed; on the others the same of rank 0.
   * @return e.g. "rank(s) 1 sent nothing over the control plane for 4.1 s (stopped, or the
   *         process hung; rank 1 had landed 12 chunks when last heard); chunks landed: rank 0
   *         137, rank 2 139", or "every rank answers on the control plane; ..." (rank 0) /
   *         "rank 0 answers on the control plane; ..." (others) when none is silent; chunk
   *         counts only once a chunk has landed somewhere, and for more than 8 ranks only the
   *         fewest and most; "" at world size 1.
   */
  [[nodiscard]] std::string stall_report() const;

  /**
   * @brief On a rank other than 0 about to fail with a timeout: rank 0, when it still answers
   *        on the control plane, meets the same stall and can name the rank behind it; waits
   *        up to @p most for rank 0's ABORT (then `remote_failure` holds rank 0's message).
   *        Returns at once on rank 0, or when rank 0 is silent or gone. Never throws.
   */
  void defer_to_root(std::chrono::milliseconds most) noexcept;

  /**
   * @brief On a rank other than 0 that sent its ABORT (`abort`) and is about to exit: waits
   *        until rank 0 has hung up, at most @p most. Rank 0 hangs up once it has read the
   *        ABORT and passed it on; a process that exits before then may reset the connection
   *        (TCP sends RST when unread bytes, e.g. a heartbeat, are left), and the reset can
   *        discard the ABORT before rank 0 reads it, which then reports this rank as dead
   *        (69) instead of its failure. Returns at once on rank 0 or without an ABORT sent.
   *        Never throws.
   */
  void linger(std::chrono::milliseconds most) noexcept;

  /**
   * @brief Sets what the control plane's thread does, once, when another rank's ABORT or a
   *        lost peer ends the job (`remote_failure` is set by then; on rank 0 the ABORT has
   *        been passed on): e.g. stop the load in progress. Empty: nothing. The hook must not
   *        throw and should return promptly (the control plane's thread waits for it); clear
   *        it before what it refers to goes away (a call waits for a hook in progress to
   *        return).
   */
  void on_ending(std::function<void()> hook);

  /// @return the failure another rank's ABORT, or a lost peer, ended the job with (its
  ///         status as the `Errc`, and its message, which names the failing rank), once the
  ///         control plane's thread has received it; nullopt otherwise. Safe from any thread.
  [[nodiscard]] std::optional<RemoteAbort> remote_failure() const;

  /// @brief Rank 0, after a `remote_failure`: waits until every other rank has been told
  ///        (has hung up, sent the ABORT itself, or fell silent), at most `timeout` and
  ///        10 s, so that no rank learns of the failure only as a lost rank 0. Returns at
  ///        once elsewhere. Never throws.
  void await_told() noexcept;

  /**
   * @brief Rank 0, after the verdict (`finish`): waits until every other rank has hung up
   *        (it exits after the verdict), at most @p most. A rank stopped or hung after the
   *        verdict would hold the launcher, which waits for every process, forever; failing
   *        here makes mpirun (or `launch`) end it. No-op elsewhere.
   * @throws Error `timeout` (75) naming the ranks still connected and what `stall_report`
   *         says of them.
   */
  void await_hangups(std::chrono::milliseconds most);

  /// @return true once an ABORT from this rank has been sent (the caller should not resend).
  [[nodiscard]] bool aborted() const noexcept;

  /// @return true once the job is ending over the control plane: an ABORT was sent or
  ///         received, or a peer was lost. Safe from any thread.
  [[nodiscard]] bool ending() const noexcept;

  /// For a caller about to end the process with `_exit` (no destructors run), once what it
  /// had to say is sent (`abort`, `linger`, `await_told`): stops the control plane's thread
  /// (its io_context) and joins it, waiting at most @p most (of the wall clock) for it to
  /// return, so that no thread is left unjoined at the exit (ThreadSanitizer reports one as
  /// leaked). Waits on no peer: a thread still inside a handler after @p most is left alone.
  /// Does nothing on the control plane's thread itself. After it the control plane neither
  /// reads nor sends (heartbeats included). Must not run concurrently with the destructor.
  void stop_reader(std::chrono::milliseconds most) noexcept;

  /// Implementation (Boost.Asio): control/detail/control_session.hpp.
  struct Impl;

 private:
  std::unique_ptr<Impl> _impl;
};

}  // namespace weightcast
