#include "weightcast/transport/transport_mpi.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#ifdef WEIGHTCAST_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string_view>
#include <vector>
#endif

namespace weightcast {

#ifndef WEIGHTCAST_HAVE_MPI

namespace {
[[noreturn]] void no_mpi() {
  throw Error(Errc::unavailable,
              "transport: mpi: this build of weightcast has no MPI (install libopenmpi-dev and "
              "rebuild; scripts/install-deps.sh)");
}
}  // namespace

bool mpi_compiled_in() noexcept { return false; }
bool mpi_initialized() noexcept { return false; }
MpiSession::MpiSession() { no_mpi(); }
MpiSession::MpiSession(const MpiCommunicator&) { no_mpi(); }
MpiSession::~MpiSession() = default;
void MpiSession::open(const MpiCommunicator*) { no_mpi(); }
std::pair<int, int> mpi_rank_and_size(const MpiCommunicator&) { no_mpi(); }
std::unique_ptr<Transport> make_mpi_transport(MpiSession&) { no_mpi(); }

#else

namespace {

constexpr std::chrono::microseconds progress_budget{1000};

// An exchange's messages to or from one peer at most this long go together as one message
// of an MPI_Type_create_hindexed datatype: a chunk of small tensors under fsdp holds one
// delivery per tensor, and thousands of requests cost at every MPI_Testall. A longer message
// stays contiguous: within a node Open MPI copies it once, straight from the sender's memory
// (CMA), where a derived datatype is packed through its shared-memory buffers.
constexpr std::uint64_t grouped_message_bytes = 64 * 1024;
// At most this many messages a group, so that a group's length fits MPI's `int` sizes.
constexpr std::size_t max_group_messages = INT_MAX / grouped_message_bytes;

MPI_Comm to_comm(std::uintptr_t handle) {
  MPI_Comm comm;
  static_assert(sizeof comm <= sizeof handle);
  std::memcpy(&comm, &handle, sizeof comm);
  return comm;
}

std::uintptr_t to_handle(MPI_Comm comm) {
  std::uintptr_t handle = 0;
  std::memcpy(&handle, &comm, sizeof comm);
  return handle;
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return fmt::format("error {}", code);
  return std::string(text, static_cast<std::size_t>(length));
}

/// One or more `MPI_Ibcast` requests of one broadcast, or the sends and receives of one
/// exchange.
class MpiBroadcast final : public Pending {
 public:
  MpiBroadcast(MpiSession& session, std::vector<MPI_Request> requests, std::uint64_t bytes,
               bool spin, const char* what = "MPI_Ibcast")
      : _session(session),
        _requests(std::move(requests)),
        _bytes(bytes),
        _spin(spin),
        _what(what) {}
  ~MpiBroadcast() override {
    for (MPI_Request request : _requests) {
      if (request != MPI_REQUEST_NULL) {
        // MPI_Wait could block forever on a dead or stopped peer, and a collective request
        // may not be freed or cancelled (MPI 4.0 §5.12): leave it, and tell the session.
        _session.abandon();
        return;
      }
    }
  }
  bool test() override {
    // Open MPI progresses a non-blocking collective only inside MPI calls (no progress
    // thread), and the loader sleeps between polls. A receiving rank copies the bytes inside
    // those calls (shared memory: it reads the root's buffer), so there each poll drives
    // progress for a short budget instead of testing once; the budget stays far below any
    // timeout. The root only has its sends' completions to learn of: it tests once, and
    // leaves its one thread to the read and upload stages (a buffered io_uring read of a
    // cached page copies inside the submit call, on that thread).
    const auto budget = _spin ? progress_budget : std::chrono::microseconds(0);
    const auto until = std::chrono::steady_clock::now() + budget;
    int done = 0;
    do {
      const int rc = MPI_Testall(static_cast<int>(_requests.size()), _requests.data(), &done,
                                 MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        throw Error(Errc::unavailable, fmt::format("transport mpi: {} of {} bytes failed: {}",
                                                   _what, _bytes, mpi_error(rc)));
      }
    } while (done == 0 && std::chrono::steady_clock::now() < until);
    return done != 0;
  }

