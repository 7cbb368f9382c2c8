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
    def total_bytes(self) -> int:
        """Sum of all tensor sizes, bytes."""

class LoadResult:
    """A finished load: its stats, and the arena."""

    @property
    def stats(self) -> dict[str, Any]: ...
    def tensors(self) -> list[tuple[str, str, Any]]:
        """(name, dtype, tensor) per tensor; the arena then belongs to the tensors."""

def open_checkpoint(path: str) -> Catalogue:
    """Opens and validates a checkpoint's headers (weightcast::open_checkpoint)."""

def load(catalogue: Catalogue, device: str, ordinal: int, config: str | None,
         chunk_size: str | None, buffer_depth: int | None, io_depth: int | None,
         direct_io: str | None, timeout: str | None, reader: str | None,
         progress: Callable[..., None] | None, progress_interval_s: float) -> LoadResult:
    """Loads a catalogue into a host or CUDA arena on this process (world size 1)."""

def detect_world(config: str | None) -> dict[str, Any]:
    """This process's world: the config's world.* keys, else torchrun, Slurm, Open MPI."""

def config_device(config: str) -> str:
    """The ``device`` key of a config file: auto, host or cuda."""

def cuda_device_count() -> int:
    """CUDA devices this process can use; 0 without CUDA in the build or a driver."""

def live_arenas() -> int:
    """Arenas currently owned by tensors handed out (for lifetime tests)."""

def build_info() -> dict[str, Any]:
    """What this build has: version, cuda, mpi."""
