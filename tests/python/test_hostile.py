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
