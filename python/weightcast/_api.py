"""``weightcast.load`` and ``weightcast.load_into``: the torch-facing API over the C++ core."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Tuple, Union

from . import _dtypes, _landing, _progress
from . import _weightcast as _core
from ._async import LoadHandle
from ._errors import CONFIG, INVALID_CHECKPOINT, USAGE, Error
from ._options import (PROGRESS_INTERVAL_S, Options, PathLike, caller_stream, check_placement,
                       check_progress, checked_port, fs_path, own_world, progress_hook, ranked,
                       resolve_world, run_job, running_on_several_ranks,
                       stream_handle)

if TYPE_CHECKING:
    import torch

KeyMap = Union[str, Mapping[str, str], Callable[[str], Union[str, None]], None]

# Messages list at most this many keys of one kind, then the count of the rest.
_MAX_KEYS_SHOWN = 10


def _tensors(result: Any) -> dict[str, torch.Tensor]:
    return {name: _dtypes.as_torch(tensor, st_dtype, shape)
            for name, st_dtype, tensor, shape in result.tensors()}


def _check_catalogue(catalogue: Any, unsupported_dtypes: str) -> None:
    for meta in catalogue.tensors:
        _dtypes.check_shape(meta, catalogue.shards)
        _dtypes.check_representable(meta, unsupported_dtypes)


def load(
    checkpoint: PathLike,
    *,
    device: str | int | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    placement: str | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[_progress.Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    unsupported_dtypes: str = "error",
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors checkpoint, on this rank or on every rank.

    Where torch.distributed is initialised, its process group (``group``, else the default
    one) is the world, however the processes were started (torchrun, ``mp.spawn``, mpirun);
    else the launcher's (the world as ``weightcast run`` detects it: the config's
    ``world.*``, else ``RANK``/``WORLD_SIZE``, Slurm's or Open MPI's variables). Every rank
    calls it: rank 0 alone needs the checkpoint and reads it, and the tensors reach the other
    ranks over MPI (host memory, under mpirun), the node's shared ring or TCP (host memory,
    no MPI: one node or several) or NCCL (CUDA); on rank 0's node, where the files are in the
    page cache and every rank there can open them, each rank reads its own boxes itself. A failure on any rank raises ``Error`` on
    every rank, its message naming the rank ("rank 2: ..."). Every rank must make the same
    call, naming the same checkpoint; loads on several ranks run one at a time per process.

    Args:
        checkpoint: a ``.safetensors`` file, a ``*.safetensors.index.json``, or a directory
            holding one index or exactly one ``.safetensors`` file (transformers'
            ``save_pretrained`` layout). A str, bytes or ``os.PathLike``; a file name that is
            not UTF-8 (bytes, or a str with surrogate escapes as ``os.listdir`` gives it)
            opens too. Another type raises TypeError. On several ranks every rank names the
            checkpoint as rank 0 does (the path as given, lexically normalised: ``"./a/"`` is
            ``"a"``; never opened but on rank 0): a rank naming another raises 78 on every
            rank, naming that rank's path and rank 0's, before rank 0 opens anything.
        device: where the tensors live: ``"cpu"`` (the default without ``config``),
            ``"cuda"`` (one rank: torch's current device; several ranks: the local rank's
            GPU, ``cuda:0`` when the process sees one device, as docs/gpu.md's rule; where
            torch's current device is another GPU it raises ``Error`` 78 naming the rank,
            both devices and the ``torch.cuda.set_device`` call to make), ``"cuda:N"``, an
            int ``N`` (the same as ``"cuda:N"``, as torch and safetensors read an int), a
            ``torch.device``, or ``"auto"`` (a GPU when this build has CUDA and one is
            visible, else cpu).
            With ``config`` and no ``device``, the config's ``device`` key decides.
        chunk_size: bytes per chunk, an int (anything ``operator.index`` takes, e.g. a
            numpy integer) or a size string (``"16MiB"``); 1 B to 4 GiB.
        buffer_depth: staging slots (1 to 1024, an int as for chunk_size); host memory is
            chunk_size × buffer_depth.
        io_depth: reads in flight (1 to 4096, an int as for chunk_size).
        direct_io: O_DIRECT reads: ``"auto"`` (buffered for a shard in the page cache or on a
            filesystem that refuses O_DIRECT), ``"on"``/True, ``"off"``/False.
        timeout: the longest any stage may make no progress: seconds, a ``timedelta`` or a
            duration string (``"300s"``); default 300 s; counted in whole milliseconds.
            NaN, infinite, zero, negative or under 0.001 seconds raise (78). On several ranks
            it also bounds the rendezvous: a rank that never calls is named ("rank(s) 1-2
            did not join", 75) within it.
        placement: ``"replicate"`` (every rank gets every tensor whole) or ``"fsdp"`` (each
            rank gets its ``Shard(0)`` local shard, ``torch.chunk``'s split, of every tensor
            of at least one dimension); at world size 1 both give whole tensors.
        config: a weightcast YAML config (configs/default.yaml); keywords given here override
            its keys.
        progress: None (default): a one-line bar on stderr on rank 0 when stderr is a
            terminal, silent otherwise; True/False forces it on/off; a callable receives a
            ``Progress`` at most every 0.1 s and after the last chunk, on a thread of its
            own: the load never waits for it, and updates that come while it runs are
            dropped but the latest (the last chunk's arrives before the call returns). One
            that raises is reported as unraisable and dropped. Anything else raises (78).
        reader: ``"auto"`` (io_uring, else a pread pool with a notice), ``"uring"``,
            ``"pread"``.
        verify: on several ranks, whether each rank hashes what it received (XXH3-64, as the
            bytes land) and rank 0 checks every digest against its own of the bytes it read,
            raising (70) on every rank, naming rank and tensor, where one differs. Default: the
            config's ``verify`` (``digest``, i.e. True). False skips the hashing
            (bench/RESULTS.md measures what it costs). ``LoadReport.verdict`` says which ran.
            Unused at world size 1. Exactly a Python bool: anything else (``"none"``, 1,
            ``numpy.True_``) raises (78).
        rendezvous_port: rank 0's TCP port where the ranks meet (1 to 65535); default the
            config's ``rendezvous.port``, 29555. Unused at world size 1. Rank 0's address is
            ``$MASTER_ADDR``, else 127.0.0.1 (or the config's ``rendezvous.address``). An int
            as for chunk_size.
        alone: True loads on this process only, as a world of one rank, whatever the
            launcher's environment says (e.g. rank 0 alone under mpirun, for an evaluation):
            no rendezvous, no MPI. Default False. Anything but a bool raises (64).
        group: the torch.distributed process group whose ranks load together (None: the
            default group, where one is initialised). Its rank and size are the world's; one
            ``all_gather_object`` over it tells which ranks share a node and carries rank 0's
            rendezvous endpoint (127.0.0.1 on one node; else ``rendezvous.address``,
            ``$MASTER_ADDR`` or an address of rank 0's host) and port (one free on rank 0,
            unless ``rendezvous_port`` or the config names one) and a job token rank 0 draws;
            no launcher variable is needed. A config whose ``world.rank``/``world.size``
            number the ranks otherwise raises 78. Given without an initialised
            torch.distributed: 64.
        unsupported_dtypes: ``"error"`` (default): a dtype torch has no dtype for (F6_E2M3,
            F6_E3M2; F8_E8M0 or F4 on a torch without float8_e8m0fnu/float4_e2m1fn_x2; F4 with
            an odd last dimension) raises before any byte is read, as
            ``safetensors.torch.load_file`` refuses it; ``"bytes"``: such a tensor comes as a
            1-D uint8 tensor of its raw bytes.

    Returns:
        Every tensor by name, in file order: zero-copy views of one arena, with the
        checkpoint's dtype and shape (F4 as ``float4_e2m1fn_x2`` with the last dimension
        halved, as safetensors does), contiguous. The arena is freed when the last tensor
        viewing it is. On CUDA the data is complete, on every stream, when the call returns.
        On several ranks with ``placement="fsdp"``: this rank's local shard of each tensor
        (its ``Shard(0)`` rows; shape ``[0, ...]`` where it has none), by name.

    Raises:
        Error: 66 when the checkpoint or a shard does not exist; 65 when it breaks the
            safetensors format (naming file, tensor and numbers) or holds a dtype torch cannot
            represent; 74 on a failed read; 75 when a stage stalls past ``timeout``; 78 for a
            bad keyword or config value (naming it); 69 when CUDA is asked for where the build
            or machine has none, a peer rank is lost, or host tensors on several ranks were
            not started by mpirun; 75 when a rank stalls (naming it) or did not join within
            ``timeout``; 78 on every rank when a rank names another checkpoint than rank 0;
            64 when this process is already running a load on several ranks (from another
            thread). On several ranks every message starts with the rank it concerns.
        KeyboardInterrupt: Ctrl-C stops the load within moments (the GIL is released while it
            runs; signal handlers run every 50 ms), also while rank 0 waits at the
            rendezvous for ranks that never come.
    """
    import torch  # noqa: F401  (the result is torch tensors; fail early without torch)

    try:
        work, _, several = _load(checkpoint, device=device, chunk_size=chunk_size,
                           buffer_depth=buffer_depth, io_depth=io_depth, direct_io=direct_io,
                           timeout=timeout, placement=placement, config=config,
                           progress=progress, reader=reader, verify=verify,
                           unsupported_dtypes=unsupported_dtypes,
                           rendezvous_port=rendezvous_port, alone=alone, group=group,
                           handle=None)
        with running_on_several_ranks(several):
            return work()
    except Error as e:
        raise ranked(e, own_world(config, alone, group)) from None


