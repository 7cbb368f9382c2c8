"""weightcast's exception type (``weightcast.Error``)."""

from __future__ import annotations

import errno as _errno

#: The ``<sysexits.h>`` statuses weightcast uses, by name (docs/DESIGN.md § Errors).
STATUS_NAMES = {
    64: "usage",
    65: "invalid checkpoint",
    66: "missing input",
    69: "unavailable",
    70: "internal",
    74: "io",
    75: "timeout",
    78: "config",
    130: "interrupted",
    143: "terminated",
}

USAGE = 64
INVALID_CHECKPOINT = 65
MISSING_INPUT = 66
UNAVAILABLE = 69
INTERNAL = 70
IO = 74
TIMEOUT = 75
CONFIG = 78


class Error(RuntimeError):
    """A failed weightcast call.

    ``str(error)`` is the library's one-line message: what failed and where (the file and
    offset, the tensor, the config key, the rank), and what to do where there is a remedy.
    ``status`` is the ``<sysexits.h>`` code the ``weightcast`` CLI would exit with for the same
    failure: 64 usage, 65 invalid checkpoint (also: it does not fit the model), 66 missing
    input, 69 unavailable, 70 internal, 74 I/O, 75 timeout, 78 config.

    It derives from ``RuntimeError``, which torch's ``load_state_dict`` raises for the same
    faults, so existing ``except RuntimeError`` handlers keep working. ``Error(message, 66)``
    and ``Error(message, 74)`` make the kinds below, which are also the ``OSError`` that
    ``open()`` and ``safetensors.torch.load_file`` raise for the same faults, so handlers
    written for those catch them too. Picklable (multiprocessing, torch.distributed): an
    unpickled error has the same class, message and status.
    """

    status: int

    def __new__(cls, message: str = "", status: int | None = None):
        if cls is Error and status is not None:
            cls = _KINDS.get(int(status), Error)
        # OSError's own constructor for the kinds that are one (RuntimeError's refuses them),
        # given the message alone: with two arguments it would read them as (errno, strerror).
        base = OSError if issubclass(cls, OSError) else RuntimeError
        return base.__new__(cls, message)

    def __init__(self, message: str = "", status: int | None = None) -> None:
        """``message``: the one-line message ``str(error)`` gives. ``status``: the
        ``<sysexits.h>`` code; None gives the class's own (70 for ``Error``, 66 for
        ``MissingInputError``, 74 for ``InputOutputError``)."""
        super().__init__(message)
        self.status = int(self._status if status is None else status)

    _status = INTERNAL

    @property
    def kind(self) -> str:
        """The status's short name, e.g. ``"missing input"``."""
        return STATUS_NAMES.get(self.status, "unknown")

    def __reduce__(self):  # picklable across processes (multiprocessing, torch.distributed)
        return (type(self), (str(self), self.status))


class MissingInputError(Error, FileNotFoundError):
    """``Error`` 66 (missing input): the checkpoint, a shard or the config file is not there
    (or is a directory or another non-file where a file was expected). Also a
    ``FileNotFoundError``: ``errno`` is ENOENT; ``filename`` is None (the message names the
    path)."""

    _status = MISSING_INPUT

    def __init__(self, message: str = "", status: int | None = None) -> None:
        """``message`` and ``status`` as for ``Error``; ``status`` None gives 66."""
        super().__init__(message, status)
        # errno alone: OSError's str() turns to "[Errno 2] ..." only once strerror is set too.
        self.errno = _errno.ENOENT


class InputOutputError(Error, OSError):
    """``Error`` 74 (I/O): a read failed, a file changed under the reader, or O_DIRECT was
    refused with ``direct_io="on"``. Also an ``OSError``: ``errno`` is None (the message
    carries the system's reason). ``message`` and ``status`` as for ``Error``."""

    _status = IO


_KINDS: dict[int, type[Error]] = {MISSING_INPUT: MissingInputError, IO: InputOutputError}
