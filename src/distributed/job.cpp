// A load on any number of ranks, step by step: meet, share the catalogue and agree the
// settings, plan, join the transport, load, reach the verdict; every failure ends every rank
// with one message (weightcast/distributed/job.hpp, "The failure model": job_failure.cpp).
#include "weightcast/distributed/job.hpp"

#include "weightcast/checkpoint/catalogue_wire.hpp"
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/config/launch_options.hpp"
#include "weightcast/config/load_options.hpp"
#include "weightcast/control/world.hpp"
#include "weightcast/core/detail/running_time.hpp"
#include "weightcast/core/detail/plural.hpp"
#include "weightcast/pipeline/digest.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/core/log.hpp"
#include "weightcast/distributed/detail/job_failure.hpp"
#include "weightcast/distributed/detail/job_setup.hpp"
#include "weightcast/distributed/detail/job_verdict.hpp"
#include "weightcast/distributed/placement_agreement.hpp"
#include "weightcast/transport/detail/node_ring.hpp"
#include "weightcast/transport/transport_mpi.hpp"
#include "weightcast/transport/detail/transport_tcp.hpp"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace weightcast {

namespace {

using Clock = std::chrono::steady_clock;
using detail::check_shared_settings;
using detail::FailureReport;
using detail::judge;
using detail::judge_placed;
using detail::linger_most;
using detail::reader_stop_most;
using detail::resolve_world;
using detail::root_grace;
using detail::planned_tensor_alignment;
using detail::shared_settings;
using detail::Watchdog;

// ---- one rank's job ------------------------------------------------------------------------

class Job {
 public:
  explicit Job(const JobOptions& options) : _options(options), _failure(options) {}

  JobResult run() {
    meet();
    try {
      agree_identity();
      Catalogue catalogue = share_catalogue();
      LoadOptions options = plan();
      confirm_ready();
      open_transport();
      // After the data plane is up, so that a rank stalled in MPI_Init_thread is still named
      // by its watchdog.
      agree_wants(catalogue, options);
      // A placed load's point-to-point channels, connected before its arena is allocated
      // (NCCL allocates their device buffers at the first message).
      if (several() && _placement) _transport->connect_exchange(0);
      JobResult result = run_load(std::move(catalogue), std::move(options));
      reach_verdict(result);
      close();
      return result;
    } catch (...) {
      fail(std::current_exception());
    }
  }

 private:
  [[nodiscard]] bool several() const noexcept { return _world.world_size > 1; }
  [[nodiscard]] int rank() const noexcept { return _world.rank; }
  [[nodiscard]] std::chrono::milliseconds control_timeout() const noexcept {
    return _rendezvous.timeout;
  }