# What _load and _load_into prepare on the caller's thread: (the load itself, which a
# blocking call runs at once and a LoadHandle on its thread; the load's device; whether it
# runs on several ranks).
_Prepared = Tuple[Callable[[], Any], Tuple[str, int], bool]


def _load(checkpoint: PathLike, *, device: Any, chunk_size: Any, buffer_depth: Any,
          io_depth: Any, direct_io: Any, timeout: Any, placement: Any, config: Any,
          progress: Any, reader: Any, verify: Any, unsupported_dtypes: Any,
          rendezvous_port: Any, alone: Any, group: Any,
          handle: LoadHandle | None) -> _Prepared:
    """Checks every keyword (raising here, on the caller's thread) and returns the load,
    which opens the checkpoint: a missing or malformed one raises when it runs."""
    if unsupported_dtypes not in ("error", "bytes"):
        raise Error(f"unsupported_dtypes: {unsupported_dtypes!r} is not 'error' or 'bytes'",
                    CONFIG)
    check_placement(placement)
    port = checked_port(rendezvous_port)
    options = Options.of(config=config, chunk_size=chunk_size, buffer_depth=buffer_depth,
                         io_depth=io_depth, direct_io=direct_io, timeout=timeout, reader=reader,
                         verify=verify)
    check_progress(progress)
    path = fs_path(checkpoint, "checkpoint")
    # On the caller's thread: the process group's exchange is a collective, ordered with
    # the caller's own (a background thread's would race them).
    options, world = resolve_world(options, group=group, alone=alone,
                                   port_given=port is not None)
    dev = _landing.resolve_device(device, options, world)
    if world["world_size"] > 1:
        # Every rank checks the catalogue rank 0 sends it, so a dtype torch cannot hold
        # raises on every rank before any byte moves.
        def plan(catalogue: Any, rank: int, world_size: int) -> None:
            _check_catalogue(catalogue, unsupported_dtypes)

        def several() -> dict[str, torch.Tensor]:
            result = run_job(checkpoint, options, device=dev, placement=placement,
                             rendezvous_port=port, plan=plan, progress=progress,
                             rank=world["rank"], alone=False, handle=handle)
            return _tensors(result)

        return several, dev, True

    def one() -> dict[str, torch.Tensor]:
        catalogue = _core.open_checkpoint(path)
        _check_catalogue(catalogue, unsupported_dtypes)
        hook = progress_hook(progress, world["rank"], None if handle is None else handle._record)
        with caller_stream(dev) as stream:
            result = _core.load(catalogue, dev[0], dev[1], options.settings, hook,
                                PROGRESS_INTERVAL_S, cuda_stream=stream_handle(stream),
                                cancel=None if handle is None else handle._cancel_request)
        return _tensors(result)

    return one, dev, False