 private:
  MpiSession& _session;
  std::vector<MPI_Request> _requests;
  std::uint64_t _bytes;
  bool _spin;  // drive progress for `progress_budget` per test: a broadcast's receiving rank
  const char* _what;
};

// A broadcast's two levels where the ranks span several nodes: an MPI_Ibcast among the nodes'
// leaders (each node's lowest rank), then one on each node from its leader. Open MPI's
// MPI_Ibcast knows ranks, not nodes (its tree sends a far node as many copies as it has ranks
// the tree reaches across the link); this sends each other node one.
struct NodeComms {
  MpiSession& session;
  MPI_Comm node = MPI_COMM_NULL;     // this node's ranks
  MPI_Comm leaders = MPI_COMM_NULL;  // each node's lowest rank; null elsewhere
  // A leader's broadcasts whose second level is not posted yet, oldest first: every rank must
  // post the node's broadcasts in one order (MPI 4.0 §6.12), so a later one waits for the
  // earlier ones' first level even when its own completes first.
  std::deque<struct TwoLevelState*> waiting;

  explicit NodeComms(MpiSession& s) : session(s) {}
  ~NodeComms() {
    // A request left in flight (abandoned) may still use them: leave them to MPI_Finalize.
    if (session.abandoned()) return;
    if (leaders != MPI_COMM_NULL) MPI_Comm_free(&leaders);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
  }
  NodeComms(const NodeComms&) = delete;
  NodeComms& operator=(const NodeComms&) = delete;
};

struct TwoLevelState {
  std::byte* data = nullptr;
  std::uint64_t bytes = 0;
  std::vector<MPI_Request> first;   // among the leaders
  std::vector<MPI_Request> second;  // on the node
  bool second_posted = false;
};

// Posts MPI_Ibcasts of @p bytes at @p data from @p root on @p comm, split at INT_MAX.
void post_ibcast(std::byte* data, std::uint64_t bytes, int root, MPI_Comm comm,
                 std::vector<MPI_Request>& requests, std::string_view level) {
  constexpr std::uint64_t max_count = INT_MAX;
  for (std::uint64_t offset = 0; offset < bytes; offset += max_count) {
    const auto count = static_cast<int>(std::min(max_count, bytes - offset));
    MPI_Request request = MPI_REQUEST_NULL;
    const int rc = MPI_Ibcast(data + offset, count, MPI_BYTE, root, comm, &request);
    if (rc != MPI_SUCCESS) {
      throw Error(Errc::unavailable,
                  fmt::format("transport mpi: MPI_Ibcast of {} bytes {} failed: {}", count,
                              level, mpi_error(rc)));
    }
    requests.push_back(request);
  }
}

// One broadcast over the two levels; test() posts a leader's second level once its first
// (and every earlier broadcast's) has completed.
class TwoLevelBroadcast final : public Pending {
 public:
  TwoLevelBroadcast(std::shared_ptr<NodeComms> comms, std::unique_ptr<TwoLevelState> state,
                    bool spin)
      : _comms(std::move(comms)), _state(std::move(state)), _spin(spin) {}
  ~TwoLevelBroadcast() override {
    auto& waiting = _comms->waiting;
    waiting.erase(std::remove(waiting.begin(), waiting.end(), _state.get()), waiting.end());
    for (const auto* requests : {&_state->first, &_state->second}) {
      for (MPI_Request request : *requests) {
        if (request != MPI_REQUEST_NULL) {
          _comms->session.abandon();  // as MpiBroadcast: a collective request cannot be freed
          return;
        }
      }
    }
    // A leader whose second level never went leaves its node's ranks waiting: the job's
    // failure handling ends them; nothing of this broadcast's memory is in MPI's hands.
    if (!_state->second_posted && _comms->leaders != MPI_COMM_NULL) _comms->session.abandon();
  }

  bool test() override {
    // As MpiBroadcast: a receiving rank drives progress for a while, the root tests once.
    const auto until =
        std::chrono::steady_clock::now() + (_spin ? progress_budget : std::chrono::microseconds(0));
    do {
      advance();
      if (_state->second_posted && test_all(_state->second, "on its node") &&
          test_all(_state->first, "among the nodes' leaders")) {
        return true;
      }
    } while (std::chrono::steady_clock::now() < until);
    return false;
  }

 private:
  bool test_all(std::vector<MPI_Request>& requests, std::string_view level) {
    if (requests.empty()) return true;
    int done = 0;
    const int rc = MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                               MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      throw Error(Errc::unavailable, fmt::format("transport mpi: MPI_Ibcast of {} bytes {} "
                                                 "failed: {}",
                                                 _state->bytes, level, mpi_error(rc)));
    }
    return done != 0;
  }

