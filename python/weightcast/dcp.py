"""``weightcast.dcp``: a ``torch.distributed.checkpoint`` storage reader over weightcast.

``dcp.load(state_dict, storage_reader=weightcast.dcp.HuggingFaceStorageReader(path))`` loads a
safetensors checkpoint as torch's ``HuggingFaceStorageReader`` does, but rank 0 alone opens
the files and reads each byte once; every rank receives the boxes its DCP plan asks for, in
place. Importing this module imports torch. See docs/python.md, "DCP reader".
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from . import _dtypes, _landing, _options
from . import _weightcast as _core
from ._errors import CONFIG, INTERNAL, USAGE, Error

__all__ = ["HuggingFaceStorageReader"]


def _box_text(offsets: Any, lengths: Any) -> str:
    return f"offsets {list(offsets)}, lengths {list(lengths)}"


def _entry_text(entry: str, fqn: str) -> str:
    """A stored tensor in messages: "tensor 'w'", or "tensor 'w', piece 'w [piece at 4, 0]'"."""
    return f"tensor '{fqn}'" if entry == fqn else f"tensor '{fqn}', stored piece '{entry}'"


class HuggingFaceStorageReader(StorageReader):
    """Reads a safetensors checkpoint for ``dcp.load``, in place of torch's class of the same
    name: ``dcp.load(state_dict, storage_reader=HuggingFaceStorageReader(path))``.

    ``path`` is what ``weightcast.load`` takes (a ``.safetensors`` file, an index, or a
    directory with one index or exactly one ``.safetensors`` file), or a directory of tensor
    pieces as torch's ``HuggingFaceStorageWriter(save_distributed=True)`` writes it from
    several ranks (a file per rank, no index, each piece placed by the file's
    ``__metadata__`` ``DCP_SHARDING_INFO``; pieces that overlap or leave a hole raise
    ``Error`` 65), the same on every rank; rank 0 alone opens it. ``thread_count`` is torch's keyword, accepted (at least 1) and
    unused: rank 0 reads with weightcast's reader (``io_depth``). The other keywords are
    ``weightcast.load_into``'s, with its meaning and checks: ``device``, ``chunk_size``,
    ``buffer_depth``, ``io_depth``, ``direct_io``, ``timeout``, ``config``, ``progress``,
    ``reader``, ``verify``, ``rendezvous_port``, ``alone``; a bad value raises ``Error``
    (78; 64 for ``thread_count`` and ``alone``) here, before any load.

    On several ranks torch's default process group must be initialised, numbering the ranks
    as weightcast's world does (the launcher's environment): ``read_metadata`` sends rank 0's
    metadata over it (``Error`` 78 when the two worlds differ, 64 without a process group).

    Each rank's DCP plan must ask one box per stored tensor or piece (the offsets and
    lengths of its ``ReadItem`` in that piece): whole tensors, ``Shard(d)``, ``Replicate``
    and their products on a mesh of several dims (FSDP2 over tensor parallel too), in any
    layout whatever the layout the pieces were saved in (DCP's planner splits a local shard
    at the pieces' bounds). Two boxes of one stored tensor on one rank raise ``Error`` (64)
    naming the tensor and both boxes. A destination
    that is contiguous, on the load's device, in the checkpoint's dtype or one the receiver
    casts to (BF16/F16 -> FP32, FP32 -> BF16/F16, host) is written in place; any other
    lands in the checkpoint's dtype first and ``copy_`` writes it, as torch's reader does.

    Errors are ``weightcast.Error`` on every rank; DCP wraps them: ``dcp.load`` raises its
    ``CheckpointException``, whose ``failures`` hold each rank's exception (for a failure in
    ``read_metadata``, DCP's own ``AssertionError`` quoting weightcast's message).
    """

    def __init__(self, path: _options.PathLike, thread_count: int = 1, *, device: Any = None,
                 chunk_size: Any = None, buffer_depth: Any = None, io_depth: Any = None,
                 direct_io: Any = None, timeout: Any = None, config: Any = None,
                 progress: Any = None, reader: Any = None, verify: Any = None,
                 rendezvous_port: Any = None, alone: bool = False) -> None:
        if _options.integer(thread_count) is None or thread_count < 1:
            raise Error(f"HuggingFaceStorageReader: thread_count={thread_count!r} is not a "
                        "positive int", USAGE)
        if not isinstance(alone, bool):
            raise Error(f"alone: {alone!r} is not True or False", USAGE)
        _options.fs_path(path, "path")  # a TypeError for what is not a path, now
        self.path = path
        # Accepted for torch's signature; rank 0's reads are weightcast's (io_depth).
        self.thread_count = int(thread_count)
        self._options = _options.Options.of(
            config=config, chunk_size=chunk_size, buffer_depth=buffer_depth, io_depth=io_depth,
            direct_io=direct_io, timeout=timeout, reader=reader, verify=verify)
        self._port = _options.checked_port(rendezvous_port)
        self._device = device
        if device is not None or self._options.config is not None:
            # A bad device raises now.
            _landing.resolve_device(device, self._options,
                                    _options.world_of(self._options, alone))
        if not (progress is None or isinstance(progress, bool) or callable(progress)):
            raise Error(f"progress: {progress!r} is not None, True, False or a callable", CONFIG)
        self._progress = progress
        self._alone = alone
        self.load_id = uuid.uuid4().hex
        self.storage_data: dict[MetadataIndex, Any] = {}

    # --- StorageReader ---------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Points the reader at ``checkpoint_id`` when given; a new ``load_id``."""
        if checkpoint_id is not None:
            _options.fs_path(checkpoint_id, "checkpoint_id")
            self.path = checkpoint_id
        self.load_id = uuid.uuid4().hex

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        """True for any path: ranks other than 0 need not see the files."""
        return isinstance(checkpoint_id, (str, bytes, os.PathLike))

    def read_metadata(self) -> Metadata:  # type: ignore[override]
        """DCP's metadata from rank 0's catalogue (per tensor its dtype, global shape and one
        chunk covering it), broadcast to the other ranks; every rank calls it. Raises
        ``Error`` on every rank when rank 0 cannot open the checkpoint (66, 65, ...)."""
        # No **kwargs, as torch's HuggingFaceStorageReader: DCP retries a reader whose
        # read_metadata takes them with rank=, per rank and without collectives, which would
        # part the ranks.
        try:
            return self._read_metadata()
        except Error as e:
            raise _options.ranked(e, self._world_or_none()) from None

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self.storage_data = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The plan unchanged."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """The plans unchanged."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """One weightcast load on every rank (rank 0 reads, each rank receives its plan's
        boxes into ``planner.resolve_tensor(item)``, then ``planner.commit_tensor``); the
        future is done when it returns. Raises ``Error`` on every rank when any rank fails,
        within ``timeout``."""
        try:
            self._read_data(plan, planner)
        except Error as e:
            raise _options.ranked(e, self._world_or_none()) from None
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    # --- the world -------------------------------------------------------------------------

    def _world(self) -> dict:
        """The world of this read: torch's default process group where one is initialised
        (DCP exchanges plans over it; ``read_data`` takes rank 0's endpoint over it too), else
        weightcast's (the launcher's environment), which must then be a world of one. No
        collective here; a config whose ``world.*`` number the ranks otherwise raises 78."""
        world = _options.world_of(self._options, self._alone)
        if dist.is_available() and dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
            explicit = dict(_core.explicit_keys(self._options.settings))
            if self._alone or "world.rank" in explicit or "world.size" in explicit:
                if (rank, size) != (world["rank"], world["world_size"]):
                    raise Error(f"HuggingFaceStorageReader: torch.distributed's default "
                                f"process group says rank {rank} of {size}, weightcast's world "
                                f"says {world['describe']}: both must number the ranks alike",
                                CONFIG)
                return world
            return {"rank": rank, "world_size": size, "local_rank": world["local_rank"],
                    "source": "process_group",
                    "describe": f"rank {rank} of {size} from torch.distributed's default "
                                "process group"}
        if world["world_size"] > 1:
            raise Error(f"HuggingFaceStorageReader: {world['describe']}, but no "
                        "torch.distributed process group is initialised, over which DCP and "
                        "this reader exchange plans and metadata (init_process_group first, "
                        "or alone=True for a one-rank load)", USAGE)
        return world

    def _world_or_none(self) -> dict | None:
        try:
            return self._world()
        except Exception:
            return None

    # --- read_metadata ---------------------------------------------------------------------

    def _read_metadata(self) -> Metadata:
        # A rank whose own world is wrong still joins the broadcast (and raises after it), so
        # that no rank waits for one that left.
        problem: Error | None = None
        try:
            self._world()
        except Error as e:
            problem = e
        several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        reply: list[Any] = [None]
        if not several or dist.get_rank() == 0:
            if problem is not None:
                reply[0] = ("error", str(problem), problem.status)
            else:
                try:
                    reply[0] = ("tensors", self._catalogue_tensors())
                except Error as e:
                    if not several:
                        raise
                    reply[0] = ("error", str(e), e.status)
                except Exception as e:  # sent on as an Error, so no rank waits in vain
                    if not several:
                        raise
                    reply[0] = ("error", f"{type(e).__name__}: {e}", INTERNAL)
        if several:
            # DCP calls read_metadata on every rank, in the same order, so a broadcast over
            # its own process group reaches every rank; the others open no file.
            dist.broadcast_object_list(reply, src=0)
        if problem is not None:
            raise problem
        if reply[0][0] == "error":
            _, message, status = reply[0]
            raise Error(message if message.startswith("rank ") else f"rank 0: {message}",
                        status)
        tensors: list[tuple[str, str, list[int], list[tuple[str, list[int], list[int]]]]] = \
            reply[0][1]
        state: dict[str, TensorStorageMetadata] = {}
        storage: dict[MetadataIndex, Any] = {}
        for name, st_dtype, shape, chunks in tensors:
            state[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_dtypes.torch_dtype(st_dtype)),
                size=torch.Size(shape),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(offset), sizes=torch.Size(size))
                        for _, offset, size in chunks])
            # What read_data reads for a ReadItem: the catalogue entry holding that chunk.
            for entry, offset, _ in chunks:
                storage[MetadataIndex(fqn=name, offset=torch.Size(offset))] = (entry, st_dtype)
        metadata = Metadata(state_dict_metadata=state,  # type: ignore[arg-type]
                            storage_data=storage)
        metadata.storage_meta = StorageMeta(load_id=self.load_id)
        return metadata

    def _catalogue_tensors(self) -> list[tuple[str, str, list[int], list[tuple]]]:
        """Per tensor, first-seen order: (name, safetensors dtype, global shape as torch holds
        it, its chunks as (catalogue entry, offset, shape)). A tensor stored whole is one
        chunk at offset 0; one stored in pieces (torch's sharded save) is a chunk per piece."""
        catalogue = _core.open_checkpoint(_options.fs_path(self.path, "checkpoint"),
                                          pieces=True)
        pieces = catalogue.pieces
        out: dict[str, tuple[str, str, list[int], list[tuple]]] = {}
        for i, meta in enumerate(catalogue.tensors):
            _dtypes.check_shape(meta, catalogue.shards)
            _dtypes.check_representable(meta, "error")
            shape = list(_landing.checkpoint_shape(meta))
            if pieces and pieces[i]["tensor"] != meta["name"]:
                # A piece: its place and the whole tensor's shape, as the files give them
                # (byte-sized dtypes only, so torch's shape is the checkpoint's).
                name, offset, whole = (pieces[i]["tensor"], list(pieces[i]["offset"]),
                                       list(pieces[i]["global_shape"]))
            else:
                name, offset, whole = meta["name"], [0] * len(shape), shape
            out.setdefault(name, (name, meta["dtype"], whole, []))[3].append(
                (meta["name"], offset, shape))
        return list(out.values())

    # --- read_data -------------------------------------------------------------------------

    def _read_data(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        # First, before any check that can raise on one rank: the process group's exchange
        # (rank 0's endpoint and token), which every rank must join (read_metadata checked
        # the worlds on every rank already).
        options, world = _options.resolve_world(self._options, group=None, alone=self._alone,
                                                port_given=self._port is not None)
        # One box per catalogue entry per rank: the library's want (a local shard) is one box.
        # DCP's planner asks a box per stored chunk it overlaps, so a tensor in pieces is a
        # want per piece, each box in that piece's own coordinates.
        items: dict[str, Any] = {}
        for item in plan.items:
            fqn = item.storage_index.fqn
            if item.type != LoadItemType.TENSOR:
                raise Error(f"HuggingFaceStorageReader: '{fqn}' is asked as {item.type.name}; "
                            "a safetensors checkpoint holds tensors only", USAGE)
            stored = self.storage_data.get(item.storage_index)
            if not isinstance(stored, tuple):
                raise Error(f"HuggingFaceStorageReader: rank {world['rank']} asks tensor "
                            f"'{fqn}' at chunk offset {list(item.storage_index.offset or [])}, "
                            "which this reader's metadata does not hold (a plan made from "
                            "another reader's metadata?)", USAGE)
            entry = stored[0]
            if entry in items:
                first = _box_text(items[entry].storage_offsets, items[entry].lengths)
                raise Error(f"HuggingFaceStorageReader: rank {world['rank']} asks "
                            f"{_entry_text(entry, fqn)} in two boxes ({first}; "
                            f"{_box_text(item.storage_offsets, item.lengths)}): weightcast "
                            "delivers one box of a stored tensor per rank until general boxes "
                            "land", USAGE)
            items[entry] = item
        targets = {entry: planner.resolve_tensor(item).detach() for entry, item in items.items()}

        dev = _landing.load_device(self._device, options, world, targets.values())

        state: dict[str, Any] = {}

        def wants_for(catalogue: Any, rank: int, world_size: int) -> list[tuple]:
            metas = {m["name"]: m for m in catalogue.tensors}
            wants: list[tuple] = []
            staged: list[tuple] = []
            for entry, item in items.items():
                fqn = item.storage_index.fqn
                meta = metas.get(entry)
                if meta is None:
                    raise Error(f"HuggingFaceStorageReader: rank {rank} asks "
                                f"{_entry_text(entry, fqn)}, which the checkpoint lacks", USAGE)
                box = _box_text(item.storage_offsets, item.lengths)
                target = targets[entry]
                if tuple(target.shape) != tuple(item.lengths):
                    raise Error(f"HuggingFaceStorageReader: rank {rank}: "
                                f"{_entry_text(entry, fqn)}, box {box}: the planner's "
                                f"destination has shape {list(target.shape)}", USAGE)
                dest, cast, is_staged = _landing.land(meta["dtype"], target, dev)
                if is_staged:
                    staged.append((target, dest))
                wants.append(_landing.want(entry, meta["dtype"],
                                           (item.storage_offsets, item.lengths), dest, dev,
                                           cast))
            state["staged"] = staged
            return wants

        _options.run_job(self.path, options, device=dev, placement=None,
                         rendezvous_port=self._port, plan=wants_for,
                         progress=self._progress, rank=world["rank"],
                         alone=bool(self._alone), pieces=True)
        _landing.copy_staged(state.pop("staged", []), dev)
        for entry, item in items.items():
            planner.commit_tensor(item, targets[entry])
