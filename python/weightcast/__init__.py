"""weightcast: load safetensors checkpoints into PyTorch, zero-copy and in place.

``weightcast.load(path)`` returns every tensor as a ``torch.Tensor`` viewing weightcast's
arena (no copy); ``weightcast.load_into(model, path)`` writes a checkpoint into a model's own
parameters and buffers, casting dtypes on landing, and reports missing and unexpected keys as
``load_state_dict`` does. Errors are ``weightcast.Error`` with the CLI's ``status``.

``import weightcast`` does not import torch; the calls that return or take tensors do.
The API reference is docs/python.md; ``help(weightcast.load)`` and the like show each
name's documentation, and ``weightcast/__init__.pyi`` holds the typed signatures.
"""

from __future__ import annotations

import sys as _sys


def _torch_cuda_library_dirs() -> list[str]:
    """The folders of the CUDA runtime and NCCL of torch's CUDA wheels (nvidia-*), where
    installed; found without importing torch.

    The extension loads both at its first CUDA use (never at import: a host without them
    imports weightcast all the same), looking in these folders before the system's. The first
    library of a soname loaded in a process serves every later user: had the system's (older)
    NCCL been loaded first, `import torch` afterwards fails (libtorch_cuda.so: undefined
    symbol ncclCommResume). Torch's copies first keep torch working in either import order,
    and both then run one NCCL, the one torch was built for (a communicator torch made must
    be driven by it).
    """
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    dirs = []
    for root in spec.submodule_search_locations:
        # cu13/lib: CUDA 13's wheels (nvidia-cuda-runtime 13); cuda_runtime/lib: CUDA 12's.
        for sub in ("cu13/lib", "cuda_runtime/lib", "nccl/lib"):
            path = os.path.join(root, sub)
            if os.path.isdir(path):
                dirs.append(path)
    return dirs


from . import _weightcast  # noqa: E402

_weightcast.set_cuda_library_dirs(_torch_cuda_library_dirs())

import atexit as _atexit  # noqa: E402
import os as _os  # noqa: E402

# MPI, once a load on several ranks has initialised it, lives until the interpreter exits
# (a process initialises MPI once); it is finalised here, on the thread that initialised it.
_atexit.register(_weightcast.shutdown)
# A forked child (a DataLoader worker) has no copy of the job thread, and may not use the
# parent's MPI: it forgets both rather than join or finalise them.
_os.register_at_fork(after_in_child=_weightcast.after_fork_in_child)
from ._api import LoadReport, load, load_async, load_into, load_into_async  # noqa: E402
from ._async import LoadHandle  # noqa: E402
from ._errors import Error, InputOutputError, MissingInputError  # noqa: E402
from ._progress import Progress  # noqa: E402

__version__: str = _weightcast.build_info()["version"]

__all__ = ["Error", "InputOutputError", "LoadHandle", "LoadReport", "MissingInputError",
           "Progress", "build_info", "load", "load_async", "load_into", "load_into_async"]


def build_info() -> dict[str, object]:
    """What this build has: ``version`` (str), ``cuda`` and ``mpi`` (bool)."""
    return dict(_weightcast.build_info())
