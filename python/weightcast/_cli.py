"""The `weightcast` console script of the wheel: execs the CLI binary the wheel carries.

The binary lies beside this file (pyproject.toml, python/CMakeLists.txt). The process is
replaced, not wrapped: signals, the exit status and the terminal are the binary's own, and
`weightcast launch`, which re-executes itself for each rank, finds the binary through
/proc/self/exe, not this script. It never imports torch.

The binary cannot ask Python where torch's CUDA runtime and NCCL are (`import weightcast`
passes their folders to the extension itself): they go to it, and to every rank `launch`
starts, in WEIGHTCAST_CUDA_LIBRARY_DIRS (docs/gpu.md § Build), after any folders the caller
put there.
"""

from __future__ import annotations

import os
import sys


def binary() -> str:
    """The path of the CLI binary in the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "weightcast")


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        # A package installed with `pip install` from a clone with WEIGHTCAST_SELF_CONTAINED=OFF
        # (scripts/test_python.sh) has the extension only.
        sys.exit(f"weightcast: this installation has no CLI binary ({path} is missing); "
                 "build the wheel (scripts/wheel.sh) or use the build tree's weightcast")
    from . import _torch_cuda_library_dirs

    env = dict(os.environ)
    dirs = [d for d in env.get("WEIGHTCAST_CUDA_LIBRARY_DIRS", "").split(":") if d]
    dirs += [d for d in _torch_cuda_library_dirs() if d not in dirs]
    if dirs:
        env["WEIGHTCAST_CUDA_LIBRARY_DIRS"] = ":".join(dirs)
    # argv[0] stays the name the user typed, as messages and --help show it.
    os.execve(path, [os.path.basename(sys.argv[0]) or "weightcast", *sys.argv[1:]], env)


if __name__ == "__main__":
    main()