  // Posts the second level of the leader's oldest broadcasts whose first level is done.
  void advance() {
    auto& waiting = _comms->waiting;
    while (!waiting.empty()) {
      TwoLevelState& oldest = *waiting.front();
      if (!test_all(oldest.first, "among the nodes' leaders")) return;
      post_ibcast(oldest.data, oldest.bytes, 0, _comms->node, oldest.second, "on its node");
      oldest.second_posted = true;
      waiting.pop_front();
    }
  }

  std::shared_ptr<NodeComms> _comms;
  std::unique_ptr<TwoLevelState> _state;
  bool _spin;
};

class MpiTransport final : public Transport {
 public:
  explicit MpiTransport(MpiSession& session) : _session(session) {
    // Across nodes (or where the launcher does not say), broadcasts go over two levels.
    if (!_session.one_node() && _session.world_size() > 2) split_nodes();
  }
  [[nodiscard]] std::string_view name() const noexcept override { return "mpi"; }
  [[nodiscard]] int rank() const noexcept override { return _session.rank(); }
  [[nodiscard]] int world_size() const noexcept override { return _session.world_size(); }
  // Open MPI's shared-memory transport within one node reads the sender's buffer from the
  // receiver (CMA); across nodes a network transport may register it for RDMA instead.
  [[nodiscard]] bool receivers_read_sender_memory() const noexcept override {
    return _session.one_node();
  }
  std::unique_ptr<Pending> broadcast(std::byte* data, std::uint64_t bytes, int root) override {
    if (bytes == 0 || _session.world_size() == 1) return nullptr;
    // Rank 0 leads its node (the lowest rank), so the two levels start from it; another root
    // takes the flat broadcast.
    if (_nodes && root == 0) {
      auto state = std::make_unique<TwoLevelState>();
      state->data = data;
      state->bytes = bytes;
      if (_session.rank() == 0) {
        // The root has the bytes: its node need not wait for the other nodes.
        post_ibcast(data, bytes, 0, _nodes->leaders, state->first, "among the nodes' leaders");
        post_ibcast(data, bytes, 0, _nodes->node, state->second, "on its node");
        state->second_posted = true;
      } else if (_nodes->leaders != MPI_COMM_NULL) {
        post_ibcast(data, bytes, 0, _nodes->leaders, state->first, "among the nodes' leaders");
        _nodes->waiting.push_back(state.get());
      } else {
        post_ibcast(data, bytes, 0, _nodes->node, state->second, "on its node");
        state->second_posted = true;
      }
      return std::make_unique<TwoLevelBroadcast>(_nodes, std::move(state), _session.rank() != 0);
    }
    std::vector<MPI_Request> requests;
    // MPI_BYTE counts are int: split what is larger (every rank splits identically).
    constexpr std::uint64_t max_count = INT_MAX;
    for (std::uint64_t offset = 0; offset < bytes; offset += max_count) {
      const auto count = static_cast<int>(std::min(max_count, bytes - offset));
      MPI_Request request = MPI_REQUEST_NULL;
      const int rc = MPI_Ibcast(data + offset, count, MPI_BYTE, root,
                                to_comm(_session.communicator()), &request);
      if (rc != MPI_SUCCESS) {
        throw Error(Errc::unavailable,
                    fmt::format("transport mpi: MPI_Ibcast of {} bytes from rank {} failed: {}",
                                count, root, mpi_error(rc)));
      }
      requests.push_back(request);
    }
    return std::make_unique<MpiBroadcast>(_session, std::move(requests), bytes,
                                          _session.rank() != root);
  }

