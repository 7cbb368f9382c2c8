"""``weightcast.load`` and ``weightcast.load_into``: the torch-facing API over the C++ core."""

from __future__ import annotations

import datetime
import math
import numbers
import operator
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

from . import _dtypes, _progress
from . import _weightcast as _core
from ._errors import CONFIG, INVALID_CHECKPOINT, UNAVAILABLE, USAGE, Error

if TYPE_CHECKING:
    import torch

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
KeyMap = Union[str, Mapping[str, str], Callable[[str], Union[str, None]], None]

# How often the progress renderer may run, seconds (the last chunk always draws).
_PROGRESS_INTERVAL_S = 0.1
# chunk_size's upper bound (LoadOptions::chunk_bytes, 4 GiB), for a message.
_MAX_CHUNK_BYTES = 4 << 30
# Messages list at most this many keys of one kind, then the count of the rest.
_MAX_KEYS_SHOWN = 10


def _integer(value: object) -> int | None:
    """``value`` as an int when it is one (anything ``operator.index`` takes: int, a numpy
    integer, a 0-d integer tensor), else None; a bool is not a number here."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _size_text(value: object, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    number = _integer(value)
    if number is None:
        raise Error(f"{key}: {value!r} is not a size (bytes as an int, or '16MiB')", CONFIG)
    if number < 1:
        # The range LoadOptions::chunk_bytes states for 0, not a size's own (0 to 2^64 - 1)
        # that a negative int would otherwise be told.
        raise Error(f"{key} is {number}: must be 1 to {_MAX_CHUNK_BYTES}", CONFIG)
    return str(number)


def _count(value: object, key: str) -> int | None:
    if value is None:
        return None
    number = _integer(value)
    if number is None or not 0 <= number < 2**32:
        raise Error(f"{key}: {value!r} is not a count (a positive int)", CONFIG)
    return number


def _duration_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        return value
    # Any real number: int, float, numpy's scalars (registered with the numbers ABCs).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Error(f"timeout: {value!r} is not a duration (seconds, or '300s')", CONFIG)
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value <= 0 or value * 1000 >= 2**63:
        # NaN, infinity and negatives have no millisecond count; name what the caller wrote.
        raise Error(f"timeout: {value!r} is not a duration: seconds must be finite and more "
                    "than 0 (at most 7 days)", CONFIG)
    if value < 0.001:
        # Timeouts count whole milliseconds: rounding would make it 0 ms, which reads as none.
        raise Error(f"timeout: {value!r} seconds is under the 1 ms timeouts are counted in "
                    "(at least 0.001)", CONFIG)
    return f"{round(value * 1000)}ms"


def _direct_io_text(value: object) -> str | None:
    if value is None:
        return None
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value in ("auto", "on", "off"):
        return str(value)
    raise Error(f"direct_io: {value!r} is not one of 'auto', 'on', 'off', True, False", CONFIG)


def _cuda_ordinal(world: Mapping[str, Any], device_count: int,
                  torch_current: int | None) -> int:
    """The GPU ``device="cuda"`` means, from the environment alone: ``world`` as
    ``detect_world`` gives it (rank, world_size, local_rank), ``device_count`` the CUDA devices
    this process sees, ``torch_current`` torch's current device, or None where torch has not
    initialised CUDA (so no one chose one).

    One rank: torch's current device (0 when none). Several: weightcast's rule, as for the CLI
    (gpu_info.hpp, docs/gpu.md): ordinal 0 when one device is visible, else the local rank
    (torch's current device is 0 on every rank that never called ``set_device``, which put
    every rank on GPU 0). Where torch's current device is another GPU, tensors the caller made
    live there: refused, naming the rank, both devices and what to set."""
    if world["world_size"] <= 1:
        return torch_current if torch_current is not None else 0
    rank, local_rank = world["rank"], world["local_rank"]
    if device_count <= 0:
        raise Error(f"device: 'cuda': rank {rank}: no CUDA device is visible", UNAVAILABLE)
    if device_count == 1:
        ordinal = 0
    elif 0 <= local_rank < device_count:
        ordinal = local_rank
    else:
        raise Error(f"device: 'cuda': rank {rank} has local rank {local_rank}, but this process "
                    f"sees {device_count} CUDA devices (cuda:0 to cuda:{device_count - 1}): give "
                    "each rank one GPU (CUDA_VISIBLE_DEVICES, Slurm --gpus-per-task=1) or every "
                    "rank all of the node's GPUs with no more ranks per node than GPUs",
                    UNAVAILABLE)
    if torch_current is not None and torch_current != ordinal:
        raise Error(f"device: 'cuda': rank {rank} (local rank {local_rank}, {device_count} CUDA "
                    f"devices visible) loads to cuda:{ordinal}, its local rank's GPU, but torch's "
                    f"current device is cuda:{torch_current}: call "
                    f"torch.cuda.set_device({ordinal}) (the local rank) before any CUDA work, or "
                    f"pass device='cuda:{torch_current}' to load to torch's current device",
                    CONFIG)
    return ordinal


def _resolve_device(device: object, config: bytes | None,
                    world: Mapping[str, Any]) -> tuple[str, int]:
    """(kind, ordinal) of the arena: ("host", 0) or ("cuda", N)."""
    if device is None:
        if config is None:
            return ("host", 0)
        kind = _core.config_device(config)
        device = "cpu" if kind == "host" else kind
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        # An accelerator index, as torch.device(0) and safetensors' load_file(device=0) read it.
        device = f"cuda:{device}"
    text = str(device)  # a torch.device prints as "cuda:1" / "cpu"
    if text == "auto":
        text = "cuda" if _core.cuda_device_count() > 0 else "cpu"
    if text in ("cpu", "host"):
        return ("host", 0)
    if text == "cuda":
        import torch

        current = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        return ("cuda", _cuda_ordinal(world, _core.cuda_device_count(), current))
    if text.startswith("cuda:") and text[5:].isascii() and text[5:].isdigit():
        ordinal = int(text[5:])
        if ordinal >= 2**31:  # the C++ ordinal is an int
            raise Error(f"device: {text!r}: no CUDA device has ordinal {ordinal}", UNAVAILABLE)
        return ("cuda", ordinal)
    raise Error(f"device: {text!r} is not a device weightcast loads to (cpu, cuda, cuda:N, an int "
                "N, auto)", CONFIG)


def _world(config: bytes | None, alone: object) -> dict:
    """This process's world as ``weightcast run`` detects it (the config's ``world.*``, else
    torchrun's, Slurm's or Open MPI's environment); with ``alone``, rank 0 of 1."""
    if not isinstance(alone, bool):
        raise Error(f"alone: {alone!r} is not True or False", USAGE)
    if alone:
        return {"rank": 0, "world_size": 1, "local_rank": 0, "source": "alone",
                "describe": "rank 0 of 1 (alone=True)"}
    return _core.detect_world(config)


