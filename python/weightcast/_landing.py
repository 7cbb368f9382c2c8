"""Where and how a tensor lands, for ``load``, ``load_into`` and the DCP reader alike: the
device a load's arena lives on, the casts the receiver makes, and a destination the library
cannot write in place, which lands in a tensor of the checkpoint's dtype that torch's
``copy_`` then writes (a staged destination).

A staged destination on a GPU is allocated inside the plan callback, which
``_options.run_job`` runs with the caller's stream current (``_options._on_stream``): its
memory then comes from torch's allocator for the stream the load is ordered with."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from . import _dtypes
from . import _weightcast as _core
from ._errors import CONFIG, UNAVAILABLE, Error
from ._options import Options

# Casts the library makes at the receiver, into host memory (placement.hpp's
# TensorDestination::dtype): (checkpoint dtype, destination dtype).
RECEIVER_CASTS = {("BF16", "F32"), ("F16", "F32"), ("F32", "BF16"), ("F32", "F16")}
# The torch dtypes a receiver cast writes, by their safetensors names.
_CAST_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def cuda_ordinal(world: Mapping[str, Any], device_count: int,
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


def resolve_device(device: object, options: Options,
                   world: Mapping[str, Any]) -> tuple[str, int]:
    """(kind, ordinal) of the arena: ("host", 0) or ("cuda", N)."""
    if device is None:
        if options.config is None:
            return ("host", 0)
        device = _core.config_device(options.settings)
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        # An accelerator index, as torch.device(0) and safetensors' load_file(device=0) read it.
        device = f"cuda:{device}"
    text = str(device)  # a torch.device prints as "cuda:1" / "cpu"
    if text == "auto":
        text = "cuda" if _core.cuda_device_count() > 0 else "cpu"
    kind = _core.device_kind(text)  # the registry's names, and torch's "cpu"
    if kind == "host":
        return ("host", 0)
    if kind == "cuda":
        import torch

        current = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        return ("cuda", cuda_ordinal(world, _core.cuda_device_count(), current))
    if text.startswith("cuda:") and text[5:].isascii() and text[5:].isdigit():
        ordinal = int(text[5:])
        if ordinal >= 2**31:  # the C++ ordinal is an int
            raise Error(f"device: {text!r}: no CUDA device has ordinal {ordinal}", UNAVAILABLE)
        return ("cuda", ordinal)
    raise Error(f"device: {text!r} is not a device weightcast loads to (cpu, cuda, cuda:N, an int "
                "N, auto)", CONFIG)


def load_device(device: object, options: Options, world: Mapping[str, Any],
                destinations: Iterable[Any]) -> tuple[str, int]:
    """The arena of a load into ``destinations`` (tensors): ``device`` as ``resolve_device``
    reads it; with neither ``device`` nor a config, the destinations' GPU when they all live
    on one, else host memory, so that they land in place."""
    if device is not None or options.config is not None:
        return resolve_device(device, options, world)
    import torch

    devices = {t.device for t in destinations}
    only = next(iter(devices)) if len(devices) == 1 else None
    if only is None or only.type != "cuda":
        return ("host", 0)
    return ("cuda", only.index if only.index is not None else torch.cuda.current_device())


def checkpoint_shape(meta: Mapping[str, Any]) -> tuple[int, ...]:
    """A catalogue tensor's shape as torch holds it: F4's last dimension halved (torch's
    float4_e2m1fn_x2 holds two elements per byte)."""
    shape = tuple(meta["shape"])
    if meta["dtype"] == "F4" and shape:
        shape = shape[:-1] + (shape[-1] // 2,)
    return shape


def land(st_dtype: str, target: Any, device: tuple[str, int]) -> tuple[Any, str | None, bool]:
    """Where a tensor of safetensors dtype ``st_dtype`` lands for the destination ``target``
    on the load's ``device``: (the tensor the library writes, the dtype it casts to or None,
    whether it is staged). ``target`` itself when the library can write it: contiguous, on
    the load's device, in the checkpoint's dtype or one of ``RECEIVER_CASTS`` (host memory
    only); else a new tensor of the checkpoint's dtype and ``target``'s shape, for
    ``copy_staged``."""
    import torch

    memory, torch_device = _memory(device)
    src_dtype = _dtypes.torch_dtype(st_dtype)
    cast = None
    castable = True
    if src_dtype != target.dtype:
        cast = _CAST_NAMES.get(str(target.dtype).removeprefix("torch."))
        castable = memory == "host" and (st_dtype, cast) in RECEIVER_CASTS
    if castable and target.is_contiguous() and target.device == torch_device:
        return target, cast, False
    # torch's copy_ casts and scatters what the library cannot land in place.
    return torch.empty(tuple(target.shape), dtype=src_dtype, device=torch_device), None, True


def want(entry: str, st_dtype: str, box: tuple[list[int], list[int]] | None, dest: Any,
         device: tuple[str, int], cast: str | None) -> tuple:
    """The library's want for catalogue entry ``entry`` landing in ``dest``: (name, offset,
    shape, data pointer, capacity bytes, memory, dtype to cast to). ``box`` is the slice of
    the entry as torch counts elements (offset, shape), None for all of it."""
    offset: list[int] | None = None
    shape: list[int] | None = None
    if box is not None:
        offset, shape = list(box[0]), list(box[1])
        if st_dtype == "F4" and shape:  # torch's float4_e2m1fn_x2 holds two per element
            offset[-1] *= 2
            shape[-1] *= 2
    return (entry, offset, shape, dest.data_ptr(), dest.numel() * dest.element_size(),
            _memory(device)[0], cast)


def copy_staged(pairs: Iterable[tuple[Any, Any]], device: tuple[str, int]) -> None:
    """Writes each staged (destination, landed) pair with torch's ``copy_`` (so the values
    are exactly ``Tensor.to``'s), complete on the caller's stream when it returns."""
    import torch

    pairs = list(pairs)
    if not pairs:
        return
    with torch.no_grad():
        for target, landed in pairs:
            target.copy_(landed)
    if device[0] == "cuda":
        torch.cuda.current_stream(device[1]).synchronize()


def _memory(device: tuple[str, int]) -> tuple[str, Any]:
    """The library's memory kind for ``device`` and the torch device it is."""
    import torch

    if device[0] == "cuda":
        return "cuda", torch.device("cuda", device[1])
    return "host", torch.device("cpu")