  // ---- step 1: meet: the world, the device, the data plane's kind, the control plane ----
  void meet() {
    try {
      _world = resolve_world(_options);
      if (_options.nccl_communicator && _options.mpi_communicator) {
        throw Error(Errc::config,
                    "JobOptions: both mpi_communicator and nccl_communicator are set; hand in "
                    "the one to broadcast on");
      }
      check_destination(_options.load.destination, _world.world_size);
      const int ordinal = _options.nccl_communicator ? _options.nccl_communicator->cuda_device
                                                     : _world.local_rank;
      DeviceKind device_kind = _options.device;
      if (_options.nccl_communicator && device_kind == DeviceKind::automatic) {
        device_kind = DeviceKind::cuda;
      }
      try {
        _device = make_device(device_kind, ordinal);
      } catch (const Error& e) {
        // Alone, the message says which device setting failed; with several ranks it names
        // the rank (below), and LOCAL_RANK's GPU is in the device's own message.
        if (e.code() != Errc::unavailable || several()) throw;
        throw Error(e.code(), fmt::format("device: {}: {}", to_string(_options.device),
                                          e.what()));
      }
      _host = _device->name() == "host";
      TransportKind asked = _options.transport;
      if (_options.mpi_communicator && asked == TransportKind::automatic) {
        asked = TransportKind::mpi;
      }
      if (_options.nccl_communicator && asked == TransportKind::automatic) {
        asked = TransportKind::nccl;
      }
      // An MPI world: the caller handed MPI in, or mpirun (or MPI already initialised) is
      // there; elsewhere auto on host memory is tcp, which needs no MPI.
      const bool mpi_world =
          mpi_compiled_in() &&
          (_options.mpi_communicator || _options.mpi_source || mpi_world_present());
      _kind = resolve_transport(asked, _host, _world.world_size, mpi_world);
      _auto_tcp = asked == TransportKind::automatic && _kind == TransportKind::tcp;
      if (_options.mpi_communicator && _kind != TransportKind::mpi) {
        throw Error(Errc::config, "JobOptions::mpi_communicator is set, but the transport is " +
                                      std::string(to_string(_kind)) + " (set transport: mpi)");
      }
      if (_options.nccl_communicator && _kind != TransportKind::nccl) {
        throw Error(Errc::config, "JobOptions::nccl_communicator is set, but the transport is " +
                                      std::string(to_string(_kind)) + " (set transport: nccl)");
      }
      if (_kind == TransportKind::mpi && !mpi_compiled_in()) MpiSession{};  // "no MPI" (69)
      if (rank() == 0) {
        WEIGHTCAST_EXPECT(!_options.checkpoint.empty(), Errc::config,
                          "checkpoint: not set (JobOptions::checkpoint is empty on rank 0)");
      }
      _rendezvous = _options.rendezvous ? *_options.rendezvous
                                        : rendezvous_options(Config{}, _world);
      if (!_options.rendezvous) _rendezvous.timeout = _options.load.timeout;
      // A stop (the caller's Ctrl-C) ends a rendezvous that some rank never joins.
      _rendezvous.stop = _options.load.stop;
      if (_rendezvous.job_id.empty()) {
        _rendezvous.job_id = _world.job_id;
        _rendezvous.job_id_source = _world.job_id_source;
      }
      _control.emplace(_world, _rendezvous);
    } catch (const RemoteAbort& e) {
      _failure.report(e);
      throw;
    } catch (const Error& e) {
      const Error mine = prefixed(e, e.code());
      _failure.report(mine);
      throw mine;
    }
    if (several()) {
      _watchdog.emplace(*_control, _failure, rank());
      // Another rank's failure: stop this rank's load, and give the calling thread
      // `unwind_grace` to come back with it.
      _control->on_ending([this] {
        _stop.request_stop();
        // Reported now, not once the calling thread has unwound: a launcher that sees ranks
        // die (mpirun losing a node's daemon) ends the rest within a second (SIGTERM, then
        // SIGKILL), which may come while that thread is still inside an MPI call. A rank that
        // sent its own ABORT ends with its own failure, reported as it sent it.
        if (auto failure = _control->remote_failure(); failure && !_control->aborted()) {
          _failure.report(*failure);
        }
        _watchdog->remote_failure();
      });
    }
    // The caller's stop (LoadOptions::stop) stops the job's own.
    _caller_stop.emplace(_options.load.stop, [this] { _stop.request_stop(); });
    if (_options.on_control_plane) {
      try {
        _options.on_control_plane(&*_control);
        _control_plane_shown = true;
      } catch (...) {
        fail(std::current_exception());
      }
    }
  }

  // ---- step 1b: every rank runs the same load -------------------------------------------
  // Ranks meet in the order they reach rank 0's port: two loads started at once in each
  // process, in different orders, would pair one job's rank 0 with the other's peers and
  // deliver the wrong checkpoint's bytes without a word. Rank 0's identity goes out before it
  // opens anything; a rank that differs fails the job on every rank, naming both, and rank 0
  // waits for every rank's word before it goes on, so that the mismatch is the job's one
  // message (not a failure of rank 0's own that raced it).
  void agree_identity() {
    if (!several()) return;
    if (rank() == 0) {
      _control->share(_options.identity);
      _control->gather(RankReport{0, 0, 0, {}}, "word that it runs rank 0's load");
      return;
    }
    const std::string root = _control->share({});
    if (root.empty() || _options.identity.empty() || root == _options.identity) {
      _control->gather(RankReport{rank(), 0, 0, {}}, "word that it runs rank 0's load");
      return;
    }
    throw Error(Errc::config,
                fmt::format("this rank's load is not rank 0's: this rank loads {}, rank 0 loads "
                            "{}; every rank must make the same call, and one load on several "
                            "ranks at a time per process (loads started at once meet in the "
                            "order they reach rank 0)",
                            printable(_options.identity), printable(root)));
  }

