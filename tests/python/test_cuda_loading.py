"""The CUDA runtime and NCCL are loaded at run time, never at import: the extension links
neither, `import weightcast` works where neither can be found, and `device="cuda"` there is a
clear error (status 69) naming what was looked for. Each case runs in a child interpreter,
because a process keeps the outcome of its first search."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import weightcast
from weightcast import _weightcast

MISSING = {"WEIGHTCAST_CUDART": "/nonexistent/libcudart.so.13",
           "WEIGHTCAST_NCCL": "/nonexistent/libnccl.so.2"}


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **MISSING}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) not found")
def test_the_extension_links_neither_the_cuda_runtime_nor_nccl():
    out = subprocess.run(["readelf", "-d", _weightcast.__file__], capture_output=True,
                         text=True, check=True).stdout
    needed = [line for line in out.splitlines() if "(NEEDED)" in line]
    assert needed, out
    assert not [line for line in needed if "libcudart" in line or "libnccl" in line], needed


def test_import_works_without_a_cuda_runtime_to_load():
    r = _run("import weightcast\n"
             "maps = open('/proc/self/maps').read()\n"
             "print(weightcast.build_info()['version'])\n"
             "print('libcudart' in maps or 'libnccl' in maps)")
    assert r.returncode == 0, r.stderr
    # Nothing of CUDA is loaded at import: the first CUDA use loads it.
    assert r.stdout.split() == [weightcast.__version__, "False"], r.stdout


def test_device_cuda_without_a_cuda_runtime_is_a_clear_error(tmp_path):
    code = f"""
import sys, torch, weightcast
from safetensors.torch import save_file
save_file({{"x": torch.ones(3)}}, {str(tmp_path / "a.safetensors")!r})
try:
    weightcast.load({str(tmp_path / "a.safetensors")!r}, device="cuda")
except weightcast.Error as e:
    print(e.status)
    print(e)
    sys.exit(0)
print("loaded")
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    status, _, message = r.stdout.partition("\n")
    assert status == "69", r.stdout
    if weightcast.build_info()["cuda"]:
        # The override is the only place looked in: the message names it and why it failed.
        assert "CUDA runtime (libcudart) not found" in message, message
        assert "/nonexistent/libcudart.so.13 (WEIGHTCAST_CUDART)" in message, message
    else:
        assert "this build has no CUDA" in message, message


def _console_script() -> str | None:
    """The `weightcast` console script of this interpreter's environment, where the package
    was installed from the wheel (which carries the CLI binary); else None."""
    from weightcast import _cli

    script = os.path.join(os.path.dirname(sys.executable), "weightcast")
    if os.access(script, os.X_OK) and os.access(_cli.binary(), os.X_OK):
        return script
    return None


def _torch_cudart() -> str | None:
    """The CUDA runtime of torch's nvidia-* wheels in this environment, else None."""
    for folder in weightcast._torch_cuda_library_dirs():
        for name in ("libcudart.so.13", "libcudart.so.12"):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
    return None


@pytest.mark.skipif(_console_script() is None,
                    reason="no `weightcast` console script with its CLI binary here (the wheel "
                           "installs both; scripts/test_python.sh builds the extension only)")
@pytest.mark.skipif(not weightcast.build_info()["cuda"], reason="this build has no CUDA")
@pytest.mark.skipif(_torch_cudart() is None,
                    reason="no CUDA runtime from torch's nvidia-* wheels in this environment")
def test_the_console_script_cli_loads_torchs_cuda_runtime():
    # The binary cannot ask Python where torch's wheels are: the console script passes their
    # folders (WEIGHTCAST_CUDA_LIBRARY_DIRS), ahead of the system's CUDA runtime.
    env = {k: v for k, v in os.environ.items()
           if k not in ("WEIGHTCAST_CUDART", "WEIGHTCAST_CUDA_LIBRARY_DIRS", "LD_LIBRARY_PATH")}
    r = subprocess.run([_console_script(), "--version"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    loaded = [line for line in r.stdout.splitlines() if line.startswith("loaded: ")]
    assert loaded, r.stdout
    expected = _torch_cudart()
    assert loaded[0].startswith(f"loaded: {expected};"), (loaded[0], expected)
