"""weightcast's exception type (``weightcast.Error``)."""

from __future__ import annotations

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
    faults, so existing ``except RuntimeError`` handlers keep working.
    """

    status: int

    def __init__(self, message: str, status: int = INTERNAL) -> None:
        super().__init__(message)
        self.status = int(status)

    @property
    def kind(self) -> str:
        """The status's short name, e.g. ``"missing input"``."""
        return STATUS_NAMES.get(self.status, "unknown")

    def __reduce__(self):  # picklable across processes (multiprocessing, torch.distributed)
        return (type(self), (str(self), self.status))
