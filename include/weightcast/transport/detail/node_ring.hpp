/**
 * @file node_ring.hpp
 * @brief The node ring: one staging ring in shared memory for every rank of a node
 *        (`transport: shm`, docs/DESIGN.md § Staging, § Transports).
 *
 * Internal (never installed). Rank 0 creates the ring as an anonymous `memfd` — a header page
 * of per-slot state, then `slots` slots of `slot_bytes` — and hands its descriptor to every
 * local rank over an abstract-namespace Unix socket (`SCM_RIGHTS`); every rank maps it. Being
 * anonymous, neither leaves anything in the file system, even after `kill -9`: the memory
 * goes when the last mapping does.
 *
 * Per slot the header holds the chunk in it (`chunk + 1`, 0: none yet), where the chunk
 * starts and how long it is, and how many consumers still copy out of it. Rank 0 publishes a
 * slot once read; each other rank copies its bytes out and releases it; rank 0 reuses a slot
 * only once every consumer has released it. Wake-ups are futexes on shared (not private)
 * words; no wait here is longer than the timeout it is given, so callers look at their own
 * failure state between waits (docs/DESIGN.md § Failure model).
 *
 * Thread safety: the header's words are atomics shared between processes; one object per
 * process, used from one thread.
 */
#pragma once

#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/transport/transport.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>

namespace weightcast::detail {

struct NodeRingHeader;

class NodeRing {
 public:
  /**
   * @brief Rank 0: creates the ring (`memfd_create`, `MFD_CLOEXEC`) and maps it.
   * @param slots number of slots (≥ 1).
   * @param slot_bytes bytes per slot, rounded up to the page size.
   * @param consumers ranks other than rank 0 that copy out of every slot.
   * @throws Error `unavailable` (69) when the memfd cannot be created, sized or mapped
   *         (names the call and the sizes); `config` (78) when @p slots does not fit the
   *         header page.
   */
  static NodeRing create(std::size_t slots, std::uint64_t slot_bytes, std::uint32_t consumers);

  /**
   * @brief Another rank: maps the ring whose descriptor rank 0 sent (`NodeRingServer`).
   * @throws Error `unavailable` (69) when the descriptor is not a ring (its header's magic or
   *         size disagree with the file) or cannot be mapped.
   */
  static NodeRing map(UniqueFd fd);

  NodeRing(NodeRing&& other) noexcept;
  NodeRing& operator=(NodeRing&& other) = delete;
  NodeRing(const NodeRing&) = delete;
  NodeRing& operator=(const NodeRing&) = delete;
  ~NodeRing();

  /// @return the memfd (rank 0 sends it; it stays open while the ring lives).
  [[nodiscard]] int fd() const noexcept { return _fd.get(); }
  /// @return the number of slots.
  [[nodiscard]] std::size_t slots() const noexcept { return _slots; }
  /// @return bytes per slot (a multiple of the page size).
  [[nodiscard]] std::uint64_t slot_bytes() const noexcept { return _slot_bytes; }
  /// @return the first byte of slot @p index (page-aligned; < `slots()`, not checked).
  [[nodiscard]] std::byte* slot_data(std::size_t index) const noexcept;
  /// @return ranks other than rank 0 that copy out of every slot.
  [[nodiscard]] std::uint32_t consumers() const noexcept;

  /**
   * @brief Rank 0: slot @p index now holds chunk @p chunk, @p bytes bytes from @p offset
   *        into the slot; every consumer may copy it. Wakes every waiting consumer.
   * @note The slot must be free (`readers(index) == 0`): rank 0's lease says so.
   */
  void publish(std::size_t index, std::size_t chunk, std::uint64_t offset, std::uint64_t bytes);
  /// @return consumers still copying out of slot @p index (0: rank 0 may reuse it).
  [[nodiscard]] std::uint32_t readers(std::size_t index) const noexcept;

  /// Where a published chunk is: its slot, and its bytes in that slot.
  struct Found {
    std::size_t slot = 0;
    const std::byte* data = nullptr;
    std::uint64_t bytes = 0;
  };
  /**
   * @brief A consumer: the slot holding chunk @p chunk, once rank 0 has published it; waits
   *        at most @p timeout for it (a futex on the publish count: no spinning).
   * @return the chunk, or nothing when it was not published within @p timeout.
   */
  [[nodiscard]] std::optional<Found> find(std::size_t chunk, std::chrono::milliseconds timeout) const;
  /// A consumer: done copying out of slot @p index; the last one wakes rank 0.
  void release(std::size_t index) noexcept;