@dataclass(frozen=True)
class LoadReport:
    """What ``load_into`` did, in ``load_state_dict``'s words (``missing_keys``,
    ``unexpected_keys``) plus what it loaded and measured.

    Attributes:
        missing_keys: destination keys no checkpoint tensor landed in (a tied key counts as
            loaded when any key of its tie group was).
        unexpected_keys: checkpoint keys (after ``key_map``) with no destination.
        loaded_keys: destination keys written, in checkpoint file order.
        cast_keys: loaded keys whose destination dtype differs from the checkpoint's (cast on
            landing).
        staged_keys: loaded keys that could not land in place (a cast the receiver does not
            make: F8 into FP32, F16 into BF16, any cast into CUDA memory; a strided
            destination; one on another device than the load's): they landed in a tensor of
            the checkpoint's dtype, which torch's ``copy_`` then wrote into the destination
            (so memory beyond the model for those only).
        bytes: bytes this rank received: its local shards, in the checkpoint's dtype.
        seconds: wall time of the load pipeline on this rank (files open to last byte),
            seconds.
        verdict: rank 0's verdict, the same on every rank: ``"3 ranks, 31 local shards
            bit-exact (...)"`` (the local shards of every rank counted together) when every
            rank's digests matched rank 0's (``verify``, the default); ``"..., not compared
            (verify: none)"`` with ``verify=False``; ``"1 rank: 2 tensors loaded (nothing to
            compare)"`` at world size 1, whatever ``verify`` is (the tensors this call
            loaded). A mismatch raises instead (70).
    """

    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    loaded_keys: list[str] = field(default_factory=list)
    cast_keys: list[str] = field(default_factory=list)
    staged_keys: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    verdict: str = ""


