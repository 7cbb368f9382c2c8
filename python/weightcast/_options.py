"""The keywords ``load``, ``load_into`` and the DCP reader share: each checked (a bad value
raises ``Error`` naming the keyword) and spelt as the extension takes it; the device and world
they resolve to; and the call that runs this rank's part of a job with them."""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import numbers
import operator
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Union

from . import _progress
from . import _torch_world
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


# The keywords that are config keys, in the order they are checked. Each is checked here for
# its Python type only, by the type of its setting in the registry, and handed to the
# extension as the text of the key's value: the value's range and spellings are the config's,
# with the config's message ("keyword chunk_size=0: '0' is out of range (must be more than 0
# and at most 4GiB)"), as from a file or `--set`.
KEYWORD_KEYS = ("chunk_size", "buffer_depth", "io_depth", "direct_io", "timeout", "reader",
                "verify")
# A truthy string such as "none" must not read as True: these take a Python bool only.
_BOOL_ONLY = frozenset({"verify"})


@functools.lru_cache(maxsize=None)
def registry() -> dict[str, dict]:
    """The settings registry (core/settings.hpp) by config key: type, default, bounds (as
    numbers and as messages spell them), spellings, doc."""
    return {s["name"]: s for s in _core.setting_table()}


def keyword_text(key: str, value: object) -> str | None:
    """The keyword ``key``'s ``value`` as the text of its config key's value (None: not
    given); a value of a Python type the setting does not take raises ``Error`` (78)."""
    if value is None:
        return None
    setting = registry()[key]
    kind = setting["type"]
    if kind == "size":
        if isinstance(value, str):
            return value
        number = integer(value)
        if number is None:
            raise Error(f"{key}: {value!r} is not a size (bytes as an int, or '16MiB')", CONFIG)
        return str(number)
    if kind == "count":
        number = integer(value)
        if number is None:
            raise Error(f"{key}: {value!r} is not a count (an int)", CONFIG)
        return str(number)
    if kind == "duration":
        return _duration_text(key, value, setting)
    return _choice_text(key, value, setting)


def _duration_text(key: str, value: object, setting: dict) -> str:
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        return value
    # Any real number: int, float, numpy's scalars (registered with the numbers ABCs).
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise Error(f"{key}: {value!r} is not a duration (seconds, or '300s')", CONFIG)
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value <= 0 or value * 1000 >= 2**63:
        # NaN, infinity and negatives have no millisecond count; name what the caller wrote.
        raise Error(f"{key}: {value!r} is not a duration: seconds must be finite and more "
                    f"than 0 (at most {setting['max_text']})", CONFIG)
    if value < 0.001:
        # Durations count whole milliseconds: rounding would make it 0 ms, which reads as none.
        raise Error(f"{key}: {value!r} seconds is under the 1 ms timeouts are counted in "
                    "(at least 0.001)", CONFIG)
    return f"{round(value * 1000)}ms"


def _choice_text(key: str, value: object, setting: dict) -> str:
    # A bool is the config's own `true`/`false` where the setting has them (YAML's booleans).
    takes_bool = "true" in setting["spellings"]
    if key in _BOOL_ONLY:
        if isinstance(value, bool):
            return "true" if value else "false"
        raise Error(f"{key}: {value!r} is not True or False", CONFIG)
    if isinstance(value, bool) and takes_bool:
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    listed = ", ".join(repr(name) for name in setting["printed"])
    raise Error(f"{key}: {value!r} is not one of {listed}" + (", True, False" if takes_bool
                                                               else ""), CONFIG)


def world_of(options: Options | None, alone: object) -> dict:
    """This process's world as ``weightcast run`` detects it (the config's ``world.*``, else
    torchrun's, Slurm's or Open MPI's environment); with ``alone``, rank 0 of 1."""
    if not isinstance(alone, bool):
        raise Error(f"alone: {alone!r} is not True or False", USAGE)
    if alone:
        return {"rank": 0, "world_size": 1, "local_rank": 0, "source": "alone",
                "describe": "rank 0 of 1 (alone=True)"}
    return _core.detect_world(None if options is None else options.settings)


_busy_lock = threading.Lock()
_busy = 0


@contextlib.contextmanager
def running_on_several_ranks(several: bool) -> Iterator[None]:
    """Marks a blocking load on several ranks as running, for ``several_ranks_busy``."""
    global _busy
    if not several:
        yield
        return
    with _busy_lock:
        _busy += 1
    try:
        yield
    finally:
        with _busy_lock:
            _busy -= 1


def several_ranks_busy() -> bool:
    """Whether this process runs a load on several ranks now, blocking (from another thread)
    or a ``LoadHandle``'s: the job thread runs one at a time per process."""
    from . import _async
    with _busy_lock:
        if _busy:
            return True
    with _async._running_lock:
        return any(h._several_ranks for h in _async._running)


def resolve_world(options: Options, *, group: object, alone: object,
                  port_given: bool) -> tuple[Options, dict]:
    """This process's world and the options that say it. Where torch.distributed is
    initialised (and not ``alone``), the process group ``group`` (None: the default group) is
    the world: its rank and size, the local rank from which ranks share a node, rank 0's
    endpoint and a job token drawn by rank 0, all set as config keys the config leaves unset
    (``_torch_world``); a config that sets ``world.rank``/``world.size`` otherwise raises 78.
    Else as ``world_of``. Every rank must call it at the same point (a collective over the
    group)."""
    if not isinstance(alone, bool):
        raise Error(f"alone: {alone!r} is not True or False", USAGE)
    if not alone and several_ranks_busy():
        # Before the exchange: this rank's call would be a collective the others, still in
        # the load that runs, do not make; it would wait for them forever.
        raise Error("another load on several ranks is in progress in this process: loads on "
                    "several ranks run one at a time per process, since every rank must make "
                    "the same calls in the same order; wait for it first", USAGE)
    explicit = dict(_core.explicit_keys(options.settings))
    tw = _torch_world.of_group(group, alone, explicit, port_given)
    if tw is None:
        return options, world_of(options, alone)
    tw.check_config(_core.detect_world(options.settings), explicit)
    options = options.with_group(tw.overrides(explicit))
    return options, _core.detect_world(options.settings)


