"""The `weightcast` console script of the wheel: execs the CLI binary the wheel carries.

The binary lies beside this file (pyproject.toml, python/CMakeLists.txt). The process is
replaced, not wrapped: signals, the exit status and the terminal are the binary's own, and
`weightcast launch`, which re-executes itself for each rank, finds the binary through
/proc/self/exe, not this script. Importing this module loads neither the extension nor torch.
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
    # argv[0] stays the name the user typed, as messages and --help show it.
    os.execv(path, [os.path.basename(sys.argv[0]) or "weightcast", *sys.argv[1:]])


if __name__ == "__main__":
    main()