  // Placement's point-to-point deliveries. A message over INT_MAX bytes goes as several of
  // at most INT_MAX, which both sides cut alike and MPI keeps in order (non-overtaking).
  std::unique_ptr<Pending> exchange(std::span<const Message> sends,
                                    std::span<const Message> receives, int tag) override {
    std::vector<MPI_Request> requests;
    std::uint64_t total = 0;
    // Requests already posted are left to the session if a later post fails (as a broadcast's).
    struct Guard {
      MpiSession& session;
      std::vector<MPI_Request>& requests;
      bool armed = true;
      ~Guard() {
        if (armed && !requests.empty()) session.abandon();
      }
    } guard{_session, requests};
    // The session's communicator, as every broadcast: a caller's (its ranks, not the world's)
    // or our duplicate of MPI_COMM_WORLD, whose errors return instead of aborting the job.
    const MPI_Comm comm = to_comm(_session.communicator());
    auto post = [&](const Message& m, bool send) {
      constexpr std::uint64_t max_count = INT_MAX;
      total += m.bytes;
      for (std::uint64_t offset = 0; offset < m.bytes; offset += max_count) {
        const auto count = static_cast<int>(std::min(max_count, m.bytes - offset));
        MPI_Request request = MPI_REQUEST_NULL;
        const int rc = send ? MPI_Isend(m.data + offset, count, MPI_BYTE, m.peer, tag,
                                        comm, &request)
                            : MPI_Irecv(m.data + offset, count, MPI_BYTE, m.peer, tag, comm,
                                        &request);
        if (rc != MPI_SUCCESS) {
          throw Error(Errc::unavailable,
                      fmt::format("transport mpi: {} of {} bytes {} rank {} failed: {}",
                                  send ? "MPI_Isend" : "MPI_Irecv", count,
                                  send ? "to" : "from", m.peer, mpi_error(rc)));
        }
        requests.push_back(request);
      }
    };
    // Posts @p group (short messages to or from one peer, in order) as one message, and
    // empties it.
    auto post_group = [&](std::vector<const Message*>& group, bool send) {
      if (group.size() <= 1) {
        if (!group.empty()) post(*group.front(), send);
        group.clear();
        return;
      }
      std::vector<int> lengths;
      std::vector<MPI_Aint> addresses;
      lengths.reserve(group.size());
      addresses.reserve(group.size());
      std::uint64_t bytes = 0;
      for (const Message* m : group) {
        lengths.push_back(static_cast<int>(m->bytes));
        MPI_Aint address = 0;
        MPI_Get_address(m->data, &address);  // relative to MPI_BOTTOM, where it is posted
        addresses.push_back(address);
        bytes += m->bytes;
      }
      const int peer = group.front()->peer;
      const auto fail = [&](const char* call, int rc) {
        return Error(Errc::unavailable,
                     fmt::format("transport mpi: {} of {} messages ({} bytes) {} rank {} "
                                 "failed: {}",
                                 call, group.size(), bytes, send ? "to" : "from", peer,
                                 mpi_error(rc)));
      };
      MPI_Datatype type = MPI_DATATYPE_NULL;
      int rc = MPI_Type_create_hindexed(static_cast<int>(group.size()), lengths.data(),
                                        addresses.data(), MPI_BYTE, &type);
      if (rc != MPI_SUCCESS) throw fail("MPI_Type_create_hindexed", rc);
      rc = MPI_Type_commit(&type);
      if (rc != MPI_SUCCESS) {
        MPI_Type_free(&type);
        throw fail("MPI_Type_commit", rc);
      }
      MPI_Request request = MPI_REQUEST_NULL;
      rc = send ? MPI_Isend(MPI_BOTTOM, 1, type, peer, tag, comm, &request)
                : MPI_Irecv(MPI_BOTTOM, 1, type, peer, tag, comm, &request);
      // Freed now: an operation posted with it keeps what it needs until it completes.
      MPI_Type_free(&type);
      if (rc != MPI_SUCCESS) throw fail(send ? "MPI_Isend" : "MPI_Irecv", rc);
      requests.push_back(request);
      total += bytes;
      group.clear();
    };
    // Messages between two ranks match one to one in the order both post them, and the two
    // sides list them alike (same peer, same lengths, same order), so both group alike: per
    // peer, the short messages first, as groups in their order, then the others in theirs.
    // A group's bytes are the same sequence on both sides, so its send and receive match.
    auto post_all = [&](std::span<const Message> messages, bool send) {
      std::vector<const Message*> by_peer;
      by_peer.reserve(messages.size());
      for (const Message& m : messages) by_peer.push_back(&m);
      std::stable_sort(by_peer.begin(), by_peer.end(),
                       [](const Message* a, const Message* b) { return a->peer < b->peer; });
      std::vector<const Message*> group;
      for (auto begin = by_peer.begin(); begin != by_peer.end();) {
        const auto end = std::find_if(begin, by_peer.end(), [&](const Message* m) {
          return m->peer != (*begin)->peer;
        });
        for (auto m = begin; m != end; ++m) {
          if ((*m)->bytes > grouped_message_bytes) continue;
          group.push_back(*m);
          if (group.size() == max_group_messages) post_group(group, send);
        }
        post_group(group, send);
        for (auto m = begin; m != end; ++m) {
          if ((*m)->bytes > grouped_message_bytes) post(**m, send);
        }
        begin = end;
      }
    };
    post_all(receives, false);
    post_all(sends, true);
    guard.armed = false;
    if (requests.empty()) return nullptr;
    // No spinning here: once a receive's rendezvous message has arrived, one MPI_Testall
    // copies the whole message (vader's single-copy get has no size limit), and a spinning
    // receiver takes the core rank 0 needs where ranks outnumber cores.
    return std::make_unique<MpiBroadcast>(_session, std::move(requests), total,
                                          /*spin=*/false, "MPI_Isend/MPI_Irecv");
  }