def _ranked(error: Error, world: dict | None) -> Error:
    """A local error raised on one rank of several, before its job started, names the rank
    as the job's own messages do ("rank 2: ...")."""
    if world is None or world["world_size"] <= 1 or str(error).startswith("rank "):
        return error
    return Error(f"rank {world['rank']}: {error}", error.status)


def _own_world(config: object, alone: object) -> dict | None:
    """This process's world, for a message's rank prefix; None when it cannot be told."""
    if alone is True:
        return None
    try:
        return _core.detect_world(None if config is None else _fs_path(config, "config"))
    except Exception:
        return None


def _check_placement(placement: object) -> None:
    if placement not in (None, "replicate", "fsdp"):
        raise Error(f"placement: {placement!r} is not one of 'replicate', 'fsdp'", CONFIG)


def _port(value: object) -> int | None:
    """The type here; the range is the config key ``rendezvous.port``'s (one rule, config.cpp),
    checked in every world, also where a world of one never uses the port."""
    if value is None:
        return None
    number = _integer(value)
    if number is None:
        raise Error(f"rendezvous_port: {value!r} is not a TCP port (an int, 1 to 65535)", CONFIG)
    value = number
    try:
        _core.check_setting("rendezvous.port", str(value))
    except Error as e:  # the config's words, named as the caller wrote the keyword
        raise Error("rendezvous_port: " + str(e).split(": ", 1)[-1], e.status) from None
    return value


def _verify_text(verify: object) -> str | None:
    # A bool only: a truthy string such as "none" must not read as True.
    if verify is None:
        return None
    if isinstance(verify, bool):
        return "digest" if verify else "none"
    raise Error(f"verify: {verify!r} is not True or False", CONFIG)


def _reader_text(reader: object) -> str | None:
    if reader is None or reader in ("auto", "uring", "pread"):
        return reader  # type: ignore[return-value]
    raise Error(f"reader: {reader!r} is not one of 'auto', 'uring', 'pread'", CONFIG)


