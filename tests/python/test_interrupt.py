"""Ctrl-C during a load: KeyboardInterrupt within moments, the load cancelled, nothing leaked.

The GIL is released while the load runs, so the progress callable (on a thread of its own)
can run Python meanwhile: it sends SIGINT to this process on the first chunk, as a terminal's
Ctrl-C would, and the main thread's signal check then stops the load."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest

import weightcast
from conftest import write_safetensors
from weightcast import _weightcast


def test_ctrl_c_stops_a_load_within_moments(tmp_path):
    # 64 MiB in 256-byte chunks: 262,144 chunks, far longer than the 50 ms signal check.
    path = write_safetensors(tmp_path / "big.safetensors",
                             {"w": ("U8", [64 << 20], bytes(64 << 20))})
    gc.collect()
    base = _weightcast.live_arenas()
    seen: list = []
    sent: list = []

    def progress(p):
        seen.append(p)
        if not sent:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)

    # Python turns SIGINT into KeyboardInterrupt only where SIGINT was not ignored when it
    # started; a shell's background job (`cmd &` without job control) starts with it ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            weightcast.load(path, chunk_size=256, direct_io=False, progress=progress)
    finally:
        signal.signal(signal.SIGINT, previous)
    stopped_after = time.monotonic() - sent[0]
    assert seen[-1].bytes_done < seen[-1].bytes_total, "the load ran to its end"
    print(f"stopped {stopped_after * 1000:.0f} ms after SIGINT "
          f"({seen[-1].chunks_done} of {seen[-1].chunks_total} chunks)")
    gc.collect()
    assert _weightcast.live_arenas() == base
    # The next load works.
    small = write_safetensors(tmp_path / "s.safetensors", {"x": ("U8", [3], b"abc")})
    assert bytes(weightcast.load(small)["x"].numpy()) == b"abc"


def test_the_gil_is_released_during_a_load(tmp_path):
    path = write_safetensors(tmp_path / "big.safetensors",
                             {"w": ("U8", [32 << 20], bytes(32 << 20))})
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    try:
        before = ticks
        weightcast.load(path, chunk_size=4096, direct_io=False)
        during = ticks - before
    finally:
        done.set()
        t.join()
    assert during > 0, "another Python thread never ran during the load"