  // ---- step 2: rank 0 has the catalogue, and every rank agrees the settings --------------
  Catalogue share_catalogue() {
    // Ranks other than 0 never touch the checkpoint path: they get the catalogue instead.
    Catalogue catalogue;
    if (rank() == 0) {
      catalogue = open_checkpoint(_options.checkpoint, _options.pieces);
      if (_options.on_catalogue) _options.on_catalogue(catalogue);
      if (_options.test_hooks.after_catalogue) _options.test_hooks.after_catalogue();
      if (several()) _control->share(encode_catalogue(catalogue));
    } else {
      if (_options.on_catalogue) _options.on_catalogue(Catalogue{});
      catalogue = decode_catalogue(_control->share({}), "catalogue from rank 0");
    }
    if (several()) {
      const std::string settings =
          shared_settings(_options.load.chunk_bytes,
                          planned_tensor_alignment(_options.load.tensor_alignment, _host), _host,
                          _kind, _options.verify);
      if (rank() == 0) {
        _control->share(settings);
      } else {
        check_shared_settings(settings, _control->share({}));
      }
    }
    return catalogue;
  }

  // ---- step 3: the plan's options ---------------------------------------------------------
  LoadOptions plan() {
    LoadOptions options = _options.load;
    options.tensor_alignment = planned_tensor_alignment(options.tensor_alignment, _host);
    options.stop = _stop.get_token();
    if (several()) {
      // The control plane's heartbeat carries this rank's progress, so that a stall's message
      // can say which rank is behind.
      options.on_progress = [this, inner = std::move(options.on_progress)](
                                const LoadProgress& p) {
        _control->note_progress(p.chunks_done);
        if (inner) inner(p);
      };
    }
    return options;
  }

  // Before the first collective, every rank says it is ready (it has the catalogue and agrees
  // the settings), and rank 0 answers once all have: a rank that failed so far has sent its
  // ABORT instead, and every rank then throws, none blocked in a collective that cannot be
  // unwound. Where the job initialises MPI itself, MPI_Init_thread waits for every rank
  // anyway (and a rank blocked there when another fails is ended: the failure model), so
  // the round trip is left out, as `weightcast run` always did.
  void confirm_ready() {
    if (!several()) return;
    const bool job_initialises_mpi = _kind == TransportKind::mpi && !_options.mpi_communicator &&
                                     !_options.mpi_source && !mpi_initialized();
    if (job_initialises_mpi) return;
    _control->gather(RankReport{rank(), 0, 0, {}}, "word that it is ready");
    if (rank() == 0) {
      _control->share("ready");
    } else {
      _control->share({});
    }
  }

