"""``weightcast.load`` and ``weightcast.load_into``: the torch-facing API over the C++ core."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

from . import _dtypes, _progress
from . import _weightcast as _core
from ._errors import CONFIG, INVALID_CHECKPOINT, UNAVAILABLE, USAGE, Error

if TYPE_CHECKING:
    import torch

PathLike = Union[str, "os.PathLike[str]"]
KeyMap = Union[str, Mapping[str, str], Callable[[str], Union[str, None]], None]

# How often the progress renderer may run, seconds (the last chunk always draws).
_PROGRESS_INTERVAL_S = 0.1
# Messages list at most this many keys of one kind, then the count of the rest.
_MAX_KEYS_SHOWN = 10


def _size_text(value: object, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise Error(f"{key}: {value!r} is not a size (bytes as an int, or '16MiB')", CONFIG)
    return str(value)


def _count(value: object, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise Error(f"{key}: {value!r} is not a count (a positive int)", CONFIG)
    return value


def _duration_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Error(f"timeout: {value!r} is not a duration (seconds, or '300s')", CONFIG)
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


def _resolve_device(device: object, config: str | None) -> tuple[str, int]:
    """(kind, ordinal) of the arena: ("host", 0) or ("cuda", N)."""
    if device is None:
        if config is None:
            return ("host", 0)
        kind = _core.config_device(config)
        device = "cpu" if kind == "host" else kind
    text = str(device)  # a torch.device prints as "cuda:1" / "cpu"
    if text == "auto":
        text = "cuda" if _core.cuda_device_count() > 0 else "cpu"
    if text in ("cpu", "host"):
        return ("host", 0)
    if text == "cuda":
        import torch

        return ("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    if text.startswith("cuda:") and text[5:].isdigit():
        return ("cuda", int(text[5:]))
    raise Error(f"device: {text!r} is not a device weightcast loads to (cpu, cuda, cuda:N, auto)",
                CONFIG)


def _single_process_world(config: str | None, what: str) -> dict:
    world = _core.detect_world(config)
    if world["world_size"] > 1:
        raise Error(
            f"weightcast.{what}: {world['describe']}: loading on several ranks from Python needs "
            "the distributed entry point, which this build of the package does not have yet; "
            "run one process, or the `weightcast run` CLI on every rank",
            UNAVAILABLE,
        )
    return world


def _check_placement(placement: object) -> None:
    # At world size 1 every placement is the whole tensor.
    if placement not in (None, "replicate", "fsdp"):
        raise Error(f"placement: {placement!r} is not one of 'replicate', 'fsdp'", CONFIG)


def _progress_hook(progress: object, rank: int) -> Callable[..., None] | None:
    if callable(progress):
        user = progress
    elif _progress.wants_bar(progress, rank):
        user = _progress.Bar()
    else:
        return None
    return lambda *args: user(_progress.Progress(*args))


def _load_catalogue(catalogue: Any, *, device: tuple[str, int], config: str | None,
                    chunk_size: object, buffer_depth: object, io_depth: object,
                    direct_io: object, timeout: object, reader: str | None,
                    progress: object, rank: int) -> Any:
    return _core.load(
        catalogue, device[0], device[1], config, _size_text(chunk_size, "chunk_size"),
        _count(buffer_depth, "buffer_depth"), _count(io_depth, "io_depth"),
        _direct_io_text(direct_io), _duration_text(timeout), reader,
        _progress_hook(progress, rank), _PROGRESS_INTERVAL_S)


def _tensors(result: Any, catalogue: Any) -> dict[str, torch.Tensor]:
    out = {}
    for (name, st_dtype, tensor), meta in zip(result.tensors(), catalogue.tensors):
        out[name] = _dtypes.as_torch(tensor, st_dtype, meta["shape"])
    return out


def load(
    checkpoint: PathLike,
    *,
    device: str | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    placement: str | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[_progress.Progress], None] | None = None,
    reader: str | None = None,
    unsupported_dtypes: str = "error",
) -> dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors checkpoint; see ``weightcast/__init__.pyi``."""
    import torch  # noqa: F401  (the result is torch tensors; fail early without torch)

    if unsupported_dtypes not in ("error", "bytes"):
        raise Error(f"unsupported_dtypes: {unsupported_dtypes!r} is not 'error' or 'bytes'",
                    CONFIG)
    _check_placement(placement)
    config_s = os.fspath(config) if config is not None else None
    world = _single_process_world(config_s, "load")
    dev = _resolve_device(device, config_s)
    catalogue = _core.open_checkpoint(os.fspath(checkpoint))
    for meta in catalogue.tensors:
        _dtypes.check_representable(meta, unsupported_dtypes)
    result = _load_catalogue(
        catalogue, device=dev, config=config_s, chunk_size=chunk_size,
        buffer_depth=buffer_depth, io_depth=io_depth, direct_io=direct_io, timeout=timeout,
        reader=reader, progress=progress, rank=world["rank"])
    return _tensors(result, catalogue)


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
    bytes: int = 0
    """Checkpoint bytes read (every tensor of the checkpoint, at world size 1)."""
    seconds: float = 0.0
    """Wall time of the load pipeline (files open to last byte), seconds."""


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
    device: str | torch.device | None = None,
    chunk_size: int | str | None = None,
    buffer_depth: int | None = None,
    io_depth: int | None = None,
    direct_io: bool | str | None = None,
    timeout: float | str | datetime.timedelta | None = None,
    config: PathLike | None = None,
    progress: bool | Callable[[_progress.Progress], None] | None = None,
    reader: str | None = None,
) -> LoadReport:
    """Loads a checkpoint into a model's own tensors; see ``weightcast/__init__.pyi``."""
    import torch

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
        if not isinstance(t, torch.Tensor):
            raise Error(f"load_into: {owner} key '{key}' holds a {type(t).__name__}, "
                        "not a torch.Tensor", USAGE)
        if t.device.type == "meta":
            raise Error(f"load_into: {owner} key '{key}' is on the meta device, which holds no "
                        "memory to load into; call model.to_empty(device=...) first", USAGE)

    config_s = os.fspath(config) if config is not None else None
    world = _single_process_world(config_s, "load_into")
    shards = {key: _local_shard(owner, key, t) for key, t in target.items()}
    catalogue = _core.open_checkpoint(os.fspath(checkpoint))
    metas = {m["name"]: m for m in catalogue.tensors}
    mapper = _key_mapper(key_map)

    routes: dict[str, str] = {}  # destination key -> checkpoint key, checkpoint file order
    unexpected: list[str] = []
    for name in metas:
        key = mapper(name)
        if key is None:
            continue  # the callable chose to skip it
        if key in target:
            if key in routes:
                raise Error(f"load_into: key_map maps both '{routes[key]}' and '{name}' to "
                            f"'{key}'", USAGE)
            routes[key] = name
        else:
            unexpected.append(name)
    missing = [k for group in _tie_groups({k: v.local for k, v in shards.items()})
               if not any(k in routes for k in group) for k in group]
    order = {k: i for i, k in enumerate(target)}
    missing.sort(key=order.__getitem__)

    problems: list[str] = []
    casts: list[str] = []
    for key, name in routes.items():
        meta, dest = metas[name], target[key]
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

    if device is None and config_s is None:
        # Land where the destinations are when they all live on one GPU.
        devices = {v.local.device for v in shards.values()}
        only = next(iter(devices)) if len(devices) == 1 else None
        dev = ("cuda", only.index or 0) if only is not None and only.type == "cuda" \
            else ("host", 0)
    else:
        dev = _resolve_device(device, config_s)
    # Until in-place landing (the placement API) is in the library, the checkpoint lands in
    # an arena and each tensor is copied (and cast) into its destination by torch itself,
    # so a cast is exactly `Tensor.to`'s.
    result = _load_catalogue(
        catalogue, device=dev, config=config_s, chunk_size=chunk_size,
        buffer_depth=buffer_depth, io_depth=io_depth, direct_io=direct_io, timeout=timeout,
        reader=reader, progress=progress, rank=world["rank"])
    stats = result.stats
    tensors = _tensors(result, catalogue)
    with torch.no_grad():
        for key, name in routes.items():
            shard = shards[key]
            src = tensors[name]
            for dim, (begin, length) in enumerate(zip(shard.offset, shard.shape)):
                if length != src.shape[dim]:
                    src = src.narrow(dim, begin, length)
            shard.local.copy_(src)
    if dev[0] == "cuda":
        # The copies run on the caller's current stream; the arena goes once they are done.
        torch.cuda.current_stream(dev[1]).synchronize()
    del tensors
    return LoadReport(missing_keys=missing, unexpected_keys=unexpected,
                      loaded_keys=list(routes), cast_keys=casts, bytes=int(stats["bytes"]),
                      seconds=float(stats["seconds"]))
