"""The keywords ``load``, ``load_into`` and the DCP reader share: each checked (a bad value
raises ``Error`` naming the keyword) and spelt as the extension takes it; the device and world
they resolve to; and the call that runs this rank's part of a job with them."""

from __future__ import annotations

import contextlib
import datetime
import math
import numbers
import operator
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Union

from . import _progress
from . import _weightcast as _core
from ._errors import CONFIG, UNAVAILABLE, USAGE, Error

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

# How often the progress renderer may run, seconds (the last chunk always draws).
_PROGRESS_INTERVAL_S = 0.1

def _integer(value: object) -> int | None:
    """``value`` as an int when it is one (anything ``operator.index`` takes: int, a numpy
    integer, a 0-d integer tensor), else None; a bool is not a number here."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


# The keywords that are config keys are checked here for their Python type only, and given to
# the extension as the text of the key's value: the value's range and spellings are the
# config's (the settings registry), with the config's message ("keyword chunk_size=0: '0' is
# out of range (must be more than 0 and at most 4GiB)"), as from a file or `--set`.


def _size_text(value: object, key: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    number = _integer(value)
    if number is None:
        raise Error(f"{key}: {value!r} is not a size (bytes as an int, or '16MiB')", CONFIG)
    return str(number)


def _count(value: object, key: str) -> str | None:
    if value is None:
        return None
    number = _integer(value)
    if number is None:
        raise Error(f"{key}: {value!r} is not a count (an int)", CONFIG)
    return str(number)


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
    if isinstance(value, str):
        return value
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


def _resolve_device(device: object, options: _Options,
                    world: Mapping[str, Any]) -> tuple[str, int]:
    """(kind, ordinal) of the arena: ("host", 0) or ("cuda", N)."""
    if device is None:
        if options.config is None:
            return ("host", 0)
        kind = _core.config_device(options.settings)
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


def _world(options: _Options | None, alone: object) -> dict:
    """This process's world as ``weightcast run`` detects it (the config's ``world.*``, else
    torchrun's, Slurm's or Open MPI's environment); with ``alone``, rank 0 of 1."""
    if not isinstance(alone, bool):
        raise Error(f"alone: {alone!r} is not True or False", USAGE)
    if alone:
        return {"rank": 0, "world_size": 1, "local_rank": 0, "source": "alone",
                "describe": "rank 0 of 1 (alone=True)"}
    return _core.detect_world(None if options is None else options.settings)


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
    """The type here; the range is the config key ``rendezvous.port``'s (the settings registry),
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
    if reader is None or isinstance(reader, str):
        return reader
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
    """The keywords ``load`` and ``load_into`` share, checked: ``config`` (the file's path, or
    None) and ``settings``, the extension's ``Settings``: the config file read once, then the
    keywords (chunk_size, buffer_depth, io_depth, direct_io, timeout, reader, verify) as
    overrides of its keys. The world, the config's device and the load all read ``settings``."""

    config: bytes | None
    settings: Any

    @staticmethod
    def of(*, config: object, chunk_size: object, buffer_depth: object, io_depth: object,
           direct_io: object, timeout: object, reader: object, verify: object) -> _Options:
        config_s = _fs_path(config, "config") if config is not None else None
        return _Options(config_s, _core.settings(
            config_s, _size_text(chunk_size, "chunk_size"), _count(buffer_depth, "buffer_depth"),
            _count(io_depth, "io_depth"), _direct_io_text(direct_io), _duration_text(timeout),
            _reader_text(reader), _verify_text(verify)))


# CUDA's handle for the per-thread default stream (cudaStreamPerThread).
_PER_THREAD_STREAM = 2


@contextlib.contextmanager
def _caller_stream(device: tuple[str, int]) -> Iterator[Any]:
    """The stream the load is ordered with: torch's current stream on the load's GPU (a
    ``torch.cuda.Stream``), None for host memory or a CPU-only torch.

    The load's writes come after the work queued on it (``init_weights()`` after
    ``to_empty()``, FSDP2's copies, an allocator block just reused) and it waits for them
    before ``load``/``load_into`` return: DLPack's stream contract, the data is ready on the
    caller's current stream. torch's default stream has the handle 0, which is CUDA's legacy
    default stream and is ordered like any other (``None``, not 0, means no stream). The
    per-thread default stream names the stream of whichever thread uses it, and the library
    orders itself from its own thread: a stream of torch's stands in for it, ordered after it
    here and before it once the load is done."""
    if device[0] != "cuda":
        yield None
        return
    import torch

    if not torch.cuda.is_available():
        yield None  # a CPU-only torch: there is no stream of torch's to order with
        return
    current = torch.cuda.current_stream(device[1])
    if current.cuda_stream != _PER_THREAD_STREAM:
        yield current
        return
    bridge = torch.cuda.Stream(device[1])
    bridge.wait_stream(current)
    yield bridge
    current.wait_stream(bridge)


def _stream_handle(stream: Any) -> int | None:
    """The ``cudaStream_t`` the library is handed for ``stream`` (0: the default stream)."""
    return None if stream is None else int(stream.cuda_stream)


def _on_stream(plan: Callable[..., Any] | None, stream: Any) -> Callable[..., Any] | None:
    """``plan``, run with ``stream`` current: the tensors it allocates (a staged destination
    on the GPU) come from torch's allocator for the caller's stream, which the load is ordered
    after and before, instead of the default stream of the library's thread."""
    if plan is None or stream is None:
        return plan
    import torch

    def planned(*args: Any) -> Any:
        with torch.cuda.stream(stream):
            return plan(*args)

    return planned


def _run_job(checkpoint: object, options: _Options, *, device: tuple[str, int],
             placement: str | None, rendezvous_port: int | None,
             plan: Callable[..., Any] | None, progress: object, rank: int,
             alone: bool, pieces: bool = False) -> Any:
    """This rank's part of a load on every rank (the library's ``run_job``: rank 0 reads,
    the others receive over MPI or NCCL), the GIL released; ranks other than 0 never open
    ``checkpoint``. ``pieces``: rank 0 opens a directory of tensor pieces (torch DCP's
    sharded save), each piece its own catalogue entry."""
    with _caller_stream(device) as stream:
        return _core.run_job(_fs_path(checkpoint, "checkpoint"), device[0], device[1],
                             options.settings, placement, rendezvous_port,
                             _on_stream(plan, stream), _progress_hook(progress, rank),
                             _PROGRESS_INTERVAL_S, alone, cuda_stream=_stream_handle(stream),
                             pieces=pieces)