  // ---- step 4: the transport --------------------------------------------------------------
  void open_transport() {
    switch (_kind) {
      case TransportKind::local:
      case TransportKind::automatic:
        _transport = make_local_transport();
        return;
      case TransportKind::mpi: {
        {
          // MPI_Init_thread and MPI_Comm_dup wait for every rank (Open MPI's modex) and take no
          // timeout: if a rank stalls there, the watchdog ends the job.
          Watchdog::Blocking blocking(
              *_watchdog, control_timeout(),
              _options.mpi_communicator || mpi_initialized() ? "MPI_Comm_dup" : "MPI_Init_thread");
          if (_options.mpi_communicator) {
            _mpi = std::make_unique<MpiSession>(*_options.mpi_communicator);
          } else if (_options.mpi_source) {
            _mpi = std::make_unique<MpiSession>(_options.mpi_source());
          } else {
            _mpi = std::make_unique<MpiSession>();
          }
          // MPI holds the launcher's PMIx client now: let go of the world's (find_root_host).
          if (_mpi->initialised_mpi()) release_root_host_query();
          if (_options.test_hooks.inside_mpi_open) _options.test_hooks.inside_mpi_open();
        }
        if (_mpi->rank() != rank() || _mpi->world_size() != _world.world_size) {
          // Where the config gave the world, the config is what disagrees with mpirun.
          const std::string hint =
              _world.source == WorldSource::config
                  ? fmt::format("remove world.rank and world.size from the config (mpirun's "
                                "environment gives each rank its place), or start {} ranks "
                                "with mpirun -np {} in that order",
                                _world.world_size, _world.world_size)
                  : fmt::format("launch with mpirun -np {} (weightcast launch does)",
                                _world.world_size);
          throw Error(Errc::unavailable,
                      fmt::format("transport mpi: MPI says rank {} of {}, but this is rank {} "
                                  "of {} ({}); {}",
                                  _mpi->rank(), _mpi->world_size(), rank(), _world.world_size,
                                  to_string(_world.source), hint));
        }
        {
          // Across nodes the transport splits the communicator by node (MPI_Comm_split_type,
          // MPI_Allreduce, MPI_Comm_split): collectives that take no timeout either.
          Watchdog::Blocking blocking(*_watchdog, control_timeout(),
                                      "MPI_Comm_split_type (the mpi transport's node split)");
          _transport = make_mpi_transport(*_mpi);
        }
        return;
      }
      case TransportKind::shm:
        open_node_ring();
        return;
      case TransportKind::nccl: {
        if (_options.nccl_communicator) {
          _transport = make_nccl_transport(*_options.nccl_communicator, _options.load.timeout);
          return;
        }
        // NCCL's bootstrap: rank 0's ncclUniqueId travels over the control plane (NCCL docs,
        // "Creating a communicator with options"), then every rank joins the communicator.
        NcclUniqueId id{};
        if (rank() == 0) {
          id = nccl_unique_id();
          _control->share(std::string(reinterpret_cast<const char*>(id.data()), id.size()));
        } else {
          const std::string bytes = _control->share({});
          WEIGHTCAST_EXPECT(bytes.size() == id.size(), Errc::unavailable,
                            fmt::format("the NCCL unique id from rank 0 has {} bytes, expected {}",
                                        bytes.size(), id.size()));
          std::memcpy(id.data(), bytes.data(), id.size());
        }
        _transport = make_nccl_transport(rank(), _world.world_size, _world.local_rank, id,
                                         _options.load.timeout);
        return;
      }
      case TransportKind::tcp:
        // transport: auto outside an MPI world: the node's ranks share one staging ring
        // where every rank runs on rank 0's node; tcp only where some do not.
        if (_auto_tcp && every_rank_on_root_node()) {
          _kind = TransportKind::shm;
          open_node_ring();
          return;
        }
        open_tcp();
        return;
    }
  }

  // Whether every rank runs on rank 0's node (host name and boot id, `detail::node_id`):
  // rank 0 shares its node, each rank says whether it is its own, and rank 0 shares the
  // verdict, so that every rank takes the same transport.
  bool every_rank_on_root_node() {
    const std::string here = detail::node_id();
    std::string root = here;
    if (rank() == 0) {
      _control->share(here);
    } else {
      root = _control->share({});
    }
    const std::vector<RankReport> said = _control->gather(
        RankReport{rank(), root == here ? 1U : 0U, 0, {}}, "word whether it runs on rank 0's node");
    if (rank() != 0) return _control->share({}) == "1";
    const bool all = std::all_of(said.begin(), said.end(),
                                 [](const RankReport& r) { return r.bytes == 1; });
    _control->share(all ? "1" : "0");
    return all;
  }

