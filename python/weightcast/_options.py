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
from typing import Any, Callable, Iterator, Union

from . import _progress
from . import _weightcast as _core
from ._errors import CONFIG, USAGE, Error

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

# How often the progress renderer may run, seconds (the last chunk always draws).
PROGRESS_INTERVAL_S = 0.1

def integer(value: object) -> int | None:
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
    number = integer(value)
    if number is None:
        raise Error(f"{key}: {value!r} is not a size (bytes as an int, or '16MiB')", CONFIG)
    return str(number)


def _count(value: object, key: str) -> str | None:
    if value is None:
        return None
    number = integer(value)
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


def world_of(options: Options | None, alone: object) -> dict:
    """This process's world as ``weightcast run`` detects it (the config's ``world.*``, else
    torchrun's, Slurm's or Open MPI's environment); with ``alone``, rank 0 of 1."""
    if not isinstance(alone, bool):
        raise Error(f"alone: {alone!r} is not True or False", USAGE)
    if alone:
        return {"rank": 0, "world_size": 1, "local_rank": 0, "source": "alone",
                "describe": "rank 0 of 1 (alone=True)"}
    return _core.detect_world(None if options is None else options.settings)


def ranked(error: Error, world: dict | None) -> Error:
    """A local error raised on one rank of several, before its job started, names the rank
    as the job's own messages do ("rank 2: ...")."""
    if world is None or world["world_size"] <= 1 or str(error).startswith("rank "):
        return error
    return Error(f"rank {world['rank']}: {error}", error.status)


def own_world(config: object, alone: object) -> dict | None:
    """This process's world, for a message's rank prefix; None when it cannot be told."""
    if alone is True:
        return None
    try:
        return _core.detect_world(None if config is None else fs_path(config, "config"))
    except Exception:
        return None


def check_placement(placement: object) -> None:
    if placement not in (None, "replicate", "fsdp"):
        raise Error(f"placement: {placement!r} is not one of 'replicate', 'fsdp'", CONFIG)


def checked_port(value: object) -> int | None:
    """The type here; the range is the config key ``rendezvous.port``'s (the settings registry),
    checked in every world, also where a world of one never uses the port."""
    if value is None:
        return None
    number = integer(value)
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


def fs_path(path: object, what: str) -> bytes:
    """A path as the OS spells it: bytes (``os.fsencode``), so a name that is not UTF-8 (a str
    with surrogate escapes, as ``os.listdir`` returns it) or a bytes path opens too."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{what}: expected a str, bytes or os.PathLike path, not "
                        f"{type(path).__name__}")
    return os.fsencode(path)


def progress_hook(progress: object, rank: int) -> Callable[..., None] | None:
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
class Options:
    """The keywords ``load`` and ``load_into`` share, checked: ``config`` (the file's path, or
    None) and ``settings``, the extension's ``Settings``: the config file read once, then the
    keywords (chunk_size, buffer_depth, io_depth, direct_io, timeout, reader, verify) as
    overrides of its keys. The world, the config's device and the load all read ``settings``."""

    config: bytes | None
    settings: Any

    @staticmethod
    def of(*, config: object, chunk_size: object, buffer_depth: object, io_depth: object,
           direct_io: object, timeout: object, reader: object, verify: object) -> Options:
        config_s = fs_path(config, "config") if config is not None else None
        return Options(config_s, _core.settings(
            config_s, _size_text(chunk_size, "chunk_size"), _count(buffer_depth, "buffer_depth"),
            _count(io_depth, "io_depth"), _direct_io_text(direct_io), _duration_text(timeout),
            _reader_text(reader), _verify_text(verify)))


# CUDA's handle for the per-thread default stream (cudaStreamPerThread).
_PER_THREAD_STREAM = 2


@contextlib.contextmanager
def caller_stream(device: tuple[str, int]) -> Iterator[Any]:
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


def stream_handle(stream: Any) -> int | None:
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


def run_job(checkpoint: object, options: Options, *, device: tuple[str, int],
            placement: str | None, rendezvous_port: int | None,
            plan: Callable[..., Any] | None, progress: object, rank: int,
            alone: bool, pieces: bool = False) -> Any:
    """This rank's part of a load on every rank (the library's ``run_job``: rank 0 reads,
    the others receive over MPI or NCCL), the GIL released; ranks other than 0 never open
    ``checkpoint``. ``pieces``: rank 0 opens a directory of tensor pieces (torch DCP's
    sharded save), each piece its own catalogue entry."""
    with caller_stream(device) as stream:
        return _core.run_job(fs_path(checkpoint, "checkpoint"), device[0], device[1],
                             options.settings, placement, rendezvous_port,
                             _on_stream(plan, stream), progress_hook(progress, rank),
                             PROGRESS_INTERVAL_S, alone, cuda_stream=stream_handle(stream),
                             pieces=pieces)