def _key_mapper(key_map: KeyMap) -> Callable[[str], str | None]:
    if key_map is None:
        return lambda key: key
    if isinstance(key_map, str):
        prefix = key_map
        return lambda key: key[len(prefix):] if key.startswith(prefix) else key
    if isinstance(key_map, Mapping):
        table = dict(key_map)
        return lambda key: table.get(key, key)
    if callable(key_map):
        return key_map
    raise Error(f"key_map: {type(key_map).__name__} is not a prefix str, a dict or a callable",
                USAGE)


def _shown(keys: list[str]) -> str:
    text = ", ".join(f'"{k}"' for k in keys[:_MAX_KEYS_SHOWN])
    return text + (f" and {len(keys) - _MAX_KEYS_SHOWN} more" if len(keys) > _MAX_KEYS_SHOWN
                   else "")


def _tie_groups(target: Mapping[str, Any]) -> list[list[str]]:
    """Keys whose tensors are one and the same memory (tied weights), in state_dict order."""
    groups: dict[tuple, list[str]] = {}
    for key, t in target.items():
        if t.numel() == 0 or t.device.type == "meta":
            ident: tuple = ("own", key)
        else:
            ident = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(),
                     tuple(t.shape), t.stride(), t.dtype)
        groups.setdefault(ident, []).append(key)
    return list(groups.values())


@dataclass(frozen=True)
class _LocalShard:
    """What one rank receives of one destination: the slice ``offset``/``shape`` of the
    global tensor (torch DTensor's ``compute_local_shape_and_global_offset``), landing in
    ``local`` (a plain tensor itself, a DTensor's ``to_local()``). This is the placement
    library's per-tensor want (a local slice, a destination, its capacity and dtype)."""

    local: Any
    offset: tuple[int, ...]
    shape: tuple[int, ...]


def _local_shard(owner: str, key: str, t: Any) -> _LocalShard:
    if type(t).__name__ != "DTensor":
        return _LocalShard(t, (0,) * t.dim(), tuple(t.shape))
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    strided = False
    for p in t.placements:
        if type(p).__name__ == "_StridedShard":
            strided = True
        elif type(p) not in (Shard, Replicate):
            raise Error(f"load_into: {owner} key '{key}' is a DTensor placed {p}: only Shard(d), "
                        "Replicate() and strided shards are loaded (a Partial has no "
                        "checkpoint slice)", USAGE)
    # The box DCP reads into (torch.distributed.checkpoint's planner uses the same function).
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if strided and not _strided_box_is_exact(t, tuple(offset), tuple(shape)):
        raise Error(f"load_into: {owner} key '{key}' is a DTensor placed "
                    f"{tuple(t.placements)}: this rank's local shard is not one box of the "
                    "global tensor (its strided shard's rows interleave with other ranks'), "
                    "which weightcast cannot land; FSDP2 over tensor parallel, "
                    "(_StridedShard(d), Shard(d)), is one box and loads", USAGE)
    local = t.to_local()
    if local.device.type == "meta":
        raise Error(f"load_into: {owner} key '{key}' is on the meta device, which holds no "
                    "memory to load into; call model.to_empty(device=...) first", USAGE)
    if tuple(local.shape) != tuple(shape):
        raise Error(f"load_into: {owner} key '{key}': the DTensor's local tensor has shape "
                    f"{list(local.shape)}, its placements give {list(shape)}", INVALID_CHECKPOINT)
    return _LocalShard(local, tuple(offset), tuple(shape))


