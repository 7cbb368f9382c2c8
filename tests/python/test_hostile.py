"""Inputs a careless or hostile caller passes: each one a `weightcast.Error` naming what was
wrong (or, for paths, the load it asked for), never a bare TypeError from the extension's
argument parsing, and never a half-done `load_into`."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

import weightcast
from conftest import assert_same


@pytest.fixture
def small(tmp_path):
    ref = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
    path = tmp_path / "a.safetensors"
    save_file(ref, str(path))
    return path, ref


@pytest.mark.parametrize("kwargs, word", [
    ({"timeout": float("nan")}, "timeout"), ({"timeout": float("inf")}, "timeout"),
    ({"timeout": -1}, "timeout"), ({"timeout": -0.5}, "timeout"),
    ({"reader": 1}, "reader"), ({"reader": b"pread"}, "reader"),
    ({"progress": "yes"}, "progress"), ({"progress": 1}, "progress"),
    ({"verify": "none"}, "verify"), ({"verify": 1}, "verify"),
])
def test_keyword_values_of_the_wrong_kind_are_config_errors(small, kwargs, word):
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(small[0], **kwargs)
    assert e.value.status == 78, str(e.value)
    assert word in str(e.value)
    # The value as the caller wrote it, not a converted one ("-1000ms").
    assert repr(next(iter(kwargs.values()))) in str(e.value)


def test_a_cuda_ordinal_past_int_is_an_error_not_a_type_error(small):
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(small[0], device="cuda:99999999999")
    assert e.value.status == 69 and "99999999999" in str(e.value)


def test_bytes_and_non_utf8_paths_load(tmp_path, small):
    path, ref = small
    assert_same(weightcast.load(os.fsencode(path)), ref)
    # A file name that is not UTF-8: os.listdir gives it as a str with surrogate escapes.
    odd = os.fsencode(tmp_path) + b"/caf\xe9.safetensors"
    os.link(path, odd)
    name = os.fsdecode(odd)
    seen = []
    assert_same(weightcast.load(name, progress=seen.append), ref)
    assert_same(weightcast.load(odd), ref)
    assert seen[-1].shard == os.path.basename(name) or seen[-1].shard == name
    into = {k: torch.zeros_like(v) for k, v in ref.items()}
    weightcast.load_into(into, name)
    assert_same(into, ref)
    # A missing one is the library's error, its byte escaped in the message.
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(os.fsencode(tmp_path) + b"/gone\xff.safetensors")
    assert e.value.status == 66 and "gone\\xff" in str(e.value)


def test_a_path_of_the_wrong_type_is_a_type_error_naming_it(small):
    for bad in (123, None, ["a"]):
        with pytest.raises(TypeError, match="checkpoint"):
            weightcast.load(bad)


def test_strict_must_be_a_bool(small):
    path, ref = small
    dest = {k: torch.zeros_like(v) for k, v in ref.items()} | {"extra": torch.zeros(1)}
    for bad in (None, "no", 0):
        with pytest.raises(weightcast.Error) as e:
            weightcast.load_into(dest, path, strict=bad)
        assert e.value.status == 64 and "strict" in str(e.value)
    assert not dest["w"].any()


@pytest.mark.parametrize("key_map", [lambda k: 5, {"w": 3}])
def test_key_map_giving_a_non_str_is_refused_naming_the_key(small, key_map):
    path, ref = small
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_into({k: torch.zeros_like(v) for k, v in ref.items()}, path,
                             key_map=key_map)
    # The checkpoint key it mapped and what it gave (file order: the first key mapped).
    bad = key_map("b") if callable(key_map) else key_map["w"]
    assert e.value.status == 64 and f"to {bad!r}" in str(e.value)
    assert "'b'" in str(e.value) or "'w'" in str(e.value)


def test_a_destination_copy_cannot_write_is_refused_before_any_byte(small):
    path, ref = small
    for bad, word in [(torch.zeros(3).expand(2, 3), "share memory"),
                      (torch.inference_mode()(lambda: torch.zeros(2, 3))(), "inference")]:
        dest = {"b": torch.zeros(2), "w": bad}
        with pytest.raises(weightcast.Error) as e:
            weightcast.load_into(dest, path)
        assert e.value.status == 64 and "'w'" in str(e.value) and word in str(e.value)
        assert not dest["b"].any(), "a refused load_into wrote a tensor"
    # A non-contiguous destination (a transpose) is fine: copy_ writes through its strides.
    w = torch.zeros(3, 2).t()
    weightcast.load_into({"b": torch.zeros(2), "w": w}, path)
    assert torch.equal(w, ref["w"])


def test_a_tensor_of_many_dimensions_loads_as_load_file_does(tmp_path):
    from safetensors.torch import load_file

    from conftest import write_safetensors

    # nanobind's DLPack export aborted the process past ~128 dimensions; safetensors and
    # torch take any count.
    path = write_safetensors(tmp_path / "d.safetensors", {
        "deep": ("F32", [1] * 999 + [2], bytes(range(8))),
        "deep_f8": ("F8_E4M3", [1] * 200 + [3], b"\x01\x02\x03"),
        "deep_empty": ("BF16", [1] * 300 + [0], b""),
    })
    got = weightcast.load(path)
    assert_same(got, load_file(str(path)))
    assert got["deep"].dim() == 1000 and got["deep"].is_contiguous()
    into = {"deep": torch.zeros([1] * 999 + [2])}
    weightcast.load_into(into, path, strict=False)
    assert torch.equal(into["deep"], got["deep"])


def test_a_dimension_past_int64_is_refused_before_any_byte(tmp_path):
    from conftest import write_safetensors

    path = write_safetensors(tmp_path / "h.safetensors", {"ok": ("F32", [1], b"\0" * 4),
                                                          "x": ("F32", [2**64 - 1, 0], b"")})
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(path)
    assert e.value.status == 65 and "'x'" in str(e.value) and str(path) in str(e.value)
    dest = {"ok": torch.ones(1)}
    # load_into lands in place: x is no destination, so no byte of it is received anywhere.
    report = weightcast.load_into(dest, path, strict=False)
    assert report.unexpected_keys == ["x"] and dest["ok"].item() == 0


def test_integers_of_any_kind_operator_index_takes_are_sizes_and_counts(small):
    import numpy as np

    got = weightcast.load(small[0], chunk_size=np.int64(1 << 20), buffer_depth=np.int32(2),
                          io_depth=np.uint8(4), timeout=np.int64(30),
                          rendezvous_port=np.int64(29555))
    assert_same(got, small[1])
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(small[0], chunk_size=np.float64(4096.0))
    assert e.value.status == 78 and "chunk_size" in str(e.value)


def test_a_timeout_under_a_millisecond_is_refused_not_called_0_ms(small):
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(small[0], timeout=1e-9)
    assert e.value.status == 78
    assert "1e-09" in str(e.value) and "0 ms" not in str(e.value), str(e.value)


def test_a_mapping_with_keys_that_are_not_str_is_refused(small):
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_into({1: torch.zeros(2, 3)}, small[0], strict=False)
    assert e.value.status == 64 and "key 1, a int" in str(e.value), str(e.value)


def test_alone_loads_on_this_process_whatever_the_launcher_says(small, monkeypatch):
    # A world of 3 from torchrun's variables, with no rank 1 or 2 anywhere: alone=True loads
    # here at once instead of waiting for them at the rendezvous.
    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    assert_same(weightcast.load(small[0], alone=True, timeout=1), small[1])
    dest = {"w": torch.zeros(2, 3), "b": torch.zeros(2)}
    report = weightcast.load_into(dest, small[0], alone=True, timeout=1)
    assert_same(dest, small[1])
    assert report.verdict.startswith("1 rank: 2 tensors loaded")
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(small[0], alone="yes")
    assert e.value.status == 64 and "alone" in str(e.value)


def test_local_errors_on_a_rank_of_several_name_the_rank(small, monkeypatch):
    for key, value in {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(small[0], chunk_size="16 parsecs")
    assert str(e.value).startswith("rank 2: keyword chunk_size"), str(e.value)


def test_a_slow_progress_callable_neither_throttles_the_load_nor_stalls_it(tmp_path):
    """The callable runs off the load's path: updates that come while it runs are dropped but
    the latest, and the last chunk's always arrives before the call returns. With the call in
    series, 64 chunks took 64 × 0.5 s, and no stall timeout could fire meanwhile."""
    import time

    path = tmp_path / "p.safetensors"
    ref = {"w": torch.randn(256, 256)}
    save_file(ref, str(path))
    seen: list = []

    def slow(p):
        seen.append(p)
        time.sleep(0.5)

    begin = time.monotonic()
    got = weightcast.load(path, chunk_size=4096, progress=slow, timeout=2)
    took = time.monotonic() - begin
    assert_same(got, ref)
    assert seen[-1].chunks_done == seen[-1].chunks_total == 64
    assert len(seen) < 64
    assert took < 64 * 0.5 / 4, took  # a hang check with room for a loaded machine


def test_chunk_size_0_and_negative_state_the_same_range(small):
    for value in (0, -1):
        with pytest.raises(weightcast.Error) as e:
            weightcast.load(small[0], chunk_size=value)
        assert e.value.status == 78
        assert str(e.value) == (f"keyword chunk_size={value}: '{value}' is out of range (must be "
                                "more than 0 and at most 4GiB)"), str(e.value)


@pytest.mark.parametrize("key, value, reason", [
    # A size, a count, an enum and a bool-like enum: the config's words for each.
    ("chunk_size", 0, "'0' is out of range (must be more than 0 and at most 4GiB)"),
    ("buffer_depth", 2**40,
     "'1099511627776' is out of range (must be 1 to 1024: staging ring slots)"),
    ("io_depth", 0, "'0' is out of range (must be 1 to 4096: reads in flight)"),
    ("reader", "bogus", "'bogus' is not one of auto, uring, pread"),
    ("direct_io", "maybe", "'maybe' is not one of auto, on, off (or true, false)"),
])
def test_a_bad_keyword_says_what_the_config_file_says(small, tmp_path, key, value, reason):
    """A keyword is an override of its config key: the same value gets the same words from
    the keyword as from a config file's line (and `--set`, and LoadOptions: test_settings.cpp)."""
    with pytest.raises(weightcast.Error) as keyword:
        weightcast.load(small[0], **{key: value})
    assert keyword.value.status == 78
    assert str(keyword.value) == f"keyword {key}={value}: {reason}"
    config = tmp_path / "c.yaml"
    config.write_text(f"{key}: {value}\n")
    with pytest.raises(weightcast.Error) as file:
        weightcast.load(small[0], config=config)
    assert file.value.status == 78
    assert str(file.value) == f"{config}:1: {key}: {reason}"