 private:
  // The node communicators (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED: the ranks that share
  // memory) and the leaders' (MPI_Comm_split of each node's rank 0, ordered by rank, so rank
  // 0 leads its node and is rank 0 among the leaders). Kept only where it pays: more than one
  // node, and some node with more than one rank. Collective: every rank constructs its
  // transport at the same point.
  void split_nodes() {
    const MPI_Comm comm = to_comm(_session.communicator());
    auto nodes = std::make_shared<NodeComms>(_session);
    auto check = [](int rc, const char* call) {
      if (rc != MPI_SUCCESS) {
        throw Error(Errc::unavailable,
                    fmt::format("transport mpi: {} for the broadcast's node level failed: {}",
                                call, mpi_error(rc)));
      }
    };
    check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, _session.rank(), MPI_INFO_NULL,
                              &nodes->node),
          "MPI_Comm_split_type");
    int node_rank = 0;
    MPI_Comm_rank(nodes->node, &node_rank);
    const int leader = node_rank == 0 ? 1 : 0;
    int count = 0;
    check(MPI_Allreduce(&leader, &count, 1, MPI_INT, MPI_SUM, comm), "MPI_Allreduce");
    check(MPI_Comm_split(comm, leader != 0 ? 0 : MPI_UNDEFINED, _session.rank(), &nodes->leaders),
          "MPI_Comm_split");
    spdlog::debug("transport mpi: {} node(s) for {} ranks: {}", count, _session.world_size(),
                  count > 1 && count < _session.world_size()
                      ? "broadcasts go to each node's leader, then on the node"
                      : "one level");
    if (count > 1 && count < _session.world_size()) _nodes = std::move(nodes);
  }

  MpiSession& _session;
  std::shared_ptr<NodeComms> _nodes;  // null: flat broadcasts
};

// Whether all ranks share this node's memory, from Open MPI's launcher: every rank of the
// job on one node means every rank of any communicator of it too. Not a collective
// (MPI_Comm_split_type would be one more, and a rank still inside it when another fails is
// ended by the job's watchdog); unknown (another MPI, another launcher) is "no".
bool launched_on_one_node() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const char* all = std::getenv("OMPI_COMM_WORLD_SIZE");
  return local != nullptr && all != nullptr && *local != '\0' &&
         std::string_view(local) == std::string_view(all);
}

// Before weightcast initialises Open MPI for a job its launcher put on one node: the ob1 PML
// (point-to-point over the BTLs: shared memory, vader's single-copy CMA, which the mapped
// sends of a placed load are built on) unless the user chose a PML (OMPI_MCA_pml, which
// `mpirun --mca pml X` sets too). Left to choose, Open MPI also opens the cm PML and its MTLs
// (PSM, PSM2, OFI), which probe for network hardware a one-node job does not use and make
// MPI_Init_thread several times slower (bench/RESULTS.md).
void choose_one_node_pml() {
  if (launched_on_one_node()) ::setenv("OMPI_MCA_pml", "ob1", /*overwrite=*/0);
}

}  // namespace

bool mpi_compiled_in() noexcept { return true; }

bool mpi_initialized() noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

MpiSession::MpiSession() { open(nullptr); }

MpiSession::MpiSession(const MpiCommunicator& communicator) { open(&communicator); }

