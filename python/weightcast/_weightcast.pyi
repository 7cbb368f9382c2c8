"""weightcast's C++ core (internal; use the ``weightcast`` package)."""

from typing import Any, Callable

class Catalogue:
    """A checkpoint's tensors, as read from its headers."""

    @property
    def tensors(self) -> list[dict[str, Any]]:
        """Every tensor (dicts: name, dtype, shape, bytes, shard), file order."""
    @property
    def shards(self) -> list[str]:
        """The shard files' resolved paths."""
    @property
    def metadata(self) -> dict[str, str]:
        """``__metadata__`` of every shard merged (first shard wins)."""
    @property
    def pieces(self) -> list[dict[str, Any]]:
        """Per tensor entry, where it lies in its tensor (dicts: tensor, offset, global_shape)
        when opened with ``pieces=True`` from a directory of pieces; else empty."""
    @property
    def total_bytes(self) -> int:
        """Sum of all tensor sizes, bytes."""

class LoadResult:
    """A finished load: its stats, and the arena."""

    @property
    def stats(self) -> dict[str, Any]: ...
    @property
    def rank(self) -> int:
        """This rank."""
    @property
    def world_size(self) -> int:
        """The number of ranks of the load."""
    @property
    def verdict(self) -> str:
        """Rank 0's verdict of a job, the same on every rank ("" for ``load``)."""
    def tensors(self) -> list[tuple[str, str, Any, tuple[int, ...]]]:
        """(name, dtype, tensor, shape) per tensor (a placed load: per local shard, its local
        shape); the arena then belongs to the tensors."""

def open_checkpoint(path: bytes, pieces: bool = False) -> Catalogue:
    """Opens and validates a checkpoint's headers (weightcast::open_checkpoint); ``path`` as
    ``os.fsencode`` gives it (a file name need not be UTF-8). ``pieces``: a directory of
    tensor pieces (torch DCP's sharded save) opens with each piece its own entry
    (CheckpointPieces::separate); otherwise it is refused (66)."""

class Settings:
    """A call's configuration, read once: a config file's keys, then the keywords over them
    (each the override of its config key)."""

def settings(config: bytes | None, overrides: dict[str, str],
             group: dict[str, str] = ...) -> Settings:
    """Reads the config file (if any) once, then each override (config key -> the text of its
    value, in the dict's order) over it: the config's rules and messages (``Error``, status
    78, "keyword chunk_size=0: '0' is out of range (...)"); then ``group``'s (the keys a torch
    process group gives), recorded as set by "torch.distributed's process group"."""

def explicit_keys(settings: Settings) -> dict[str, str]:
    """The config keys ``settings`` set, each with where ("x.yaml:7", or the override's
    origin); a key left at its default is absent."""

def setting_table() -> list[dict[str, Any]]:
    """Every config key of the settings registry (core/settings.hpp), as dicts: name, type,
    default (as the config spells it), min, max, min_text, max_text (as range messages spell
    them; None where unbounded), spellings (a choice's), printed (one per value), what, doc."""

def device_kind(text: str) -> str | None:
    """The device kind ('host' or 'cuda') a device name means, exactly as spelt: the config's
    spellings and torch's 'cpu'; None for any other ('auto' too)."""

class Cancel:
    """A request to stop a load (``LoadHandle.cancel()``): set from any thread, read by the
    load every 50 ms."""

    def __init__(self) -> None: ...
    def cancel(self) -> None:
        """Requests the stop; the load then raises ``Error`` 130 within moments."""
    @property
    def requested(self) -> bool:
        """Whether ``cancel()`` was called."""

def load(catalogue: Catalogue, device: str, ordinal: int, settings: Settings,
         progress: Callable[..., None] | None, progress_interval_s: float,
         cuda_stream: int | None = None, cancel: Cancel | None = None) -> LoadResult:
    """Loads a catalogue into a host or CUDA arena on this process (world size 1). The load
    writes after the work queued on ``cuda_stream`` (a ``cudaStream_t`` as an int; 0 is CUDA's
    default stream, ordered like any other; None: no stream) and that stream waits for the
    load's writes (LoadOptions::cuda_stream). ``cudaStreamPerThread`` (2) is refused (78).
    ``cancel``: once set, the load stops and raises 130."""

def run_job(checkpoint: bytes, device: str, ordinal: int, settings: Settings,
            placement: str | None, rendezvous_port: int | None,
            plan: Callable[[Catalogue, int, int], list[tuple] | None] | None,
            progress: Callable[..., None] | None, progress_interval_s: float,
            alone: bool = False, cuda_stream: int | None = None,
            pieces: bool = False, cancel: Cancel | None = None) -> LoadResult:
    """This rank's part of a load on every rank of the world (weightcast::run_job); rank 0
    alone reads the checkpoint; with ``alone``, a world of one rank whatever the launcher's
    environment says; ``cuda_stream`` as for ``load``. Every rank's checkpoint, as given,
    must be rank 0's (78 otherwise); a second call on several ranks while one runs in this
    process raises 64. ``progress``
    runs on a thread of its own, never holding the load. ``plan(catalogue, rank,
    world_size)``, on every rank once the catalogue is known, may raise (``Error`` ends every
    rank with its status) and returns None (``placement`` decides) or this rank's wants:
    (name, offset, shape, data_ptr, capacity_bytes, "host"|"cuda", dtype name or None)
    tuples, landing in place. ``pieces``: rank 0 opens a directory of tensor pieces as
    ``open_checkpoint`` does with ``pieces=True``. ``cancel``: as for ``load``; every rank
    ends with this rank's message (130)."""

def after_fork_in_child() -> None:
    """Forgets the parent's job thread and MPI session in a forked child (os.register_at_fork)."""

def shutdown() -> None:
    """Finalises MPI if weightcast initialised it and ends the job thread (atexit)."""

def detect_world(config: Settings | bytes | None) -> dict[str, Any]:
    """This process's world: the settings' (or a config file's) world.* keys, else torchrun,
    Slurm, Open MPI."""

def config_device(settings: Settings) -> str:
    """The ``device`` key of the settings' config: auto, host or cuda."""

def check_setting(key: str, value: str) -> None:
    """Checks one config key's value as a keyword override: the config's rule and message
    (Error, status 78, "keyword key=value: " and the reason)."""

def cuda_device_count() -> int:
    """CUDA devices this process can use; 0 without CUDA in the build, a CUDA runtime to load,
    or a driver."""

def set_cuda_library_dirs(dirs: list[str]) -> None:
    """Folders to look in for the CUDA runtime and NCCL before the system's (torch's nvidia-*
    wheels); only before the first CUDA use. Does nothing without CUDA."""

def live_arenas() -> int:
    """Arenas currently owned by tensors handed out (for lifetime tests)."""

def build_info() -> dict[str, Any]:
    """What this build has: version, cuda, mpi."""
