"""The world from torch.distributed: where a process group is initialised, it is the world a
load means (docs/python.md, "Several ranks"). Processes that ``torch.multiprocessing`` started
(``mp.spawn``, Lightning, notebook launchers) have a process group and no launcher variables;
under torchrun both say the same. One ``all_gather_object`` over the group tells every rank
its rank and size (the group's), which ranks share a node (host name and boot id), and rank
0's rendezvous endpoint and a fresh job token, so no environment variable and no fixed port
are needed."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any

from ._errors import CONFIG, USAGE, Error

# The keys this module sets over the config's (only where the config leaves them unset).
WORLD_KEYS = ("world.rank", "world.size", "world.local_rank")


@dataclass(frozen=True)
class TorchWorld:
    """This process's place in a torch process group, and where its rank 0 listens.

    Attributes:
        rank: the group's rank of this process (``dist.get_rank(group)``), 0 reads the files.
        world_size: the group's size.
        local_rank: this rank's index among the group's ranks on its node (same host name and
            boot id), counted in group rank order; the launcher's ``LOCAL_RANK`` where set.
        node_ranks: how many of the group's ranks share rank 0's node.
        nodes: how many nodes the group spans.
        address: where rank 0 listens: None to leave it to the config (``rendezvous.address``,
            else ``$MASTER_ADDR``); "127.0.0.1" when every rank shares rank 0's node; else an
            address of rank 0's host that rank 0 found (its name's, else its route's).
        port: rank 0's rendezvous port, free on rank 0 when it looked; None when the config or
            the ``rendezvous_port`` keyword names one.
        token: the job token rank 0 drew (32 hex digits), or None where the config (or
            ``$WEIGHTCAST_TOKEN``) gives one.
        backend: the group's backend ("gloo", "nccl"), for messages.
    """

    rank: int
    world_size: int
    local_rank: int
    node_ranks: int
    nodes: int
    address: str | None
    port: int | None
    token: str | None
    backend: str

    def overrides(self, explicit: dict[str, str]) -> dict[str, str]:
        """The config keys this world sets: those the config (``explicit``: key -> where it was
        set) leaves unset; ``world.rank``/``world.size`` only after ``check_config``."""
        out = {"world.rank": str(self.rank), "world.size": str(self.world_size)}
        if "world.local_rank" not in explicit:
            out["world.local_rank"] = str(self.local_rank)
        if self.address is not None:
            out["rendezvous.address"] = self.address
        if self.port is not None:
            out["rendezvous.port"] = str(self.port)
        if self.token is not None:
            out["rendezvous.token"] = self.token
        return out

    def check_config(self, config_world: dict, explicit: dict[str, str]) -> None:
        """A config that sets ``world.rank``/``world.size`` must number the ranks as the group
        does: else ``Error`` 78 naming both (every rank sees its own config, so every rank
        whose config disagrees raises)."""
        if "world.rank" not in explicit and "world.size" not in explicit:
            return
        if (config_world["rank"], config_world["world_size"]) != (self.rank, self.world_size):
            where = explicit.get("world.rank") or explicit.get("world.size")
            raise Error(f"the config ({where}) says {config_world['describe']}, but "
                        f"torch.distributed's {self.backend} process group says rank "
                        f"{self.rank} of {self.world_size}: both must number the ranks alike "
                        "(remove world.rank and world.size from the config: the process group "
                        "is the world)", CONFIG)


def _node_id() -> str:
    """This host's name and boot: two containers with one host name on two machines differ
    by boot id; the processes of one machine share both."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _free_port() -> int:
    """A TCP port free on every IPv4 address of this host now (the kernel's pick for port 0
    on the wildcard address), so free on whichever address rank 0 binds moments later; a
    process taking it meanwhile makes rank 0 fail with "Address already in use" (69), never
    a wrong peer (the token)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _routable_address(store: Any) -> str | None:
    """An address of this host other nodes can reach: its name's, unless that is loopback
    (Debian maps the host name to 127.0.1.1), else the source of its route to the group's
    TCPStore host (which every rank reached to form the group)."""
    try:
        address = socket.gethostbyname(socket.gethostname())
        if not address.startswith("127."):
            return address
    except OSError:
        pass
    host = getattr(store, "host", None)
    if not host:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # UDP: picks the route, sends nothing
            address = s.getsockname()[0]
            return None if address.startswith("127.") else address
    except OSError:
        return None


def _tcp_store(group: Any) -> Any:
    try:
        from torch.distributed import distributed_c10d as c10d
        store = c10d._get_default_store() if group is None else None
        return store if type(store).__name__ == "TCPStore" else None
    except Exception:
        return None


def of_group(group: Any, alone: object, explicit: dict[str, str], port_given: bool) -> \
        TorchWorld | None:
    """The world of ``group`` (None: the default process group), or None where there is no
    process group (not initialised, or ``alone``). Every rank of the group must call it at the
    same point, as any collective (``load``, ``load_into`` and the DCP reader's ``read_data``
    are called on every rank): it runs one ``all_gather_object`` over the group.

    ``explicit``: the config's keys that were set (key -> where). ``port_given``: the caller
    named a rendezvous port (the ``rendezvous_port`` keyword).

    Raises:
        Error: 64 when ``group`` is given but torch.distributed is not initialised, or this
            process is not in it.
    """
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None  # type: ignore[assignment]
    initialised = dist is not None and dist.is_available() and dist.is_initialized()
    if alone is True:
        return None
    if not initialised:
        if group is not None:
            raise Error("group: a process group was given, but torch.distributed is not "
                        "initialised (init_process_group first)", USAGE)
        return None
    if group is not None and dist.get_rank(group) < 0:
        raise Error("group: this process is not a member of the process group given", USAGE)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    backend = str(dist.get_backend(group))
    launcher_local = os.environ.get("LOCAL_RANK")
    mine: dict[str, Any] = {"node": _node_id()}
    if rank == 0:
        # Rank 0 draws what every rank needs before any rank connects.
        if "rendezvous.token" not in explicit and not os.environ.get("WEIGHTCAST_TOKEN"):
            mine["token"] = secrets.token_hex(16)
        mine["routable"] = _routable_address(_tcp_store(group))
        if not port_given and "rendezvous.port" not in explicit:
            try:
                mine["port"] = _free_port()
            except OSError as e:
                mine["port"] = str(e)
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, mine, group=group)
    root_node = gathered[0]["node"]
    same = [g["node"] == mine["node"] for g in gathered]
    node_ranks = sum(1 for g in gathered if g["node"] == root_node)
    nodes = len({g["node"] for g in gathered})
    local_rank = sum(1 for r in range(rank) if same[r])
    if launcher_local is not None and launcher_local.isdigit():
        local_rank = int(launcher_local)
    address: str | None = None
    if "rendezvous.address" not in explicit:
        if nodes == 1:
            address = "127.0.0.1"
        elif not os.environ.get("MASTER_ADDR"):
            address = gathered[0].get("routable")
            if address is None:
                # Every rank raises alike: each sees rank 0's empty answer.
                raise Error(f"rank 0 of torch.distributed's {backend} process group runs on "
                            f"another node than {size - node_ranks} of its {size} ranks and "
                            "has no address other nodes can reach (its host name resolves to "
                            "loopback): set rendezvous.address (or MASTER_ADDR) to rank 0's "
                            "routable address", CONFIG)
    port = gathered[0].get("port")
    if isinstance(port, str):
        raise Error(f"rank 0: cannot find a free TCP port to listen on: {port}", CONFIG)
    return TorchWorld(rank=rank, world_size=size, local_rank=local_rank, node_ranks=node_ranks,
                      nodes=nodes, address=address, port=port, token=gathered[0].get("token"),
                      backend=backend)