def ranked(error: Error, world: dict | None) -> Error:
    """A local error raised on one rank of several, before its job started, names the rank
    as the job's own messages do ("rank 2: ...")."""
    if world is None or world["world_size"] <= 1 or str(error).startswith("rank "):
        return error
    return Error(f"rank {world['rank']}: {error}", error.status)


def own_world(config: object, alone: object, group: object = None) -> dict | None:
    """This process's world, for a message's rank prefix; None when it cannot be told. Where
    torch.distributed is initialised, its group's rank and size (no collective)."""
    if alone is True:
        return None
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return {"rank": dist.get_rank(group), "world_size": dist.get_world_size(group)}
    except Exception:
        pass
    try:
        return _core.detect_world(None if config is None else fs_path(config, "config"))
    except Exception:
        return None


def check_placement(placement: object) -> None:
    names = registry()["placement"]["printed"]
    if placement is not None and placement not in names:
        raise Error(f"placement: {placement!r} is not one of "
                    f"{', '.join(repr(name) for name in names)}", CONFIG)


def checked_port(value: object) -> int | None:
    """The type here; the range is the config key ``rendezvous.port``'s (the settings registry),
    checked in every world, also where a world of one never uses the port."""
    if value is None:
        return None
    number = integer(value)
    if number is None:
        port = registry()["rendezvous.port"]
        raise Error(f"rendezvous_port: {value!r} is not a TCP port (an int, {port['min']} to "
                    f"{port['max']})", CONFIG)
    value = number
    try:
        _core.check_setting("rendezvous.port", str(value))
    except Error as e:  # the config's words, named as the caller wrote the keyword
        raise Error("rendezvous_port: " + str(e).split(": ", 1)[-1], e.status) from None
    return value


def fs_path(path: object, what: str) -> bytes:
    """A path as the OS spells it: bytes (``os.fsencode``), so a name that is not UTF-8 (a str
    with surrogate escapes, as ``os.listdir`` returns it) or a bytes path opens too."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{what}: expected a str, bytes or os.PathLike path, not "
                        f"{type(path).__name__}")
    return os.fsencode(path)


def check_progress(progress: object) -> None:
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise Error(f"progress: {progress!r} is not None, True, False or a callable", CONFIG)


def progress_hook(progress: object, rank: int,
                  record: Callable[[_progress.Progress], None] | None = None
                  ) -> Callable[..., None] | None:
    """The extension's progress callback for the keyword ``progress``: the caller's callable,
    the bar, or None (no updates at all). ``record``, when given (a ``LoadHandle``'s), gets
    every update first, whatever ``progress`` says."""
    check_progress(progress)
    if callable(progress):
        user = progress
    elif _progress.wants_bar(progress, rank):
        user = _progress.Bar()
    else:
        user = None
    if record is None:
        return None if user is None else lambda *args: user(_progress.Progress(*args))

    def hook(*args: Any) -> None:
        update = _progress.Progress(*args)
        record(update)
        if user is not None:
            user(update)

    return hook


@dataclass(frozen=True)
class Options:
    """The keywords ``load`` and ``load_into`` share, checked: ``config`` (the file's path, or
    None) and ``settings``, the extension's ``Settings``: the config file read once, then the
    keywords (chunk_size, buffer_depth, io_depth, direct_io, timeout, reader, verify) as
    overrides of its keys. The world, the config's device and the load all read ``settings``."""

    config: bytes | None
    settings: Any
    overrides: tuple[tuple[str, str], ...] = ()

    @staticmethod
    def of(*, config: object, **keywords: object) -> Options:
        """``keywords``: each of ``KEYWORD_KEYS``, None where not given."""
        config_s = fs_path(config, "config") if config is not None else None
        overrides = {}
        for key in KEYWORD_KEYS:
            text = keyword_text(key, keywords.pop(key, None))
            if text is not None:
                overrides[key] = text
        if keywords:
            raise TypeError(f"Options.of: no keyword {next(iter(keywords))!r}")
        return Options(config_s, _core.settings(config_s, overrides),
                       tuple(overrides.items()))

    def with_group(self, group: dict[str, str]) -> Options:
        """These options with ``group`` (config key -> text: what a torch process group
        gives) set over them, recorded as set by the process group."""
        return Options(self.config, _core.settings(self.config, dict(self.overrides), group),
                       self.overrides)


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
            alone: bool, pieces: bool = False, handle: Any = None) -> Any:
    """This rank's part of a load on every rank (the library's ``run_job``: rank 0 reads,
    the others receive; on rank 0's node they may read their own boxes from the page cache),
    the GIL released. ``pieces``: rank 0 opens a directory of tensor pieces (torch DCP's
    sharded save), each piece its own catalogue entry. ``handle``: the ``LoadHandle`` this
    load runs for (its progress record and cancel request), None for a blocking call."""
    record = None if handle is None else handle._record
    cancel = None if handle is None else handle._cancel_request
    with caller_stream(device) as stream:
        return _core.run_job(fs_path(checkpoint, "checkpoint"), device[0], device[1],
                             options.settings, placement, rendezvous_port,
                             _on_stream(plan, stream), progress_hook(progress, rank, record),
                             PROGRESS_INTERVAL_S, alone, cuda_stream=stream_handle(stream),
                             pieces=pieces, cancel=cancel)
