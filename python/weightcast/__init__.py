"""weightcast: load safetensors checkpoints into PyTorch, zero-copy and in place.

``weightcast.load(path)`` returns every tensor as a ``torch.Tensor`` viewing weightcast's
arena (no copy); ``weightcast.load_into(model, path)`` writes a checkpoint into a model's own
parameters and buffers, casting dtypes on landing, and reports missing and unexpected keys as
``load_state_dict`` does. Errors are ``weightcast.Error`` with the CLI's ``status``.

``import weightcast`` does not import torch; the calls that return or take tensors do.
The API reference is docs/python.md; the signatures and their documentation are in
``weightcast/__init__.pyi``.
"""

from __future__ import annotations

from . import _weightcast
from ._api import LoadReport, load, load_into
from ._errors import Error
from ._progress import Progress

__version__: str = _weightcast.build_info()["version"]

__all__ = ["Error", "LoadReport", "Progress", "build_info", "load", "load_into"]


def build_info() -> dict[str, object]:
    """What this build has: ``version`` (str), ``cuda`` and ``mpi`` (bool)."""
    return dict(_weightcast.build_info())