def _fs_path(path: object, what: str) -> bytes:
    """A path as the OS spells it: bytes (``os.fsencode``), so a name that is not UTF-8 (a str
    with surrogate escapes, as ``os.listdir`` returns it) or a bytes path opens too."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{what}: expected a str, bytes or os.PathLike path, not "
                        f"{type(path).__name__}")
    return os.fsencode(path)


def _progress_hook(progress: object, rank: int) -> Callable[..., None] | None:
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise Error(f"progress: {progress!r} is not None, True, False or a callable", CONFIG)
    if callable(progress):
        user = progress
    elif _progress.wants_bar(progress, rank):
        user = _progress.Bar()
    else:
        return None
    return lambda *args: user(_progress.Progress(*args))


@dataclass(frozen=True)
class _Options:
    """The keywords ``load`` and ``load_into`` share, checked and as the extension takes them:
    (config, chunk_size, buffer_depth, io_depth, direct_io, timeout, reader, verify)."""

    config: bytes | None
    core: tuple

    @staticmethod
    def of(*, config: object, chunk_size: object, buffer_depth: object, io_depth: object,
           direct_io: object, timeout: object, reader: object, verify: object) -> _Options:
        config_s = _fs_path(config, "config") if config is not None else None
        return _Options(config_s, (
            config_s, _size_text(chunk_size, "chunk_size"), _count(buffer_depth, "buffer_depth"),
            _count(io_depth, "io_depth"), _direct_io_text(direct_io), _duration_text(timeout),
            _reader_text(reader), _verify_text(verify)))


def _caller_stream(device: tuple[str, int]) -> int:
    """torch's current stream on the load's GPU (a ``cudaStream_t`` as an int), 0 for host.
    The load's writes come after the work queued on it (``init_weights()`` after
    ``to_empty()``, FSDP2's copies, an allocator block just reused) and it waits for them
    before ``load``/``load_into`` return: DLPack's stream contract, the data is ready on the
    caller's current stream."""
    if device[0] != "cuda":
        return 0
    import torch

    if not torch.cuda.is_available():
        return 0  # a CPU-only torch: there is no stream of torch's to order with
    return int(torch.cuda.current_stream(device[1]).cuda_stream)


