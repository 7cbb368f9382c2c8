/**
 * @file transport_tcp.hpp
 * @brief The `tcp` data plane: host-memory broadcast and exchange over plain TCP sockets, for
 *        several ranks without MPI (torchrun on CPU, torch.multiprocessing, `weightcast
 *        launch --spawner local`).
 *
 * Rank 0 holds one connection to every other rank (a star): exchanges (placed loads) go over
 * it, each byte to the one rank that wants it. Broadcasts follow the nodes (`TcpNodes`): rank 0
 * sends each chunk to the ranks on its own node and to one rank on each other node, that
 * node's leader (its lowest rank), which forwards the bytes to its node's other ranks as they
 * arrive (cut-through: it forwards what has landed, not whole chunks) over a node-local Unix
 * socket. So one copy of every chunk leaves rank 0's node per other node, the least a
 * broadcast can send (docs/DESIGN.md § Transports). Without `TcpNodes` it is the plain star:
 * each rank gets its own copy from rank 0.
 *
 * Progress is made inside `Pending::test()` on non-blocking sockets: no thread of the
 * loader's ever blocks on a socket, and no thread of the transport's own runs. Bytes go
 * straight from the sender's arena (`sendmsg` of several buffers) into the receiver's
 * destination (`readv`): no copy on the way. Each operation on a connection starts with a
 * 16-byte header (its byte count, its kind and tag) that the receiver checks against what it
 * posted, so ranks whose plans differ fail (`internal`, 70) instead of landing wrong bytes.
 *
 * NOT THREAD SAFE: one thread calls the transport and tests its pendings (the loader's). A
 * pending shares ownership of the connections, so it may outlive the transport.
 */
#pragma once

#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/transport/transport.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace weightcast {

/// Size of the secret a peer shows rank 0's data port, bytes.
inline constexpr std::size_t tcp_nonce_bytes = 16;
/// A fresh random secret (getrandom(2)) for one job's data port; the control plane carries it
/// from rank 0 to the other ranks, so only ranks that passed the rendezvous's token know it.
using TcpNonce = std::array<std::byte, tcp_nonce_bytes>;

/// Which node each rank runs on, for the broadcast relay: rank r runs on node `node[r]`
/// (any numbering; ranks with the same number share a node: the job numbers the ranks'
/// `detail::node_id`s). Every rank must be given the same value.
struct TcpNodes {
  /// One entry per rank (world size entries), or none: every rank gets its broadcasts from
  /// rank 0 directly (no relay).
  std::vector<int> node;
  /// Names each leader's relay socket (an abstract Unix socket
  /// `weightcast-relay-<id in hex>-<leader rank>`, nothing in the file system): a random value
  /// of rank 0's, so that two jobs on one node do not meet. The socket's peers still show the
  /// job's secret, as on rank 0's data port.
  std::uint64_t relay_id = 0;
};

/// What a tcp pending throws when its connection to @p peer is lost (closed or reset: the
/// peer failed or was killed): `unavailable` (69). Its own type, so that a job can give the
/// control plane, which names the lost rank and why, a moment to say so first.
class TcpConnectionLost : public Error {
 public:
  TcpConnectionLost(int peer, std::string message)
      : Error(Errc::unavailable, std::move(message)), _peer(peer) {}
  /// @return the rank at the other end of the lost connection.
  [[nodiscard]] int peer() const noexcept { return _peer; }

 private:
  int _peer;
};

/// @return a fresh `TcpNonce` from getrandom(2).
/// @throws Error `unavailable` (69) when getrandom fails (errno's text).
TcpNonce tcp_nonce();

/**
 * @brief Rank 0's listening socket for the tcp transport: an ephemeral port on @p address,
 *        the address rank 0's rendezvous listens on (which every peer reaches already).
 */
class TcpListener {
 public:
  /// Listens on @p address (an IP address or a host name, as `RendezvousOptions::address`),
  /// on a port the kernel picks.
  /// @throws Error `unavailable` (69) naming the address when it does not resolve, or the
  ///         socket cannot be bound or listen (errno's text).
  explicit TcpListener(std::string_view address);
  /// @return the port the kernel gave the listener (host byte order).
  [[nodiscard]] std::uint16_t port() const noexcept { return _port; }
  /// @return the address it listens on, as given.
  [[nodiscard]] const std::string& address() const noexcept { return _address; }
  /// @return the listening descriptor (still owned).
  [[nodiscard]] int fd() const noexcept { return _fd.get(); }

 private:
  detail::UniqueFd _fd;
  std::uint16_t _port = 0;
  std::string _address;
};