  // The tcp transport's connections: rank 0 listens on an ephemeral port of the address its
  // rendezvous listens on (every peer reaches it already), and shares the port with a fresh
  // secret over the control plane, which only ranks that showed the job token hear; each peer
  // dials it and shows the secret, so a stranger on the port is refused. With them goes where
  // each rank runs (its `detail::node_id`, gathered as a hash and numbered by rank 0), so that
  // a broadcast leaves rank 0's node once per other node (TcpNodes: the relay).
  void open_tcp() {
    constexpr std::size_t port_bytes = 2;
    constexpr std::size_t id_bytes = 8;
    const std::string here = detail::node_id();
    const std::vector<RankReport> said =
        _control->gather(RankReport{rank(), xxh3_64(here.data(), here.size()), 0, {}},
                         "word of which node it runs on");
    TcpNonce nonce{};
    TcpNodes nodes;
    if (rank() == 0) {
      TcpListener listener(_rendezvous.address);
      nonce = tcp_nonce();
      const TcpNonce relay_id = tcp_nonce();
      std::memcpy(&nodes.relay_id, relay_id.data(), sizeof nodes.relay_id);
      std::vector<std::uint64_t> seen;
      nodes.node.resize(static_cast<std::size_t>(_world.world_size));
      for (const RankReport& r : said) {
        const auto at = std::find(seen.begin(), seen.end(), r.bytes);
        nodes.node.at(static_cast<std::size_t>(r.rank)) = static_cast<int>(at - seen.begin());
        if (at == seen.end()) seen.push_back(r.bytes);
      }
      std::string bytes(port_bytes + nonce.size() + id_bytes + nodes.node.size() * 4, '\0');
      bytes[0] = static_cast<char>(listener.port() >> 8);
      bytes[1] = static_cast<char>(listener.port() & 0xff);
      std::memcpy(bytes.data() + port_bytes, nonce.data(), nonce.size());
      std::memcpy(bytes.data() + port_bytes + nonce.size(), &nodes.relay_id, id_bytes);
      for (std::size_t r = 0; r < nodes.node.size(); ++r) {
        const auto n = static_cast<std::uint32_t>(nodes.node[r]);
        std::memcpy(bytes.data() + port_bytes + nonce.size() + id_bytes + 4 * r, &n, 4);
      }
      _control->share(std::move(bytes));
      spdlog::debug("transport tcp: the ranks run on {} node(s)", seen.size());
      _transport = make_tcp_transport(std::move(listener), _world.world_size, nonce,
                                      _options.load.timeout, _stop.get_token(), nodes);
      return;
    }
    const std::string bytes = _control->share({});
    const std::size_t expected =
        port_bytes + nonce.size() + id_bytes + 4 * static_cast<std::size_t>(_world.world_size);
    WEIGHTCAST_EXPECT(bytes.size() == expected, Errc::unavailable,
                      fmt::format("transport tcp: rank 0's data port, secret and nodes came as "
                                  "{} bytes, expected {}",
                                  bytes.size(), expected));
    const auto port = static_cast<std::uint16_t>(
        (static_cast<unsigned char>(bytes[0]) << 8) | static_cast<unsigned char>(bytes[1]));
    std::memcpy(nonce.data(), bytes.data() + port_bytes, nonce.size());
    std::memcpy(&nodes.relay_id, bytes.data() + port_bytes + nonce.size(), id_bytes);
    nodes.node.resize(static_cast<std::size_t>(_world.world_size));
    for (std::size_t r = 0; r < nodes.node.size(); ++r) {
      std::uint32_t n = 0;
      std::memcpy(&n, bytes.data() + port_bytes + nonce.size() + id_bytes + 4 * r, 4);
      nodes.node[r] = static_cast<int>(n);
    }
    _transport = make_tcp_transport(rank(), _world.world_size, _rendezvous.address, port, nonce,
                                    _options.load.timeout, _stop.get_token(), nodes);
  }