def _run_job(checkpoint: object, options: _Options, *, device: tuple[str, int],
             placement: str | None, rendezvous_port: int | None,
             plan: Callable[..., Any] | None, progress: object, rank: int,
             alone: bool) -> Any:
    """This rank's part of a load on every rank (the library's ``run_job``: rank 0 reads,
    the others receive over MPI or NCCL), the GIL released; ranks other than 0 never open
    ``checkpoint``."""
    return _core.run_job(_fs_path(checkpoint, "checkpoint"), device[0], device[1],
                         *options.core, placement, rendezvous_port, plan,
                         _progress_hook(progress, rank), _PROGRESS_INTERVAL_S, alone,
                         cuda_stream=_caller_stream(device))


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
) -> dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors checkpoint; see ``weightcast/__init__.pyi``."""
    import torch  # noqa: F401  (the result is torch tensors; fail early without torch)

    try:
        return _load(checkpoint, device=device, chunk_size=chunk_size,
                     buffer_depth=buffer_depth, io_depth=io_depth, direct_io=direct_io,
                     timeout=timeout, placement=placement, config=config, progress=progress,
                     reader=reader, verify=verify, unsupported_dtypes=unsupported_dtypes,
                     rendezvous_port=rendezvous_port, alone=alone)
    except Error as e:
        raise _ranked(e, _own_world(config, alone)) from None


def _load(checkpoint: PathLike, *, device: Any, chunk_size: Any, buffer_depth: Any,
          io_depth: Any, direct_io: Any, timeout: Any, placement: Any, config: Any,
          progress: Any, reader: Any, verify: Any, unsupported_dtypes: Any,
          rendezvous_port: Any, alone: Any) -> dict[str, torch.Tensor]:
    if unsupported_dtypes not in ("error", "bytes"):
        raise Error(f"unsupported_dtypes: {unsupported_dtypes!r} is not 'error' or 'bytes'",
                    CONFIG)
    _check_placement(placement)
    port = _port(rendezvous_port)
    options = _Options.of(config=config, chunk_size=chunk_size, buffer_depth=buffer_depth,
                          io_depth=io_depth, direct_io=direct_io, timeout=timeout, reader=reader,
                          verify=verify)
    world = _world(options.config, alone)
    dev = _resolve_device(device, options.config, world)
    if world["world_size"] > 1:
        # Every rank checks the catalogue rank 0 sends it, so a dtype torch cannot hold
        # raises on every rank before any byte moves.
        def plan(catalogue: Any, rank: int, world_size: int) -> None:
            _check_catalogue(catalogue, unsupported_dtypes)

        result = _run_job(checkpoint, options, device=dev, placement=placement,
                          rendezvous_port=port, plan=plan, progress=progress,
                          rank=world["rank"], alone=False)
        return _tensors(result)
    catalogue = _core.open_checkpoint(_fs_path(checkpoint, "checkpoint"))
    _check_catalogue(catalogue, unsupported_dtypes)
    result = _core.load(catalogue, dev[0], dev[1], *options.core,
                        _progress_hook(progress, world["rank"]), _PROGRESS_INTERVAL_S,
                        cuda_stream=_caller_stream(dev))
    return _tensors(result)


@dataclass(frozen=True)
class LoadReport:
    """What ``load_into`` did, in ``load_state_dict``'s words (``missing_keys``,
    ``unexpected_keys``) plus what it loaded and measured."""

    missing_keys: list[str] = field(default_factory=list)
    """Destination keys no checkpoint tensor landed in (a tied key counts as loaded when any
    key of its tie group was)."""
    unexpected_keys: list[str] = field(default_factory=list)
    """Checkpoint keys (after ``key_map``) with no destination."""
    loaded_keys: list[str] = field(default_factory=list)
    """Destination keys written, in checkpoint file order."""
    cast_keys: list[str] = field(default_factory=list)
    """The loaded keys whose destination dtype differs from the checkpoint's (cast on landing)."""
    staged_keys: list[str] = field(default_factory=list)
    """The loaded keys that could not land in place (a cast the receiver does not make, a
    strided destination, one on another device): they landed in a tensor of the checkpoint's
    dtype, which torch's ``copy_`` then wrote into the destination."""
    bytes: int = 0
    """Bytes this rank received (its local shards, in the checkpoint's dtype)."""
    seconds: float = 0.0
    """Wall time of the load pipeline (files open to last byte), seconds."""
    verdict: str = ""
    """Rank 0's verdict, the same on every rank (docs/python.md, ``verify``)."""


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

    for p in t.placements:
        # _StridedShard (FSDP2 over tensor parallel) is a Shard whose local rows are not one
        # contiguous block of the global tensor.
        if type(p) not in (Shard, Replicate):
            raise Error(f"load_into: {owner} key '{key}' is a DTensor placed {p}: only Shard(d) "
                        "and Replicate() are loaded (a Partial or strided shard has no "
                        "checkpoint slice)", USAGE)
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    local = t.to_local()
    if local.device.type == "meta":
        raise Error(f"load_into: {owner} key '{key}' is on the meta device, which holds no "
                    "memory to load into; call model.to_empty(device=...) first", USAGE)
    if tuple(local.shape) != tuple(shape):
        raise Error(f"load_into: {owner} key '{key}': the DTensor's local tensor has shape "
                    f"{list(local.shape)}, its placements give {list(shape)}", INVALID_CHECKPOINT)
    return _LocalShard(local, tuple(offset), tuple(shape))


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


def _checkpoint_shape(meta: dict) -> tuple[int, ...]:
    shape = tuple(meta["shape"])
    if meta["dtype"] == "F4" and shape:
        shape = shape[:-1] + (shape[-1] // 2,)
    return shape


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
) -> LoadReport:
    """Loads a checkpoint into a model's own tensors; see ``weightcast/__init__.pyi``."""
    try:
        return _load_into(model_or_state_dict, checkpoint, strict=strict, key_map=key_map,
                          device=device, chunk_size=chunk_size, buffer_depth=buffer_depth,
                          io_depth=io_depth, direct_io=direct_io, timeout=timeout,
                          config=config, progress=progress, reader=reader, verify=verify,
                          rendezvous_port=rendezvous_port, alone=alone)
    except Error as e:
        raise _ranked(e, _own_world(config, alone)) from None


