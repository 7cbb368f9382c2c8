"""The arena lives exactly as long as the last tensor viewing it (one DLPack capsule owns it)."""

from __future__ import annotations

import gc
import weakref

import torch
from safetensors.torch import save_file

import weightcast
from weightcast import _weightcast


def _checkpoint(tmp_path):
    ref = {"a": torch.randn(128, 64), "b": torch.arange(10, dtype=torch.int64),
           "c": torch.tensor(3.0), "d": torch.randn(5).to(torch.float8_e4m3fn),
           "e": torch.empty(0)}
    path = tmp_path / "l.safetensors"
    save_file(ref, str(path))
    return path, ref


def test_the_arena_goes_with_its_last_tensor(tmp_path):
    gc.collect()
    base = _weightcast.live_arenas()
    path, ref = _checkpoint(tmp_path)
    tensors = weightcast.load(path)
    assert _weightcast.live_arenas() == base + 1
    keep = tensors["b"]
    refs = {k: weakref.ref(v) for k, v in tensors.items()}
    del tensors
    gc.collect()
    assert refs["b"]() is keep
    assert all(r() is None for k, r in refs.items() if k != "b")
    # One tensor still views the arena: it stays, with its bytes intact.
    assert _weightcast.live_arenas() == base + 1
    assert torch.equal(keep, ref["b"])
    view = keep[2:5]  # a view of a view keeps it too
    del keep
    gc.collect()
    assert _weightcast.live_arenas() == base + 1
    assert view.tolist() == [2, 3, 4]
    del view
    gc.collect()
    assert _weightcast.live_arenas() == base


def test_views_by_dtype_and_numpy_keep_the_arena(tmp_path):
    gc.collect()
    base = _weightcast.live_arenas()
    path, ref = _checkpoint(tmp_path)
    tensors = weightcast.load(path)
    f8 = tensors["d"]  # viewed from uint8 inside load: the view keeps the capsule
    arr = tensors["a"].numpy()
    del tensors
    gc.collect()
    assert _weightcast.live_arenas() == base + 1
    assert (arr == ref["a"].numpy()).all()
    assert torch.equal(f8.view(torch.uint8), ref["d"].view(torch.uint8))
    del arr, f8
    gc.collect()
    assert _weightcast.live_arenas() == base


def test_arenas_of_separate_loads_are_separate(tmp_path):
    gc.collect()
    base = _weightcast.live_arenas()
    path, _ = _checkpoint(tmp_path)
    one, two = weightcast.load(path), weightcast.load(path)
    assert _weightcast.live_arenas() == base + 2
    one["a"].zero_()
    assert not torch.equal(one["a"], two["a"])  # no sharing between loads
    del one
    gc.collect()
    assert _weightcast.live_arenas() == base + 1
    del two
    gc.collect()
    assert _weightcast.live_arenas() == base


def test_a_failed_load_leaks_no_arena(tmp_path):
    gc.collect()
    base = _weightcast.live_arenas()
    try:
        weightcast.load(tmp_path / "missing.safetensors")
    except weightcast.Error:
        pass
    gc.collect()
    assert _weightcast.live_arenas() == base


def test_a_forked_child_loads_on_a_job_thread_of_its_own(tmp_path):
    """load_into runs on the module's job thread, which a fork() does not copy: the child
    forgets the parent's, loads on a new one, and its exit joins only its own (a join of the
    parent's would hang it)."""
    import os
    import time

    path, ref = _checkpoint(tmp_path)
    dest = {"a": torch.zeros(128, 64)}
    weightcast.load_into(dest, path, strict=False)  # the parent's job thread now exists
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only an exit status
        status = 1
        try:
            mine = {"b": torch.zeros(10, dtype=torch.int64)}
            weightcast.load_into(mine, path, strict=False)
            _weightcast.shutdown()  # what atexit runs
            status = 0 if torch.equal(mine["b"], ref["b"]) else 2
        finally:
            os._exit(status)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    assert torch.equal(dest["a"], ref["a"])