  // A tcp connection lost mid-load is the transport's view of a rank that failed or died; the
  // control plane names that rank and its failure (its ABORT, or "lost" with the signal), so
  // give it a moment to arrive rather than spread the weaker message first. Bounded: the
  // control plane sees a dead peer's connection close as soon as the transport does.
  void await_remote_failure() {
    const auto until = Clock::now() + root_grace(control_timeout());
    while (!_control->remote_failure() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // `transport: shm`: rank 0 creates the node's staging ring (a memfd) and hands it to every
  // rank over an abstract Unix socket whose random name, with rank 0's node, travels over the
  // control plane; a rank on another node fails the job naming both nodes. Sized from the
  // agreed chunk_size and buffer_depth before the plan: a slot is a chunk plus room for
  // O_DIRECT's alignment (the read side refuses a shard whose alignment needs more).
  void open_node_ring() {
    const std::chrono::milliseconds timeout = control_timeout();
    if (rank() == 0) {
      const std::uint64_t slot_bytes = _options.load.chunk_bytes + 2 * node_ring_alignment;
      detail::NodeRing ring = detail::NodeRing::create(
          _options.load.buffer_depth, slot_bytes,
          static_cast<std::uint32_t>(_world.world_size - 1));
      detail::NodeRingServer server;
      _control->share(detail::node_id() + "\n" + server.name());
      server.serve(ring.fd(), _world.world_size - 1, timeout, _stop.get_token());
      _transport = detail::make_shm_transport(rank(), _world.world_size, std::move(ring));
      return;
    }
    const std::string shared = _control->share({});
    const std::size_t newline = shared.find('\n');
    WEIGHTCAST_EXPECT(newline != std::string::npos, Errc::unavailable,
                      "transport shm: rank 0 sent no node ring socket");
    const std::string root_node = shared.substr(0, newline);
    if (const std::string here = detail::node_id(); here != root_node) {
      throw Error(Errc::config,
                  fmt::format("transport: shm needs every rank on rank 0's node, but this rank "
                              "runs on {} and rank 0 on {}; use transport: mpi across nodes",
                              here, root_node));
    }
    detail::NodeRing ring = detail::NodeRing::map(
        detail::receive_node_ring(shared.substr(newline + 1), timeout, _stop.get_token()));
    _transport = detail::make_shm_transport(rank(), _world.world_size, std::move(ring));
  }

  // Room in a node ring slot for O_DIRECT's aligned superset of a chunk: up to one logical
  // block before it and one after (docs/DESIGN.md § Staging); 4 KiB covers the blocks of
  // the disks and file systems met so far.
  static constexpr std::uint64_t node_ring_alignment = 4096;

  // ---- step 4b: the placement: every rank's wants, checked on rank 0 -------------------
  // Each rank resolves its own wants (from its placement, or the caller's in-place
  // destinations), rank 0 checks them all against the catalogue and every rank gets them
  // back; null when every rank wants the whole checkpoint (one broadcast per chunk). Every
  // rank of several takes part, whatever its own placement, so that ranks whose configs
  // differ still meet at the same step.
  void agree_wants(const Catalogue& catalogue, LoadOptions& options) {
    const bool custom = static_cast<bool>(_options.wants);
    if (!several() && !custom && _options.placement.replicates_all()) return;
    RankWants mine = custom ? _options.wants(catalogue, rank(), _world.world_size)
                            : resolve_placement(_options.placement, catalogue, rank(),
                                                _world.world_size);
    if (several()) {
      _placement = agree_placement(*_control, catalogue, std::move(mine),
                                   _options.verify == Verify::digest);
    } else {
      auto placement = std::make_shared<LoadPlacement>();
      placement->all = {std::move(mine)};  // load() checks it against the catalogue
      placement->mine = placement->all.front();
      _placement = std::move(placement);
    }
    options.placement = _placement;
  }

  // ---- step 5: the load -------------------------------------------------------------------
  JobResult run_load(Catalogue catalogue, LoadOptions options) {
    JobResult result;
    result.world = _world;
    if (_options.on_load_start) _options.on_load_start();
    std::exception_ptr failure;
    try {
      result.load = load(std::move(catalogue), *_device, *_transport, options);
    } catch (...) {
      failure = std::current_exception();
    }
    if (_options.on_load_end) _options.on_load_end(failure);
    if (failure) std::rethrow_exception(failure);
    // A cuda arena is read back through a pinned bounce buffer: the verdict covers the bytes
    // that landed in GPU memory, not a host copy of them. Alone, there is nothing to compare.
    if (several() && _options.verify == Verify::digest) {
      const auto begin = Clock::now();
      result.digests =
          result.load.placed ? local_digests(result.load) : tensor_digests(result.load);
      result.digest_seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    }
    if (_options.test_hooks.before_report) _options.test_hooks.before_report(result.digests);
    if (_options.on_loaded) _options.on_loaded(result);
    return result;
  }

  // ---- step 6: the verdict ----------------------------------------------------------------
  void reach_verdict(JobResult& result) {
    if (!several()) {
      // A placed load counts what this rank asked for, not the checkpoint.
      const std::size_t tensors = result.load.placed ? result.load.wants.tensors.size()
                                                     : result.load.catalogue.tensors.size();
      result.verdict = Verdict{0, fmt::format("1 rank: {} loaded (nothing to compare)",
                                              detail::counted(tensors, "tensor"))};
    } else {
      RankReport report{rank(), result.load.stats.bytes, result.load.stats.seconds,
                        result.digests, result.load.self_expected_digests};
      Verdict verdict;
      if (rank() == 0) {
        verdict = _placement ? judge_placed(_control->gather(std::move(report)), *_placement,
                                            result.load.expected_digests, _options.verify,
                                            result.load.stats.node_reads == "local")
                             : judge(_control->gather(std::move(report)),
                                     result.load.catalogue, _options.verify,
                                     result.digest_seconds);
      } else {
        _control->gather(std::move(report));
      }
      result.verdict = _control->finish(std::move(verdict));
    }
    if (_options.on_verdict) _options.on_verdict(result);
    if (result.verdict.status != 0) {
      // The mismatch list is rank 0's to give; the others end with its status and say where
      // to look, so a job of N ranks does not print the list N times.
      throw RemoteAbort(errc_for_exit_status(result.verdict.status),
                        rank() == 0 ? "rank 0: " + result.verdict.message
                                    : fmt::format("rank {}: rank 0 found tensor mismatches "
                                                  "between the ranks (its message lists them)",
                                                  rank()));
    }
  }

  // ---- the end: every process ends, bounded ----------------------------------------------
  void close() {
    // The job has ended only once every process has: a rank stopped or hung from here on
    // would hold mpirun, or launch, forever. MPI_Finalize waits for every rank (Open MPI's
    // fence), so it is bounded like MPI_Init_thread; then rank 0 waits, as long again, for
    // the others to hang up, and fails (mpirun then ends them) if one does not.
    if (_options.test_hooks.after_verdict) _options.test_hooks.after_verdict();
    // nccl: ncclCommFinalize waits for every rank (bounded, 10 s, then ncclCommAbort), so
    // every rank shuts its transport down before rank 0 waits for the hang-ups below.
    _transport.reset();
    if (_mpi) {
      std::optional<Watchdog::Blocking> blocking;
      if (_watchdog) blocking.emplace(*_watchdog, control_timeout(), "MPI_Finalize");
      _mpi.reset();
    }
    _control->await_hangups(control_timeout());
    detach();
  }

  // Takes the job's hooks off the control plane, before it goes.
  void detach() noexcept {
    if (!_control) return;
    _control->on_ending({});
    if (_control_plane_shown && _options.on_control_plane) {
      _control_plane_shown = false;
      try {
        _options.on_control_plane(nullptr);
      } catch (...) {
      }
    }
  }

  // ---- failure: one message on every rank ----------------------------------------------
  [[nodiscard]] Error prefixed(const std::exception& e, Errc code) const {
    if (!several()) return Error(code, e.what());
    return Error(code, fmt::format("rank {}: {}", rank(), e.what()));
  }

  // The job failed on this rank with @p failure (after the ranks met): every rank learns it,
  // then the failure is thrown, or ends the process (FailurePolicy).
  [[noreturn]] void fail(std::exception_ptr failure) {
    if (_watchdog) _watchdog->unwinding();
    if (!several()) {
      // Alone: nobody to tell; the error is the caller's as it was thrown.
      try {
        std::rethrow_exception(failure);
      } catch (const Error& e) {
        _failure.report(e);
        detach();
        throw;
      } catch (...) {
        detach();
        throw;
      }
    }
    // Another rank's failure came first (this rank's own error, if any, followed from it:
    // its load was stopped), unless this rank has already sent its own.
    if (auto remote = _control->remote_failure(); remote && !_control->aborted()) {
      end_with(*remote, true);
    }
    try {
      std::rethrow_exception(failure);
    } catch (const RemoteAbort& e) {
      // Rank 0's verdict, which every rank has: nobody to tell.
      end_with(e, true);
    } catch (const Error& e) {
      Error mine = prefixed(e, e.code());
      if (dynamic_cast<const TcpConnectionLost*>(&e) != nullptr) {
        await_remote_failure();
        if (auto remote = _control->remote_failure(); remote && !_control->aborted()) {
          end_with(*remote, true);
        }
      }
      if (e.code() == Errc::timeout) {
        // A stall: rank 0, if it answers, names the rank behind it; else say what this rank
        // knows (whether rank 0 answers, the chunks landed).
        _control->defer_to_root(root_grace(control_timeout()));
        if (auto remote = _control->remote_failure()) end_with(*remote, true);
        mine = Error(Errc::timeout, fmt::format("{}; {}", mine.what(), _control->stall_report()));
      }
      spread(mine);
    } catch (const std::exception& e) {
      spread(prefixed(e, Errc::internal));
    } catch (...) {
      spread(Error(Errc::internal, fmt::format("rank {}: an unknown exception", rank())));
    }
  }

  // This rank's own failure: every rank is told, then the job ends with it.
  [[noreturn]] void spread(const Error& mine) {
    _control->abort(mine);
    _failure.report(mine);
    _control->linger(linger_most(control_timeout()));
    end_with(mine, false);
  }

  // The job ends on this rank with @p error: thrown, or the process ended where MPI was left
  // with a broadcast in flight and the policy says so.
  [[noreturn]] void end_with(const Error& error, bool remote) {
    _failure.report(error);
    // Rank 0 relayed another rank's failure: every rank hears it from rank 0 before rank 0
    // goes (a lost rank 0 would read as the cause).
    if (remote) _control->await_told();
    const bool mpi_left_in_flight = _mpi && _mpi->abandoned();
    // After a failure no MPI call is made (MPI_Finalize and MPI_Comm_free could wait for a
    // rank that is gone); the process that initialised MPI ends soon, and a caller's MPI
    // keeps a communicator it never sees.
    if (_mpi) _mpi->abandon();
    if (mpi_left_in_flight && _options.failure_policy == FailurePolicy::end_process) {
      _control->stop_reader(reader_stop_most);
      _failure.end_process(error);
    }
    detach();
    if (remote) throw RemoteAbort(error.code(), error.what());
    throw Error(error.code(), error.what());
  }

  const JobOptions& _options;
  FailureReport _failure;
  World _world;
  RendezvousOptions _rendezvous;
  std::unique_ptr<Device> _device;
  bool _host = true;
  TransportKind _kind = TransportKind::local;
  // transport: auto resolved to tcp (host memory, no MPI world): open_transport takes the
  // node ring instead where every rank is on rank 0's node.
  bool _auto_tcp = false;
  std::optional<ControlPlane> _control;
  std::shared_ptr<const LoadPlacement> _placement;  // null: every rank wants every tensor
  std::optional<Watchdog> _watchdog;  // after _control: gone before it
  std::stop_source _stop;             // the load's: the caller's stop, or another rank's failure
  std::optional<std::stop_callback<std::function<void()>>> _caller_stop;
  bool _control_plane_shown = false;
  std::unique_ptr<MpiSession> _mpi;
  std::unique_ptr<Transport> _transport;  // after _mpi: gone before it
};

}  // namespace

JobOptions JobOptions::from_config(const Config& config, const World& world) {
  JobOptions options;
  options.checkpoint = config.checkpoint;
  options.world = world;
  options.rendezvous = rendezvous_options(config, world);
  options.device = config.device;
  options.transport = config.transport;
  options.verify = config.verify;
  options.load = load_options(config);
  options.placement = config.placement;
  return options;
}

JobResult run_job(const JobOptions& options) {
  Job job(options);
  return job.run();
}

std::future<JobResult> run_job_async(JobOptions options) {
  return std::async(std::launch::async,
                    [options = std::move(options)] { return run_job(options); });
}

}  // namespace weightcast