def _load_into(model_or_state_dict: Any, checkpoint: PathLike, *, strict: Any, key_map: Any,
               device: Any, chunk_size: Any, buffer_depth: Any, io_depth: Any,
               direct_io: Any, timeout: Any, config: Any, progress: Any, reader: Any,
               verify: Any, rendezvous_port: Any, alone: Any) -> LoadReport:
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

    options = _Options.of(config=config, chunk_size=chunk_size, buffer_depth=buffer_depth,
                          io_depth=io_depth, direct_io=direct_io, timeout=timeout, reader=reader,
                          verify=verify)
    port = _port(rendezvous_port)
    world = _world(options.config, alone)
    shards = {key: _local_shard(owner, key, t) for key, t in target.items()}
    for key, shard in shards.items():
        _check_writable(owner, key, shard.local)
    if device is None and options.config is None:
        # Land where the destinations are when they all live on one GPU.
        devices = {v.local.device for v in shards.values()}
        only = next(iter(devices)) if len(devices) == 1 else None
        dev = ("cuda", only.index if only.index is not None else torch.cuda.current_device()) \
            if only is not None and only.type == "cuda" else ("host", 0)
    else:
        dev = _resolve_device(device, options.config, world)
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

    try:
        result = _run_job(checkpoint, options, device=dev, placement=None,
                          rendezvous_port=port, plan=plan, progress=progress,
                          rank=world["rank"], alone=alone)
    except Error:
        if "raised" in state:
            raise state.pop("raised") from None
        raise
    stats = result.stats
    staged = state.pop("staged")
    if staged:
        # Destinations the library cannot land in (a cast it does not do, a strided tensor,
        # another device) received into a tensor of the checkpoint's dtype; torch's copy_
        # casts and scatters, so the values are exactly Tensor.to's.
        with torch.no_grad():
            for _, local, landed in staged:
                local.copy_(landed)
        if dev[0] == "cuda":
            torch.cuda.current_stream(dev[1]).synchronize()
    staged_keys = [key for key, _, _ in staged]
    del staged
    return LoadReport(missing_keys=state["missing"], unexpected_keys=state["unexpected"],
                      loaded_keys=list(state["routes"]), cast_keys=state["casts"],
                      staged_keys=staged_keys,
                      bytes=int(stats["bytes"]), seconds=float(stats["seconds"]),
                      verdict=result.verdict)


# Casts the library makes at the receiver, into host memory (placement.hpp's
# TensorDestination::dtype): (checkpoint dtype, destination dtype).
_RECEIVER_CASTS = {("BF16", "F32"), ("F16", "F32"), ("F32", "BF16"), ("F32", "F16")}
_ST_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


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
        shape = _checkpoint_shape(meta)
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
    on the load's device, in the checkpoint's dtype or one ``_RECEIVER_CASTS`` makes."""
    import torch

    # Tied keys are one memory: the key loaded last in file order writes it, as copying each
    # in turn would leave it.
    writer = {}
    for group in ties:
        routed = [k for k in routes if k in group]
        for k in group:
            writer[k] = routed[-1] if routed else k
    memory = "cuda" if device[0] == "cuda" else "host"
    torch_device = torch.device("cuda", device[1]) if memory == "cuda" else torch.device("cpu")
    wants: list[tuple] = []
    staged: list[tuple] = []
    for key, name in routes.items():
        if writer.get(key, key) != key:
            continue
        shard, meta = shards[key], metas[name]
        local = shard.local
        st_dtype = meta["dtype"]
        src_dtype = _dtypes.torch_dtype(st_dtype)
        cast = None
        castable = True
        if src_dtype != local.dtype:
            cast = _ST_NAMES.get(str(local.dtype).removeprefix("torch."))
            castable = memory == "host" and (st_dtype, cast) in _RECEIVER_CASTS
        direct = castable and local.is_contiguous() and local.device == torch_device
        if direct:
            dest = local
        else:
            dest = torch.empty(local.shape, dtype=src_dtype, device=torch_device)
            staged.append((key, local, dest))
            cast = None
        offset: list[int] | None = None
        shape: list[int] | None = None
        if shard.shape != _checkpoint_shape(meta):  # a slice of the checkpoint tensor
            offset, shape = list(shard.offset), list(shard.shape)
            if st_dtype == "F4" and shape:  # torch's float4_e2m1fn_x2 holds two per element
                offset[-1] *= 2
                shape[-1] *= 2
        wants.append((name, offset, shape, dest.data_ptr(), dest.numel() * dest.element_size(),
                      memory, cast))
    return wants, staged
