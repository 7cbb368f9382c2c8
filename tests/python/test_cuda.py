"""CUDA: load into a device arena, load_into CUDA parameters. Skipped with the reason where
there is no GPU (or the build has no CUDA)."""

from __future__ import annotations

import gc

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightcast
from conftest import assert_same, raw_bytes
from weightcast import _weightcast

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not weightcast.build_info()["cuda"],
                       reason="this build of weightcast has no CUDA (WEIGHTCAST_CUDA=OFF)"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch"),
]


def _checkpoint(tmp_path):
    g = torch.Generator().manual_seed(0)
    ref = {"w": torch.randn(1024, 513, generator=g), "b": torch.randn(7, generator=g).bfloat16(),
           "s": torch.tensor(2.5), "e": torch.empty(0, 3),
           "f8": torch.randn(33, generator=g).to(torch.float8_e4m3fn)}
    path = tmp_path / "c.safetensors"
    save_file(ref, str(path))
    return path, ref


def test_load_to_cuda_is_bit_exact_and_ready_on_the_current_stream(tmp_path):
    path, ref = _checkpoint(tmp_path)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the caller's current stream is not the default one
        got = weightcast.load(path, device="cuda", chunk_size="64KiB")
        total = sum(t.float().sum() for t in got.values() if t.numel())
    for t in got.values():
        assert t.device == torch.device("cuda", torch.cuda.current_device())
    assert_same({k: v.cpu() for k, v in got.items()}, load_file(str(path)))
    torch.cuda.synchronize()
    assert torch.isfinite(total)
    for t in got.values():
        if t.numel():
            assert t.data_ptr() % 256 == 0 or t.data_ptr() % t.element_size() == 0


def test_cuda_arena_lifetime(tmp_path):
    path, _ = _checkpoint(tmp_path)
    gc.collect()
    base = _weightcast.live_arenas()
    got = weightcast.load(path, device="cuda")
    w = got["w"]
    del got
    gc.collect()
    assert _weightcast.live_arenas() == base + 1
    assert torch.isfinite(w.sum())
    del w
    gc.collect()
    assert _weightcast.live_arenas() == base


def test_load_into_cuda_parameters_with_casts(tmp_path):
    path, ref = _checkpoint(tmp_path)
    dest = {"w": torch.empty(1024, 513, device="cuda", dtype=torch.bfloat16),
            "b": torch.empty(7, device="cuda", dtype=torch.float32)}
    report = weightcast.load_into(dest, path, strict=False)
    assert sorted(report.cast_keys) == ["b", "w"]
    assert raw_bytes(dest["w"]) == raw_bytes(ref["w"].to(torch.bfloat16))
    assert raw_bytes(dest["b"]) == raw_bytes(ref["b"].float())


def test_the_async_loads_are_ordered_after_the_callers_stream_at_the_call(tmp_path):
    """load_into_async under a side stream: a fill queued there before the call (behind a
    GPU sleep) lands before the load's bytes; wait() on the default stream then sees them
    (it is made to wait for the side stream). load_async: ready when wait() returns."""
    path, ref = _checkpoint(tmp_path)
    dest = {"w": torch.zeros(1024, 513, device="cuda")}
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # GPU time queued before the fill and the load
        dest["w"].fill_(7.0)
        handle = weightcast.load_into_async(dest, path, strict=False, progress=False)
        tensors = weightcast.load_async(path, device="cuda", progress=False)
    report = handle.wait()
    assert report.loaded_keys == ["w"]
    assert raw_bytes(dest["w"]) == raw_bytes(ref["w"])
    got = tensors.wait()
    assert_same({k: v.cpu() for k, v in got.items()}, load_file(str(path)))
