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