void MpiSession::open(const MpiCommunicator* base) {
  auto fail = [](std::string what) {
    throw Error(Errc::unavailable, "transport mpi: " + std::move(what));
  };
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0) fail("MPI was finalised already in this process; it cannot be used again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0) {
    if (base != nullptr) {
      fail("a communicator was handed in but MPI is not initialised (MPI_Init_thread first)");
    }
    choose_one_node_pml();
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) fail(fmt::format("MPI_Init_thread failed: {}", mpi_error(rc)));
    _owns_mpi = true;
    // Ours to set: errors on MPI_COMM_WORLD (MPI_Comm_dup's) come back as return codes
    // instead of MPI's default of aborting the whole job with its own message.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    // The caller's MPI: below MPI_THREAD_SERIALIZED only the thread that initialised it may
    // call MPI (MPI 4.0 §11.2.1), so run_job on any other thread would be undefined.
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    int main_thread = 0;
    MPI_Is_thread_main(&main_thread);
    if (provided < MPI_THREAD_SERIALIZED && main_thread == 0) {
      fail(fmt::format("MPI was initialised with thread level {} (below MPI_THREAD_SERIALIZED) "
                       "by another thread, so only that thread may call MPI; run the job on "
                       "it (run_job, not run_job_async), or initialise MPI with "
                       "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE",
                       provided == MPI_THREAD_SINGLE ? "MPI_THREAD_SINGLE" : "MPI_THREAD_FUNNELED"));
    }
  }
  const MPI_Comm from = base != nullptr ? to_comm(base->handle) : MPI_COMM_WORLD;
  _one_node = launched_on_one_node();
  {
    // Which path this rank takes, for whoever checks that the one-node shortcuts are taken
    // exactly where every rank shares rank 0's node.
    const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const char* all = std::getenv("OMPI_COMM_WORLD_SIZE");
    const char* pml = std::getenv("OMPI_MCA_pml");
    spdlog::debug("transport mpi: {} (OMPI_COMM_WORLD_LOCAL_SIZE={} OMPI_COMM_WORLD_SIZE={}): "
                  "{}, PML {}",
                  _one_node ? "every rank on this node" : "ranks on other nodes, or unknown",
                  local != nullptr ? local : "unset", all != nullptr ? all : "unset",
                  _one_node ? "one-node path (shared memory; a placed load sends from mapped "
                              "page-cache shards)"
                            : "network path (nothing mapped for sends)",
                  pml != nullptr && *pml != '\0' ? pml : "Open MPI's choice");
  }
  MPI_Comm ours = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(from, &ours);
  if (rc != MPI_SUCCESS) {
    if (_owns_mpi) MPI_Finalize();
    fail(fmt::format("MPI_Comm_dup of {} failed: {}",
                     base != nullptr ? "the communicator handed in" : "MPI_COMM_WORLD",
                     mpi_error(rc)));
  }
  MPI_Comm_set_errhandler(ours, MPI_ERRORS_RETURN);
  _comm = to_handle(ours);
  _have_comm = true;
  MPI_Comm_rank(ours, &_rank);
  MPI_Comm_size(ours, &_world_size);
}

MpiSession::~MpiSession() {
  if (_abandoned) return;
  if (_have_comm) {
    MPI_Comm comm = to_comm(_comm);
    MPI_Comm_free(&comm);
  }
  if (_owns_mpi) MPI_Finalize();
}

std::pair<int, int> mpi_rank_and_size(const MpiCommunicator& communicator) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (initialized == 0 || finalized != 0) {
    throw Error(Errc::unavailable,
                fmt::format("transport mpi: a communicator was handed in but MPI is {}",
                            finalized != 0 ? "finalised already" : "not initialised"));
  }
  const MPI_Comm comm = to_comm(communicator.handle);
  if (comm == MPI_COMM_NULL) {
    throw Error(Errc::unavailable, "transport mpi: the communicator handed in is MPI_COMM_NULL");
  }
  int rank = 0;
  int size = 0;
  int rc = MPI_Comm_rank(comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
  if (rc != MPI_SUCCESS) {
    throw Error(Errc::unavailable,
                fmt::format("transport mpi: the communicator handed in: MPI_Comm_rank/size "
                            "failed: {}",
                            mpi_error(rc)));
  }
  return {rank, size};
}

std::unique_ptr<Transport> make_mpi_transport(MpiSession& session) {
  return std::make_unique<MpiTransport>(session);
}

#endif

}  // namespace weightcast