/**
 * @brief Rank 0's end: accepts a connection from each of ranks 1..@p world_size − 1 on
 *        @p listener, then returns the transport.
 *
 * Each connection must first send its hello (a magic, its rank, the world size, @p nonce)
 * within the wait; a connection whose hello is wrong, late by the deadline, or names a rank
 * that has connected already, is a stranger: it is closed (logged, at most a few lines) and
 * rank 0 keeps accepting. Once every rank is in, rank 0 answers each with an acceptance, so
 * a refused rank knows it was refused. Sockets get `TCP_NODELAY` and 16 MiB send and receive
 * buffers (the kernel caps them at net.core.wmem_max / rmem_max).
 * @param timeout bound on the whole wait for the ranks.
 * @param stop when requested (the caller's stop, or another rank failed), the wait ends
 *        within 50 ms.
 * @param nodes where each rank runs: rank 0 broadcasts to the ranks on its node and to each
 *        other node's leader only. Empty: to every rank.
 * @throws Error `timeout` (75) naming the ranks that did not connect and the port, when
 *         some are missing after @p timeout; `unavailable` (69) when accept or a socket call
 *         fails; `interrupted` (130) on @p stop; `internal` (70) when @p world_size < 2, or
 *         @p nodes has neither 0 nor @p world_size entries.
 */
std::unique_ptr<Transport> make_tcp_transport(TcpListener listener, int world_size,
                                              const TcpNonce& nonce,
                                              std::chrono::milliseconds timeout,
                                              std::stop_token stop = {},
                                              const TcpNodes& nodes = {});

/**
 * @brief A rank other than 0: connects to rank 0's data port @p address : @p port, shows
 *        its rank and @p nonce, and waits for rank 0's acceptance; then joins its node's relay.
 *
 * Relay (@p nodes given, this rank not on rank 0's node): a node's leader listens on its
 * relay socket before it dials rank 0, and once accepted waits for its node's other ranks
 * (their hellos checked as rank 0 checks them, then each accepted); any other rank, once
 * rank 0 has accepted it (so its leader is listening), dials its leader's relay socket.
 * @param rank this rank, 1 ≤ rank < @p world_size.
 * @param timeout bound on connecting and on the acceptance (rank 0's and the leader's).
 * @param stop as above.
 * @param nodes as for rank 0's end, the same value on every rank.
 * @throws Error `unavailable` (69) naming rank 0's address and port (or the leader's relay
 *         socket) when the connection is refused or lost, or rank 0 (the leader) closes it
 *         without accepting (a wrong nonce: not this job's rank 0); `interrupted` (130) on
 *         @p stop; `timeout` (75) when the connection or the acceptance takes longer than
 *         @p timeout, or a leader's ranks do not all join it (named); `internal` (70) when
 *         @p rank is out of range or @p nodes has the wrong size.
 */
std::unique_ptr<Transport> make_tcp_transport(int rank, int world_size, std::string_view address,
                                              std::uint16_t port, const TcpNonce& nonce,
                                              std::chrono::milliseconds timeout,
                                              std::stop_token stop = {},
                                              const TcpNodes& nodes = {});

/*
 * What the transport's operations do and throw (the `Transport` interface's contract, for
 * tcp):
 *  - `broadcast` / `broadcast_group`: @p root must be 0 (`config`, 78, otherwise: the star
 *    has no other root). Rank 0 queues the ranges on the connection to each rank on its node
 *    and to each other node's leader; a leader receives them into its ranges and sends each
 *    byte on to its node's other ranks once it has landed (the pending completes when all
 *    have gone); the others receive from rank 0 or from their leader. Each hop checks the
 *    header. Null for 0 bytes.
 *  - `exchange`: messages between rank 0 and another rank, either way; a message from a rank
 *    to itself is a memcpy, paired in posting order with this call's receives from itself
 *    (`internal`, 70, when their counts or sizes differ). A message between two ranks other
 *    than 0 is refused with `config` (78): the star has no such connection.
 *  - Operations on one connection go in posting order, one after the other, whichever
 *    pending is tested. A pending's `test()` throws `TcpConnectionLost` (`unavailable`,
 *    69) naming the peer rank (rank 0, a leader, or a leader's rank) when its connection is
 *    lost (the peer closed it, or reset it: a killed rank) or a socket call fails;
 *    `internal` (70) when what arrives does not match what this rank posted (another byte
 *    count, kind or tag: the ranks' plans differ). After that every operation on that
 *    connection fails the same way.
 *  - Destroying a pending that has not completed closes the connections it was using: none
 *    of its memory is read or written afterwards, and later operations on them fail
 *    (`unavailable`).
 */

}  // namespace weightcast