  // How a load's bytes reach the node's ranks, decided once per load by rank 0 and the same
  // on every rank (docs/DESIGN.md § Staging, "Local reads"): through the ring, or each rank
  // reading its own boxes from the shard files. Every consumer first says whether it could
  // open every shard (`vote`); rank 0 waits for every vote (`votes`), decides (`decide`),
  // and every consumer waits for the decision (`decision`). Loads are numbered from 1, in
  // the order each process runs them on this ring (`next_load`), alike on every rank.

  /// @return the number of the load this process starts now (1, 2, …).
  [[nodiscard]] std::uint32_t next_load() noexcept { return ++_loads; }
  /// A consumer: whether it can read load @p load's shard files itself. Wakes rank 0.
  void vote(std::uint32_t load, bool reads_itself) noexcept;
  /**
   * @brief Rank 0: waits at most @p timeout for every consumer's vote on load @p load.
   * @return true when every consumer can read the files itself, false when one cannot;
   *         nothing when some vote did not arrive within @p timeout.
   */
  [[nodiscard]] std::optional<bool> votes(std::uint32_t load,
                                          std::chrono::milliseconds timeout) const;
  /// Rank 0: load @p load reads locally on every rank (true) or through the ring. Wakes
  /// every consumer.
  void decide(std::uint32_t load, bool local_reads) noexcept;
  /// A consumer: rank 0's decision on load @p load, waiting at most @p timeout for it;
  /// nothing when it did not come in time.
  [[nodiscard]] std::optional<bool> decision(std::uint32_t load,
                                             std::chrono::milliseconds timeout) const;

 private:
  NodeRing(UniqueFd fd, void* mapping, std::uint64_t mapping_bytes);

  UniqueFd _fd;
  void* _mapping = nullptr;
  std::uint64_t _mapping_bytes = 0;
  NodeRingHeader* _header = nullptr;
  std::byte* _slot_base = nullptr;
  std::size_t _slots = 0;
  std::uint64_t _slot_bytes = 0;
  std::uint32_t _loads = 0;  // loads this process started on the ring
};

/// @return this node's identity: its host name and boot id
///         (`/proc/sys/kernel/random/boot_id`), so that two containers or machines that share
///         a host name still differ. Never throws; a missing boot id is left out.
std::string node_id();

/**
 * @brief Rank 0's side of handing the ring's descriptor to the node's other ranks: an
 *        abstract-namespace Unix socket with a random name (nothing in the file system).
 */
class NodeRingServer {
 public:
  /// Binds and listens on a fresh random name. @throws Error `unavailable` (69) naming the call.
  NodeRingServer();
  /// @return the name to share over the control plane (without the leading NUL).
  [[nodiscard]] const std::string& name() const noexcept { return _name; }
  /**
   * @brief Sends @p ring_fd to @p peers connecting processes of this user (`SO_PEERCRED`;
   *        another user's connection is closed with a warning and not counted).
   * @param timeout bound on the whole hand-over, in 100 ms steps; @p stop ends it early.
   * @throws Error `timeout` (75) when fewer than @p peers connected in time (names how many);
   *         `interrupted` (130) on @p stop; `unavailable` (69) naming a failed call.
   */
  void serve(int ring_fd, int peers, std::chrono::milliseconds timeout, std::stop_token stop);

 private:
  UniqueFd _socket;
  std::string _name;
};

/**
 * @brief A rank other than 0: connects to rank 0's `NodeRingServer` @p name, checks that it
 *        runs as this user (`SO_PEERCRED`) and receives the ring's descriptor.
 * @param timeout bound on the whole hand-over, in 100 ms steps; @p stop ends it early.
 * @throws Error `unavailable` (69) when the socket cannot be reached (not on rank 0's node)
 *         or runs as another user; `timeout` (75); `interrupted` (130) on @p stop.
 */
UniqueFd receive_node_ring(const std::string& name, std::chrono::milliseconds timeout,
                           std::stop_token stop);

/**
 * @brief The `shm` transport of @p world_size ranks on one node, over @p ring: it moves no
 *        bytes itself — the pipeline's node ring delivery copies each chunk out of the ring
 *        (docs/DESIGN.md § Pipeline) — and its `broadcast` and `exchange` throw `internal`.
 */
std::unique_ptr<Transport> make_shm_transport(int rank, int world_size, NodeRing ring);

/**
 * @brief Fills @p address and @p length for the abstract-namespace Unix socket @p name
 *        (unix(7): `sun_path` starts with a NUL, so the name is no file and goes with its
 *        socket, even after `kill -9`); the node ring's and the tcp relay's sockets.
 * @throws Error `internal` (70) when @p name does not fit `sun_path` (107 bytes).
 */
void abstract_address(const std::string& name, sockaddr_un& address, socklen_t& length);

}  // namespace weightcast::detail