def _strided_box_is_exact(t: Any, offset: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a DTensor with a ``_StridedShard`` holds exactly the box (@p offset, @p shape) of
    the global tensor. torch's ``compute_local_shape_and_global_offset`` gives a strided
    shard's first index only; this follows DTensor's own split (each placement's
    ``local_shard_size_and_offset``, left to right, as that function does) to every index of
    each sharded dim and checks they run without a gap. False where torch offers no such
    method (another torch version): the load is refused rather than guessed."""
    import torch
    from torch.distributed.tensor import Shard

    try:
        from torch.distributed.tensor.placement_types import (_StridedShard,
                                                              _StridedShardOffsetMode)

        mesh = t.device_mesh
        coordinate = mesh.get_coordinate()
        sizes = list(t.shape)
        index: dict[int, Any] = {}
        for mesh_dim, p in enumerate(t.placements):
            if isinstance(p, _StridedShard):
                size, offsets = p.local_shard_size_and_offset(
                    sizes[p.dim], mesh.size(mesh_dim), coordinate[mesh_dim],
                    _StridedShardOffsetMode.ALL)
                local = torch.tensor(list(offsets)[:size] if size else [], dtype=torch.long)
            elif isinstance(p, Shard):
                size, first = Shard.local_shard_size_and_offset(
                    sizes[p.dim], mesh.size(mesh_dim), coordinate[mesh_dim])
                local = torch.arange(first, first + size)
            else:
                continue
            index[p.dim] = local if p.dim not in index else index[p.dim][local]
            sizes[p.dim] = size
    except (ImportError, AttributeError, TypeError, ValueError, IndexError):
        return False
    if tuple(sizes) != tuple(shape):
        return False
    return all(len(ix) == 0 or torch.equal(ix, torch.arange(offset[d], offset[d] + len(ix)))
               for d, ix in index.items())


def _check_writable(owner: str, key: str, t: Any) -> None:
    """Refuses, before any byte is read, a destination torch's ``copy_`` cannot write: one
    whose elements share memory (``expand``, stride 0) or an inference tensor outside
    inference mode. Otherwise the load would fail half-way, some tensors already written."""
    import torch

    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise Error(f"load_into: {owner} key '{key}' is an inference tensor (made under "
                    "torch.inference_mode()), which cannot be written outside inference mode; "
                    "clone() it, or call load_into under torch.inference_mode()", USAGE)
    # 1: elements overlap; 2: torch cannot tell cheaply (then copy_ allows it, and so do we).
    if t.numel() > 1 and torch._debug_has_internal_overlap(t) == 1:
        raise Error(f"load_into: {owner} key '{key}' has elements that share memory (shape "
                    f"{list(t.shape)}, strides {list(t.stride())}: an expand()ed tensor?), so "
                    "one checkpoint tensor cannot be written into it; clone() it first", USAGE)


def load_into(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    checkpoint: PathLike,
    *,
    strict: bool = True,
    key_map: KeyMap = None,
    device: str | int | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[_progress.Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> LoadReport:
    """Loads a checkpoint into the caller's own tensors, in place.

    The destinations are ``model.state_dict()`` (parameters and persistent buffers, written
    through the tensors it returns) or the mapping given. A plain tensor gets its whole
    checkpoint tensor; a DTensor (FSDP2 ``fully_shard``, tensor parallel) gets its local shard,
    from its device mesh and placements (``Shard(d)``, ``Replicate()``, and FSDP2 over tensor
    parallel's ``(_StridedShard(d), Shard(d))``: the box DCP reads into), written into
    ``to_local()``. Bytes land in the destinations themselves (no copy of the checkpoint
    beside the model); on several ranks every rank calls it, rank 0 alone reads, and each
    rank receives only its local shards. A dtype that differs is cast on landing between
    floating dtypes: BF16/F16 into FP32 and FP32 into BF16/F16 (round-to-nearest-even) by the
    receiver, the bytes travelling in the checkpoint's dtype, bit-exact with ``Tensor.to``
    but for NaN payloads (NaN stays NaN of its sign); other pairs (F8 into FP32, F16 into
    BF16) land in the checkpoint's dtype and ``copy_`` casts them. Tensors sharing memory
    (tied weights, ``lm_head.weight`` and ``embed_tokens.weight``) are one destination: the
    group is loaded when any of its keys is in the checkpoint. Every check runs before any
    byte is read.

    Args:
        model_or_state_dict: a ``torch.nn.Module`` or a mapping of key to ``torch.Tensor``;
            no tensor on the meta device (call ``model.to_empty(device=...)`` first).
        checkpoint: as for ``load``.
        strict: missing or unexpected keys raise (naming them), as ``load_state_dict(strict=
            True)``; with False they are only reported. A shape mismatch raises either way, as
            in torch. A bool: anything else raises (64) rather than being read as truthy.
        key_map: renames checkpoint keys to destination keys: a str is a prefix removed from
            the checkpoint keys that start with it (``"model."`` loads a ``LlamaForCausalLM``
            checkpoint into a bare ``LlamaModel``); a dict maps checkpoint key to destination
            key (others unchanged); a callable returns the destination key, or None to skip
            the tensor (not counted as unexpected). A destination key that is not a str
            raises (64), naming the checkpoint key.
        device: the arena's device (as for ``load``); default: the destinations' GPU when they
            all live on one, else cpu.
        chunk_size, buffer_depth, io_depth, direct_io, timeout, config, progress, reader,
            verify, rendezvous_port, alone, group: as for ``load``.

    Returns:
        A ``LoadReport``: missing_keys, unexpected_keys, loaded_keys, cast_keys, staged_keys,
        bytes, seconds, verdict.

    Raises:
        Error: 65 for a shape mismatch, a dtype that does not cast (integer or bool against
            floating), or (strict) missing/unexpected keys, naming the keys; 64 for a key
            that is not a str, a meta tensor, a key_map mapping two checkpoint keys to one
            destination, or a destination that is not a tensor, a DTensor placed ``Partial``
            or with a strided shard that is not one box of the global tensor, a destination
            ``copy_`` cannot write (elements sharing memory, as ``expand`` makes; an inference
            tensor outside inference mode), ``strict`` not a bool; and whatever ``load`` raises. On several ranks every check
            runs on every rank once rank 0 has sent the catalogue, so a refused load raises on
            every rank.
    """
    try:
        work, _, several = _load_into(model_or_state_dict, checkpoint, strict=strict,
                                key_map=key_map, device=device, chunk_size=chunk_size,
                                buffer_depth=buffer_depth, io_depth=io_depth,
                                direct_io=direct_io, timeout=timeout, config=config,
                                progress=progress, reader=reader, verify=verify,
                                rendezvous_port=rendezvous_port, alone=alone, group=group,
                           handle=None)
        with running_on_several_ranks(several):
            return work()
    except Error as e:
        raise ranked(e, own_world(config, alone, group)) from None


def _load_into(model_or_state_dict: Any, checkpoint: PathLike, *, strict: Any, key_map: Any,
               device: Any, chunk_size: Any, buffer_depth: Any, io_depth: Any,
               direct_io: Any, timeout: Any, config: Any, progress: Any, reader: Any,
               verify: Any, rendezvous_port: Any, alone: Any, group: Any,
               handle: LoadHandle | None) -> _Prepared:
    """Checks every keyword and destination (raising here, on the caller's thread) and
    returns the load; what needs the checkpoint's catalogue (keys, shapes, dtypes) raises
    when it runs."""
    import torch

    if not isinstance(strict, bool):
        raise Error(f"load_into: strict={strict!r} is not True or False", USAGE)
    if isinstance(model_or_state_dict, torch.nn.Module):
        target: Mapping[str, torch.Tensor] = model_or_state_dict.state_dict()
        owner = type(model_or_state_dict).__name__
    elif isinstance(model_or_state_dict, Mapping):
        target = model_or_state_dict
        owner = "state_dict"
    else:
        raise Error(f"load_into: {type(model_or_state_dict).__name__} is neither a "
                    "torch.nn.Module nor a mapping of str to torch.Tensor", USAGE)
    for key, t in target.items():
        if not isinstance(key, str):
            raise Error(f"load_into: {owner} has the key {key!r}, a {type(key).__name__}: "
                        "keys are str, as a state_dict's are (checkpoint tensor names are "
                        "str)", USAGE)
        if not isinstance(t, torch.Tensor):
            raise Error(f"load_into: {owner} key '{key}' holds a {type(t).__name__}, "
                        "not a torch.Tensor", USAGE)
        if t.device.type == "meta":
            raise Error(f"load_into: {owner} key '{key}' is on the meta device, which holds no "
                        "memory to load into; call model.to_empty(device=...) first", USAGE)

    options = Options.of(config=config, chunk_size=chunk_size, buffer_depth=buffer_depth,
                         io_depth=io_depth, direct_io=direct_io, timeout=timeout, reader=reader,
                         verify=verify)
    port = checked_port(rendezvous_port)
    options, world = resolve_world(options, group=group, alone=alone,
                                   port_given=port is not None)
    shards = {key: _local_shard(owner, key, t) for key, t in target.items()}
    for key, shard in shards.items():
        _check_writable(owner, key, shard.local)
    dev = _landing.load_device(device, options, world, (v.local for v in shards.values()))
    mapper = _key_mapper(key_map)
    ties = _tie_groups({k: v.local for k, v in shards.items()})
    state: dict[str, Any] = {}

    def plan(catalogue: Any, rank: int, world_size: int) -> list[tuple]:
        # Every rank, once rank 0 has sent the catalogue: the same checks on every rank, so a
        # refused load raises on every rank with the same keys, before any byte moves.
        try:
            routes, unexpected, missing, casts = _routes(owner, target, ties, catalogue,
                                                         mapper, strict)
            wants, staged = _wants(routes, shards, ties,
                                   {m["name"]: m for m in catalogue.tensors}, dev)
        except Error:
            raise
        except Exception as e:  # a key_map callable's own: this rank re-raises it below
            state["raised"] = e
            raise Error(f"load_into: key_map or a destination raised {type(e).__name__}: {e}",
                        USAGE) from e
        state.update(routes=routes, unexpected=unexpected, missing=missing, casts=casts,
                     staged=staged)
        return wants

    check_progress(progress)
    fs_path(checkpoint, "checkpoint")  # its type, now

    def run() -> LoadReport:
        try:
            result = run_job(checkpoint, options, device=dev, placement=None,
                             rendezvous_port=port, plan=plan, progress=progress,
                             rank=world["rank"], alone=alone, handle=handle)
        except Error:
            if "raised" in state:
                raise state.pop("raised") from None
            raise
        stats = result.stats
        staged = state.pop("staged")
        _landing.copy_staged(((local, landed) for _, local, landed in staged), dev)
        staged_keys = [key for key, _, _ in staged]
        del staged
        return LoadReport(missing_keys=state["missing"], unexpected_keys=state["unexpected"],
                          loaded_keys=list(state["routes"]), cast_keys=state["casts"],
                          staged_keys=staged_keys,
                          bytes=int(stats["bytes"]), seconds=float(stats["seconds"]),
                          verdict=result.verdict)

    return run, dev, world["world_size"] > 1


def _in_background(what: str, prepare: Callable[[LoadHandle], _Prepared], config: Any,
                   alone: Any, group: Any) -> LoadHandle:
    """Prepares a load with a new handle (a bad keyword raises here) and starts it on the
    handle's thread; its errors name the rank as the blocking call's do."""
    handle: LoadHandle = LoadHandle(what)
    try:
        work, dev, several = prepare(handle)
    except Error as e:
        raise ranked(e, own_world(config, alone, group)) from None

    def run() -> Any:
        try:
            return work()
        except Error as e:
            raise ranked(e, own_world(config, alone, group)) from None

    return handle._start(run, dev, several)


def load_async(
    checkpoint: PathLike,
    *,
    device: str | int | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    placement: str | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[_progress.Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    unsupported_dtypes: str = "error",
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> LoadHandle[dict[str, torch.Tensor]]:
    """Starts ``load`` in the background and returns its ``LoadHandle`` at once;
    ``handle.wait()`` returns the dict ``load`` would have returned.

    The same load as ``load`` (the same pipeline, keywords, checks, results and errors),
    run on a thread of the handle's own with the GIL released, so this thread can run other
    Python and torch work meanwhile (build the next model, warm up a kernel). A bad keyword
    raises here; whatever comes of the checkpoint (missing, malformed, a stall, a peer rank
    lost) raises from ``wait()``.

    On CUDA the load is ordered after the work queued so far on the caller's current stream
    (at this call), as ``load`` is; ``wait()`` returns once the data is complete on that
    stream, and makes the caller's current stream at ``wait()`` wait for it too.

    Loads on several ranks run one at a time per process, as for the blocking calls: a
    second one while a handle's load on several ranks is not done raises 64 here (and a
    blocking call on several ranks meanwhile raises 64 too). On one process loads may run
    side by side.

    Args:
        checkpoint, device, chunk_size, buffer_depth, io_depth, direct_io, timeout,
            placement, config, progress, reader, verify, unsupported_dtypes,
            rendezvous_port, alone, group: as for ``load`` (the process group's exchange
            runs here, on the calling thread, as the collective it is). ``progress`` runs as
            for ``load``;
            ``handle.progress`` has the latest update whatever it is.

    Returns:
        A ``LoadHandle``: ``done()``, ``wait(timeout=None)``, ``progress``, ``cancel()``.

    Raises:
        Error: 78 or 64 for a bad keyword, and 64 when a load on several ranks started by a
            handle is still running in this process; the load's own errors come from
            ``wait()``.
    """
    import torch  # noqa: F401  (the result is torch tensors; fail early without torch)

    return _in_background("load", lambda handle: _load(
        checkpoint, device=device, chunk_size=chunk_size, buffer_depth=buffer_depth,
        io_depth=io_depth, direct_io=direct_io, timeout=timeout, placement=placement,
        config=config, progress=progress, reader=reader, verify=verify,
        unsupported_dtypes=unsupported_dtypes, rendezvous_port=rendezvous_port, alone=alone,
        group=group, handle=handle), config, alone, group)


def load_into_async(
    model_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    checkpoint: PathLike,
    *,
    strict: bool = True,
    key_map: KeyMap = None,
    device: str | int | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[_progress.Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> LoadHandle[LoadReport]:
    """Starts ``load_into`` in the background and returns its ``LoadHandle`` at once;
    ``handle.wait()`` returns the ``LoadReport`` ``load_into`` would have returned.

    The same load as ``load_into``, run on a thread of the handle's own (see ``load_async``
    for the thread, CUDA streams and loads on several ranks). The destinations are taken
    now (``model.state_dict()`` at this call) and checked here (meta tensors, keys that are
    not str, tensors ``copy_`` cannot write: raised here); the checks against the checkpoint
    (missing and unexpected keys, shapes, dtypes) run once its catalogue is read and raise
    from ``wait()``, before any byte lands. Until ``wait()`` returns, the destinations are
    being written: reading them, or a forward pass, sees some bytes landed and some not;
    work that does not touch them (another model, the optimizer's setup, data loading) is
    what to run meanwhile.

    Args:
        model_or_state_dict, checkpoint, strict, key_map, device, chunk_size, buffer_depth,
            io_depth, direct_io, timeout, config, progress, reader, verify, rendezvous_port,
            alone, group: as for ``load_into``.

    Returns:
        A ``LoadHandle``: ``done()``, ``wait(timeout=None)``, ``progress``, ``cancel()``.

    Raises:
        Error: 64 for a bad destination (as ``load_into`` says) or, as for ``load_async``, a
            load on several ranks already running; 78 or 64 for a bad keyword. The load's
            own errors come from ``wait()``.
    """
    return _in_background("load_into", lambda handle: _load_into(
        model_or_state_dict, checkpoint, strict=strict, key_map=key_map, device=device,
        chunk_size=chunk_size, buffer_depth=buffer_depth, io_depth=io_depth,
        direct_io=direct_io, timeout=timeout, config=config, progress=progress, reader=reader,
        verify=verify, rendezvous_port=rendezvous_port, alone=alone, group=group,
        handle=handle), config, alone, group)


def _routes(owner: str, target: Mapping[str, Any], ties: list[list[str]], catalogue: Any,
            mapper: Callable[[str], str | None], strict: bool
            ) -> tuple[dict[str, str], list[str], list[str], list[str]]:
    """(routes: destination key -> checkpoint key in file order, unexpected, missing, casts),
    raising as ``load_state_dict`` does for shape mismatches and, under strict, for missing
    and unexpected keys."""
    metas = {m["name"]: m for m in catalogue.tensors}
    routes: dict[str, str] = {}
    unexpected: list[str] = []
    for name in metas:
        key = mapper(name)
        if key is None:
            continue  # the callable chose to skip it
        if not isinstance(key, str):
            raise Error(f"load_into: key_map maps checkpoint key '{name}' to {key!r}, which is "
                        "not a str (a callable may also return None to skip the tensor)", USAGE)
        if key in target:
            if key in routes:
                raise Error(f"load_into: key_map maps both '{routes[key]}' and '{name}' to "
                            f"'{key}'", USAGE)
            routes[key] = name
        else:
            unexpected.append(name)
    missing = [k for group in ties if not any(k in routes for k in group) for k in group]
    order = {k: i for i, k in enumerate(target)}
    missing.sort(key=order.__getitem__)

    problems: list[str] = []
    casts: list[str] = []
    for key, name in routes.items():
        meta, dest = metas[name], target[key]
        _dtypes.check_shape(meta, catalogue.shards)
        _dtypes.check_representable(meta, "error")  # a dtype torch lacks raises, naming it
        src_dtype = _dtypes.torch_dtype(meta["dtype"])
        shape = _landing.checkpoint_shape(meta)
        if shape != tuple(dest.shape):
            problems.append(f"size mismatch for {key}: copying a param with shape "
                            f"{list(shape)} from checkpoint '{name}', the shape in current "
                            f"model is {list(dest.shape)}")
        elif src_dtype != dest.dtype:
            if src_dtype.is_floating_point and dest.dtype.is_floating_point:
                casts.append(key)
            else:
                problems.append(f"dtype mismatch for {key}: checkpoint '{name}' is "
                                f"{meta['dtype']}, which does not cast to {dest.dtype} "
                                "(only floating dtypes are converted)")
    if problems:
        raise Error(f"load_into {owner}: " + "; ".join(problems[:_MAX_KEYS_SHOWN]) +
                    (f"; and {len(problems) - _MAX_KEYS_SHOWN} more" if
                     len(problems) > _MAX_KEYS_SHOWN else ""), INVALID_CHECKPOINT)
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing key(s) in the checkpoint: {_shown(missing)}")
        if unexpected:
            parts.append(f"unexpected key(s) in the checkpoint: {_shown(unexpected)}")
        raise Error(f"load_into {owner} (strict): " + "; ".join(parts) +
                    " (strict=False loads the rest; key_map renames keys)", INVALID_CHECKPOINT)
    return routes, unexpected, missing, casts


def _wants(routes: dict[str, str], shards: dict[str, _LocalShard], ties: list[list[str]],
           metas: dict[str, dict], device: tuple[str, int]) -> tuple[list[tuple], list[tuple]]:
    """This rank's wants for the library (name, offset, shape, data pointer, capacity bytes,
    memory, dtype to cast to), one per destination memory, and the (key, destination, landed)
    triples that land in a tensor of the checkpoint's dtype first, for torch to copy.

    A want lands in the destination itself when the library can write it there: contiguous,
    on the load's device, in the checkpoint's dtype or one ``_landing.RECEIVER_CASTS``
    makes."""
    # Tied keys are one memory: the key loaded last in file order writes it, as copying each
    # in turn would leave it.
    writer = {}
    for group in ties:
        routed = [k for k in routes if k in group]
        for k in group:
            writer[k] = routed[-1] if routed else k
    wants: list[tuple] = []
    staged: list[tuple] = []
    for key, name in routes.items():
        if writer.get(key, key) != key:
            continue
        shard, meta = shards[key], metas[name]
        dest, cast, is_staged = _landing.land(meta["dtype"], shard.local, device)
        if is_staged:
            staged.append((key, shard.local, dest))
        box = None
        if shard.shape != _landing.checkpoint_shape(meta):  # a slice of the checkpoint tensor
            box = (list(shard.offset), list(shard.shape))
        wants.append(_landing.want(name, meta["dtype"], box, dest, device, cast))
    return wants, staged
