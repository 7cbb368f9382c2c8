"""weightcast: load safetensors checkpoints into PyTorch (the reference: docs/python.md)."""

import datetime
import os
from typing import Any, Callable, Generic, Mapping, NamedTuple, TypeVar, Union

import torch

__version__: str

PathLike = Union[str, bytes, os.PathLike[str], os.PathLike[bytes]]
KeyMap = Union[str, Mapping[str, str], Callable[[str], Union[str, None]], None]
_T = TypeVar("_T")

class Error(RuntimeError):
    """A failed weightcast call, with the CLI's ``<sysexits.h>`` ``status``."""

    status: int
    def __init__(self, message: str = "", status: int | None = None) -> None:
        """An error of ``message``; ``status`` None: the class's own."""
    @property
    def kind(self) -> str:
        """The status's short name, e.g. ``"missing input"``."""

class MissingInputError(Error, FileNotFoundError):
    """Status 66 (missing input), also a ``FileNotFoundError``."""

class InputOutputError(Error, OSError):
    """Status 74 (I/O), also an ``OSError``."""

class Progress(NamedTuple):
    """How far a load has come on this rank (passed to a ``progress=`` callable)."""

    bytes_done: int
    bytes_total: int
    chunks_done: int
    chunks_total: int
    seconds: float
    shard: str

class LoadReport:
    """What ``load_into`` did, in ``load_state_dict``'s words plus what it measured."""

    missing_keys: list[str]
    unexpected_keys: list[str]
    loaded_keys: list[str]
    cast_keys: list[str]
    staged_keys: list[str]
    bytes: int
    seconds: float
    verdict: str
    def __init__(self, missing_keys: list[str] = ..., unexpected_keys: list[str] = ...,
                 loaded_keys: list[str] = ..., cast_keys: list[str] = ...,
                 staged_keys: list[str] = ..., bytes: int = ...,
                 seconds: float = ..., verdict: str = ...) -> None: ...

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
    progress: bool | Callable[[Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    unsupported_dtypes: str = "error",
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors checkpoint, on this rank or on every rank."""

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
    progress: bool | Callable[[Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> LoadReport:
    """Loads a checkpoint into the caller's own tensors, in place."""

class LoadHandle(Generic[_T]):
    """A load running in the background (``load_async``, ``load_into_async``)."""

    def done(self) -> bool:
        """Whether the load has ended (loaded, failed or cancelled); never blocks."""
    @property
    def progress(self) -> Progress | None:
        """The latest ``Progress`` of the load on this rank; None before the first."""
    def cancel(self) -> None:
        """Requests that the load stop; ``wait()`` then raises ``Error`` 130."""
    def wait(self, timeout: float | None = None) -> _T:
        """The blocking call's result; raises its ``Error``, or ``TimeoutError`` when
        ``timeout`` seconds pass first (the load continues)."""

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
    progress: bool | Callable[[Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    unsupported_dtypes: str = "error",
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> LoadHandle[dict[str, torch.Tensor]]:
    """Starts ``load`` in the background; returns its ``LoadHandle`` at once."""

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
    progress: bool | Callable[[Progress], None] | None = None,
    reader: str | None = None,
    verify: bool | None = None,
    rendezvous_port: int | None = None,
    alone: bool = False,
    group: Any = None,
) -> LoadHandle[LoadReport]:
    """Starts ``load_into`` in the background; returns its ``LoadHandle`` at once."""

def build_info() -> dict[str, object]:
    """What this build has: ``version`` (str), ``cuda`` and ``mpi`` (bool)."""

__all__ = ["Error", "InputOutputError", "LoadHandle", "LoadReport", "MissingInputError",
           "Progress", "build_info", "load", "load_async", "load_into", "load_into_async"]
