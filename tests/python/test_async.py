"""``load_async`` and ``load_into_async``: the handle comes back at once, ``wait()`` gives
the blocking call's result bit-exact, its error with its status, ``TimeoutError`` while the
load continues; ``cancel()`` and Ctrl-C in ``wait()`` stop it; a dropped handle's load ends
cleanly, also at interpreter exit. The same on several ranks: test_multirank_async.py."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

import weightcast
from conftest import assert_same, raw_bytes, write_safetensors
from weightcast import _weightcast


def _slow(tmp_path, mib: int = 64):
    """A checkpoint whose load at 256-byte chunks runs for a good while (262,144 chunks per
    64 MiB), and the keywords that make it slow."""
    path = write_safetensors(tmp_path / "big.safetensors",
                             {"w": ("U8", [mib << 20], bytes(range(256)) * (mib << 12))})
    return path, {"chunk_size": 256, "direct_io": False, "progress": False}


def _small(tmp_path):
    data = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    half = torch.linspace(-3, 3, 10, dtype=torch.float32).to(torch.bfloat16)
    return write_safetensors(tmp_path / "s.safetensors", {
        "a": ("F32", [4, 6], raw_bytes(data)),
        "b": ("BF16", [10], raw_bytes(half)),
        "c": ("U8", [3], b"xyz"),
    })


def test_load_async_returns_at_once_and_wait_gives_the_blocking_result(tmp_path):
    path, slow = _slow(tmp_path, 16)
    started = time.monotonic()
    handle = weightcast.load_async(path, **slow)
    returned_after = time.monotonic() - started
    assert isinstance(handle, weightcast.LoadHandle)
    # The load takes seconds at this chunk size; the call returns long before.
    assert not handle.done(), "the load ended before the call returned"
    assert returned_after < 0.5, returned_after
    got = handle.wait()
    assert handle.done()
    want = weightcast.load(path, **slow)
    assert_same(got, want)
    # wait() again: the same result, at once.
    assert handle.wait() is got


def test_done_flips_and_progress_follows_the_load(tmp_path):
    path, slow = _slow(tmp_path, 16)
    handle = weightcast.load_async(path, **slow)
    assert handle.progress is None or handle.progress.bytes_done < handle.progress.bytes_total
    seen = []
    while not handle.done():
        if handle.progress is not None:
            seen.append(handle.progress.bytes_done)
        time.sleep(0.02)
    handle.wait()
    # The last update is the last chunk's, and updates came while the load ran.
    last = handle.progress
    assert isinstance(last, weightcast.Progress)
    assert last.bytes_done == last.bytes_total == 16 << 20
    assert last.chunks_done == last.chunks_total
    assert seen and seen == sorted(seen) and seen[0] < last.bytes_total


def test_a_progress_callable_still_gets_its_updates(tmp_path):
    path = _small(tmp_path)
    updates = []
    handle = weightcast.load_async(path, progress=updates.append)
    handle.wait()
    assert updates and updates[-1] == handle.progress


def test_load_into_async_matches_load_into_bit_exact(tmp_path):
    path = _small(tmp_path)
    # A BF16 checkpoint tensor into an FP32 destination: cast on landing, as load_into.
    mine = {"a": torch.zeros(4, 6), "b": torch.zeros(10, dtype=torch.float32),
            "c": torch.zeros(3, dtype=torch.uint8)}
    theirs = {k: torch.zeros_like(v) for k, v in mine.items()}
    handle = weightcast.load_into_async(mine, path, progress=False)
    report = handle.wait()
    want = weightcast.load_into(theirs, path, progress=False)
    assert isinstance(report, weightcast.LoadReport)
    assert report.loaded_keys == want.loaded_keys == ["a", "b", "c"]
    assert report.cast_keys == want.cast_keys == ["b"]
    assert report.missing_keys == report.unexpected_keys == []
    assert report.bytes == want.bytes
    assert_same(mine, theirs)
    assert raw_bytes(mine["c"]) == b"xyz"


def test_load_into_async_on_a_module(tmp_path):
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    path = tmp_path / "m.safetensors"
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(path))
    dst = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    handle = weightcast.load_into_async(dst, path, progress=False)
    # Other torch work meanwhile, on other tensors.
    x = torch.randn(64, 64)
    for _ in range(20):
        x = torch.tanh(x @ x.T / 64)
    report = handle.wait()
    assert sorted(report.loaded_keys) == sorted(src.state_dict())
    assert_same(dst.state_dict(), src.state_dict())


def test_wait_with_a_timeout_raises_timeout_error_and_the_load_continues(tmp_path):
    path, slow = _slow(tmp_path)
    handle = weightcast.load_async(path, **slow)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="continues"):
        handle.wait(timeout=0.01)
    assert time.monotonic() - started < 1.0
    assert not handle.done()
    got = handle.wait()  # the same load, to its end
    assert raw_bytes(got["w"]) == bytes(range(256)) * (64 << 12)
    # A finished load: a zero timeout returns at once.
    assert handle.wait(timeout=0) is got


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1s", True])
def test_a_bad_wait_timeout_is_64(tmp_path, timeout):
    handle = weightcast.load_async(_small(tmp_path), progress=False)
    with pytest.raises(weightcast.Error) as e:
        handle.wait(timeout=timeout)
    assert e.value.status == 64 and "timeout" in str(e.value)
    handle.wait()


def test_wait_from_the_loads_own_progress_callable_is_64_not_a_hang(tmp_path):
    path, slow = _slow(tmp_path, 16)
    seen: list = []
    holder: list = []

    def progress(p):
        if holder and not seen:
            try:
                holder[0].wait()
                seen.append(None)
            except weightcast.Error as e:
                seen.append(e)

    holder.append(weightcast.load_async(path, **{**slow, "progress": progress}))
    holder[0].wait(timeout=60)
    assert seen and seen[0] is not None and seen[0].status == 64, seen
    assert "wait for itself" in str(seen[0])


def test_a_missing_checkpoint_raises_from_wait_with_its_status(tmp_path):
    handle = weightcast.load_async(tmp_path / "nope.safetensors")
    with pytest.raises(weightcast.Error) as e:
        handle.wait()
    assert e.value.status == 66 and isinstance(e.value, FileNotFoundError)
    assert "nope.safetensors" in str(e.value)
    assert handle.done()
    # Again: the same error.
    with pytest.raises(weightcast.Error) as again:
        handle.wait()
    assert again.value is e.value

    handle = weightcast.load_into_async({"a": torch.zeros(1)}, tmp_path / "nope.safetensors")
    with pytest.raises(weightcast.MissingInputError):
        handle.wait()


def test_a_bad_key_raises_from_wait_naming_it(tmp_path):
    path = _small(tmp_path)
    dest = {"a": torch.zeros(4, 6), "extra": torch.zeros(2)}
    handle = weightcast.load_into_async(dest, path)
    with pytest.raises(weightcast.Error) as e:
        handle.wait()
    assert e.value.status == 65
    assert '"extra"' in str(e.value) and "missing key(s)" in str(e.value)
    assert not dest["a"].any(), "a refused load wrote a byte"


def test_a_bad_keyword_or_destination_raises_at_the_call(tmp_path):
    path = _small(tmp_path)
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_async(path, chunk_size=0)
    assert e.value.status == 78
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_async(path, progress="yes")
    assert e.value.status == 78
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_into_async({"a": torch.empty(1, device="meta")}, path)
    assert e.value.status == 64 and "meta" in str(e.value)
    with pytest.raises(TypeError):
        weightcast.load_async(3.5)


def test_cancel_stops_the_load_and_wait_raises_130(tmp_path):
    path, slow = _slow(tmp_path)
    gc.collect()
    base = _weightcast.live_arenas()
    handle = weightcast.load_async(path, **slow)
    while handle.progress is None and not handle.done():
        time.sleep(0.01)
    asked = time.monotonic()
    handle.cancel()
    with pytest.raises(weightcast.Error) as e:
        handle.wait()
    assert e.value.status == 130
    assert time.monotonic() - asked < 2.0
    assert handle.progress.bytes_done < handle.progress.bytes_total
    del e, handle
    gc.collect()
    assert _weightcast.live_arenas() == base


def test_ctrl_c_in_wait_cancels_the_load_then_raises(tmp_path):
    path, slow = _slow(tmp_path)
    handle = weightcast.load_async(path, **slow)

    def ctrl_c():
        while handle.progress is None:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c).start()
        with pytest.raises(KeyboardInterrupt):
            handle.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    # The load has stopped by the time the interrupt comes, and says it was cancelled.
    assert handle.done()
    assert handle.progress.bytes_done < handle.progress.bytes_total
    with pytest.raises(weightcast.Error) as e:
        handle.wait()
    assert e.value.status == 130


def test_ctrl_c_outside_wait_leaves_the_load_running(tmp_path):
    path, slow = _slow(tmp_path, 16)
    handle = weightcast.load_async(path, **slow)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the caller's own work, interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
    assert raw_bytes(handle.wait()["w"]) == bytes(range(256)) * (16 << 12)


def test_inference_mode_at_the_call_carries_to_the_load(tmp_path):
    # BF16 into F16 is a cast the receiver does not make: the tensor is staged and torch's
    # copy_ writes it, on the handle's thread, into an inference tensor.
    path = _small(tmp_path)
    with torch.inference_mode():
        dest = {"b": torch.zeros(10, dtype=torch.float16)}
        report = weightcast.load_into_async(dest, path, strict=False, progress=False).wait()
    assert report.staged_keys == ["b"]
    want = weightcast.load(path, progress=False)["b"].to(torch.float16)
    assert raw_bytes(dest["b"]) == raw_bytes(want)


def test_loads_side_by_side_on_one_process(tmp_path):
    path = _small(tmp_path)
    handles = [weightcast.load_async(path, progress=False) for _ in range(3)]
    dests = [{"a": torch.zeros(4, 6)} for _ in range(2)]
    into = [weightcast.load_into_async(d, path, strict=False, progress=False) for d in dests]
    want = weightcast.load(path, progress=False)
    for h in handles:
        assert_same(h.wait(), want)
    for h, d in zip(into, dests):
        assert h.wait().loaded_keys == ["a"]
        assert raw_bytes(d["a"]) == raw_bytes(want["a"])


def test_a_dropped_handle_lets_its_load_end_and_exit_is_clean(tmp_path):
    """A handle dropped without wait(), and one still running when the interpreter exits:
    no crash, no hang, status 0; the running load is cancelled at exit."""
    path, _ = _slow(tmp_path)
    script = textwrap.dedent(f"""
        import gc, time, weightcast
        h = weightcast.load_async({str(path)!r}, progress=False)
        del h
        gc.collect()
        time.sleep(0.2)
        # Still running at exit: cancelled and waited for there.
        h2 = weightcast.load_async({str(path)!r}, chunk_size=256, direct_io=False,
                                   progress=False)
        while h2.progress is None:
            time.sleep(0.01)
        print("exiting", h2.done(), flush=True)
    """)
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exiting False" in r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - started < 60


def test_the_handle_documents_itself():
    import inspect

    for name in ("done", "wait", "cancel"):
        assert inspect.getdoc(getattr(weightcast.LoadHandle, name)), name
    doc = inspect.getdoc(weightcast.LoadHandle.wait)
    for section in ("Args:", "Returns:", "Raises:", "TimeoutError", "KeyboardInterrupt"):
        assert section in doc, section
    assert inspect.getdoc(weightcast.LoadHandle.progress)
    for fn in (weightcast.load_async, weightcast.load_into_async):
        doc = inspect.getdoc(fn)
        for section in ("Args:", "Returns:", "Raises:"):
            assert section in doc, (fn.__name__, section)
