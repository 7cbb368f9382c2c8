"""A one-line progress renderer for loads on a terminal (torch has no progress bar of its own
and tqdm is no torch dependency, so the package carries this small one)."""

from __future__ import annotations

import sys

from typing import IO, NamedTuple


class Progress(NamedTuple):
    """How far a load has come on this rank (passed to a ``progress=`` callable).

    Attributes:
        bytes_done: tensor bytes landed on this rank so far.
        bytes_total: tensor bytes of the whole load.
        chunks_done: chunks landed so far.
        chunks_total: chunks in the plan.
        seconds: since the pipeline started.
        shard: file name of the shard the last chunk came from.
    """

    bytes_done: int
    bytes_total: int
    chunks_done: int
    chunks_total: int
    seconds: float
    shard: str


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


class Bar:
    """Redraws one line on ``stream`` (``\\r``), ends it with a newline when the load ends."""

    def __init__(self, stream: IO[str] | None = None, label: str = "weightcast") -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._label = label
        self._ended = False

    def __call__(self, p: Progress) -> None:
        frac = p.bytes_done / p.bytes_total if p.bytes_total else 1.0
        width = 24
        filled = int(frac * width)
        gbps = p.bytes_done / p.seconds / 1e9 if p.seconds > 0 else 0.0
        line = (
            f"\r{self._label} [{'#' * filled}{'.' * (width - filled)}] {frac * 100:5.1f}% "
            f"{_gib(p.bytes_done)}/{_gib(p.bytes_total)} GiB {gbps:6.2f} GB/s {p.shard}"
        )
        self._stream.write(line[:200] + "\x1b[K")
        if p.chunks_done >= p.chunks_total and not self._ended:
            self._stream.write("\n")
            self._ended = True
        self._stream.flush()


def wants_bar(progress: object, rank: int) -> bool:
    """``progress=None`` (auto): a bar on rank 0 when stderr is a terminal."""
    if progress is None:
        try:
            return rank == 0 and sys.stderr is not None and sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(progress)


