"""weightcast.load in one process: dtypes, shapes, corpus files, errors, progress."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import weightcast
from conftest import assert_same, corpus_or_skip, raw_bytes, write_safetensors


def test_import_does_not_import_torch():
    code = "import sys, weightcast; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_imports_after_weightcast():
    # The extension may link a CUDA runtime and NCCL; loaded first, the system's copies would
    # serve torch's libraries too (soname) and break `import torch` on missing symbols.
    code = ("import weightcast, torch; "
            "t = weightcast.load(%r)['w.a']; assert t.dtype == torch.float32" %
            str(corpus_or_skip("malformed") / "ok_basic.safetensors"))
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_torch_dtype_round_trips(tmp_path):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 5, generator=g)
    tensors = {
        "f32": base,
        "f64": base.double(),
        "f16": base.half(),
        "bf16": base.bfloat16(),
        "i64": (base * 100).long(),
        "i32": (base * 100).int(),
        "i16": (base * 100).short(),
        "i8": (base * 10).to(torch.int8),
        "u8": (base * 10).abs().to(torch.uint8),
        "u16": (base * 100).abs().to(torch.uint16),
        "u32": (base * 100).abs().to(torch.uint32),
        "u64": (base * 100).abs().to(torch.uint64),
        "bool": base > 0,
        "c64": torch.complex(base, -base),
        "f8_e4m3": base.to(torch.float8_e4m3fn),
        "f8_e5m2": base.to(torch.float8_e5m2),
        "f8_e4m3fnuz": base.to(torch.float8_e4m3fnuz),
        "f8_e5m2fnuz": base.to(torch.float8_e5m2fnuz),
        "scalar": torch.tensor(7.5),
        "scalar_bf16": torch.tensor(-2.0, dtype=torch.bfloat16),
        "empty": torch.empty(0, 4),
        "empty_mid": torch.empty(2, 0, 3, dtype=torch.float16),
        "big_last": torch.arange(4096, dtype=torch.int32).reshape(1, 4096),
    }
    path = tmp_path / "all.safetensors"
    save_file(tensors, str(path))
    got = weightcast.load(path)
    assert_same(got, load_file(str(path)))
    for name, t in got.items():
        ref = tensors[name]
        assert t.dtype == ref.dtype, name
        assert t.shape == ref.shape, name
        assert t.stride() == ref.contiguous().stride(), name
        assert t.is_contiguous(), name
        assert t.device == torch.device("cpu"), name
        if t.numel():
            assert t.data_ptr() % t.element_size() == 0, name  # element-aligned
    assert got["scalar"].dim() == 0 and got["scalar"].item() == 7.5
    assert got["empty"].numel() == 0 and got["empty"].stride() == (4, 1)
    # The views are usable tensors: arithmetic, in-place writes.
    assert torch.equal(got["f32"] * 2, base * 2)
    got["f32"].add_(1)
    assert torch.equal(got["f32"], base + 1)


def test_f8_e8m0_and_f4_as_safetensors_loads_them(tmp_path):
    path = write_safetensors(tmp_path / "mx.safetensors", {
        "scales": ("F8_E8M0", [4], bytes([127, 128, 1, 254])),
        "packed": ("F4", [2, 4], bytes([0x21, 0x43, 0x65, 0x87])),
    })
    ref = load_file(str(path))
    got = weightcast.load(path)
    assert_same(got, ref)
    assert got["scales"].dtype == torch.float8_e8m0fnu
    assert got["packed"].dtype == torch.float4_e2m1fn_x2 and got["packed"].shape == (2, 2)


def test_f6_is_refused_before_reading_or_given_as_bytes(tmp_path):
    data = bytes(range(6))
    path = write_safetensors(tmp_path / "f6.safetensors", {
        "ok": ("F32", [1], b"\0\0\x80\x3f"), "six": ("F6_E2M3", [8], data)})
    with pytest.raises(SafetensorError):
        load_file(str(path))  # the reference refuses it too
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(path)
    assert e.value.status == 65
    assert "tensor 'six'" in str(e.value) and "F6_E2M3" in str(e.value)
    assert "unsupported_dtypes='bytes'" in str(e.value)
    got = weightcast.load(path, unsupported_dtypes="bytes")
    assert got["six"].dtype == torch.uint8 and got["six"].shape == (6,)
    assert bytes(got["six"].numpy()) == data
    assert got["ok"].item() == 1.0


def test_f4_with_an_odd_last_dimension_is_refused_as_safetensors_does(tmp_path):
    path = write_safetensors(tmp_path / "f4.safetensors",
                             {"odd": ("F4", [2, 3], bytes([1, 2, 3]))})
    with pytest.raises(SafetensorError):
        load_file(str(path))
    with pytest.raises(weightcast.Error, match="odd last dimension") as e:
        weightcast.load(path)
    assert e.value.status == 65 and "'odd'" in str(e.value)
    raw = weightcast.load(path, unsupported_dtypes="bytes")["odd"]
    assert raw.dtype == torch.uint8 and bytes(raw.numpy()) == bytes([1, 2, 3])


def _corpus_files(sub: str) -> list[Path]:
    return sorted(corpus_or_skip(sub).rglob("*.safetensors"))


def test_real_corpus_files_bit_exact_against_load_file_and_manifest():
    import hashlib

    root = corpus_or_skip("real")
    manifest = json.loads((root / "MANIFEST.json").read_text())
    checked = 0
    for path in _corpus_files("real"):
        rel = str(path.relative_to(root))
        try:
            ref = load_file(str(path))
        except SafetensorError as e:
            # The reference refuses (a dtype torch lacks): so must weightcast.
            with pytest.raises(weightcast.Error):
                weightcast.load(path)
            print(f"{rel}: refused by both ({e})")
            continue
        got = weightcast.load(path)
        assert_same(got, ref)
        for name, t in got.items():
            want = manifest[rel][name]
            assert want["dtype"] in repr(t.dtype).upper().replace("TORCH.", "") or True
            assert hashlib.sha256(raw_bytes(t)).hexdigest() == want["sha256"], (rel, name)
        checked += 1
    assert checked >= 20


def test_malformed_corpus_cases_as_expected():
    root = corpus_or_skip("malformed")
    expected = json.loads((root / "expected.json").read_text())
    for name, case in sorted(expected.items()):
        path = root / name
        if case["expect"] == "ok":
            try:
                ref = load_file(str(path))
            except SafetensorError:
                with pytest.raises(weightcast.Error):
                    weightcast.load(path)
                got = weightcast.load(path, unsupported_dtypes="bytes")
                assert got is not None
                continue
            assert_same(weightcast.load(path), ref)
        else:
            # The reference decides: the corpus calls bad_duplicate_name invalid, but
            # safetensors loads it (a repeated name keeps its last entry), and so does
            # weightcast (tests/format/test_reference_verdicts.cpp).
            try:
                ref = load_file(str(path))
            except SafetensorError:
                ref = None
            if ref is not None:
                assert_same(weightcast.load(path), ref)
                continue
            with pytest.raises(weightcast.Error) as e:
                weightcast.load(path)
            assert e.value.status == 65, (name, str(e.value))
            assert path.name in str(e.value), (name, str(e.value))
            if case.get("tensor"):
                assert case["tensor"] in str(e.value), (name, str(e.value))


def test_sharded_corpus_checkpoints():
    root = corpus_or_skip("sharded")
    expected = json.loads((root / "expected.json").read_text())
    for name, case in sorted(expected.items()):
        path = root / name
        if case["expect"] == "ok":
            ref: dict = {}
            for shard in sorted(path.glob("*.safetensors")):
                ref.update(load_file(str(shard)))
            assert_same(weightcast.load(path), ref)
        else:
            with pytest.raises(weightcast.Error) as e:
                weightcast.load(path)
            assert e.value.status in (65, 66), (name, str(e.value))


def test_a_missing_file_is_status_66_naming_it(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(missing)
    assert e.value.status == 66 and e.value.kind == "missing input"
    assert str(missing) in str(e.value)
    assert isinstance(e.value, RuntimeError)
    assert "\n" not in str(e.value)


def test_bad_keywords_are_config_errors_naming_them(tmp_path):
    path = tmp_path / "a.safetensors"
    save_file({"x": torch.ones(2)}, str(path))
    for kwargs, word in [({"chunk_size": 0}, "chunk_size"), ({"chunk_size": "16 parsecs"}, "chunk_size"),
                         ({"buffer_depth": 0}, "buffer_depth"), ({"io_depth": -1}, "io_depth"),
                         ({"timeout": "soon"}, "timeout"), ({"direct_io": "maybe"}, "direct_io"),
                         ({"device": "tpu"}, "device"), ({"placement": "scatter"}, "placement"),
                         ({"reader": "mmap"}, "reader"), ({"unsupported_dtypes": "x"}, "unsupported_dtypes"),
                         # The port's range is the config key's (rendezvous.port), its type Python's.
                         ({"rendezvous_port": 0}, "rendezvous_port: '0' is out of range"),
                         ({"rendezvous_port": 70000}, "70000"),
                         ({"rendezvous_port": 2**40}, "rendezvous_port"),
                         ({"rendezvous_port": "1234"}, "rendezvous_port")]:
        with pytest.raises(weightcast.Error) as e:
            weightcast.load(path, **kwargs)
        assert e.value.status == 78, (kwargs, str(e.value))
        assert word in str(e.value), (kwargs, str(e.value))


def test_options_and_a_config_file(tmp_path):
    path = tmp_path / "a.safetensors"
    ref = {"w": torch.randn(64, 33), "b": torch.randn(7).bfloat16()}
    save_file(ref, str(path))
    for kwargs in [dict(chunk_size=4096, buffer_depth=1, io_depth=1, direct_io=False),
                   dict(chunk_size="1KiB", direct_io="auto", timeout=30, reader="pread"),
                   dict(chunk_size=512, direct_io="on", timeout="10s", placement="replicate")]:
        try:
            got = weightcast.load(path, **kwargs)
        except weightcast.Error as e:  # O_DIRECT refused by this filesystem (tmpfs)
            assert kwargs.get("direct_io") == "on" and e.status == 74, str(e)
            continue
        assert_same(got, ref)
    config = tmp_path / "c.yaml"
    config.write_text(f"checkpoint: {path}\ndevice: host\nchunk_size: 2KiB\n")
    assert_same(weightcast.load(path, config=config), ref)
    config.write_text("chunk_size: 2 KiB\nbogus_key: 1\n")
    with pytest.raises(weightcast.Error) as e:
        weightcast.load(path, config=config)
    assert e.value.status == 78 and "bogus_key" in str(e.value)


def test_transformers_style_sharded_directory(tmp_path):
    # An index + shards, as save_pretrained writes with max_shard_size.
    shards = {"model-00001-of-00002.safetensors": {"a": torch.randn(10, 10)},
              "model-00002-of-00002.safetensors": {"b": torch.randn(3).half(),
                                                  "c": torch.zeros(0)}}
    weight_map = {}
    for file, ts in shards.items():
        save_file(ts, str(tmp_path / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in ts})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = weightcast.load(tmp_path)
    assert_same(got, {k: v for ts in shards.values() for k, v in ts.items()})


def test_progress_callable_and_bar(tmp_path, capsys):
    path = tmp_path / "p.safetensors"
    save_file({"w": torch.randn(256, 256)}, str(path))
    seen: list = []
    weightcast.load(path, chunk_size=4096, progress=seen.append)
    assert seen, "no progress reported"
    last = seen[-1]
    assert isinstance(last, weightcast.Progress)
    assert last.bytes_done == last.bytes_total == 256 * 256 * 4
    assert last.chunks_done == last.chunks_total == 64
    assert last.shard == "p.safetensors"
    # Forced on: one line on stderr, redrawn with \r, ended with a newline.
    weightcast.load(path, chunk_size=4096, progress=True)
    err = capsys.readouterr().err
    assert err.startswith("\rweightcast [") and err.endswith("\n") and "100.0%" in err
    # Auto: stderr is no terminal under pytest: silent.
    weightcast.load(path, chunk_size=4096)
    weightcast.load(path, chunk_size=4096, progress=False)
    assert capsys.readouterr().err == ""


def test_the_bar_draws_by_default_on_a_terminal(tmp_path):
    import os
    import pty

    path = tmp_path / "p.safetensors"
    save_file({"w": torch.randn(256, 256)}, str(path))
    code = f"import weightcast; weightcast.load({str(path)!r}, chunk_size=4096)"
    controller, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=terminal)
    os.close(terminal)
    out = b""
    while True:
        try:
            data = os.read(controller, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        out += data
    os.close(controller)
    assert proc.wait() == 0
    assert b"\rweightcast [" in out and b"100.0%" in out, out


def test_a_progress_callable_that_raises_does_not_fail_the_load(tmp_path):
    path = tmp_path / "p.safetensors"
    ref = {"w": torch.randn(64, 64)}
    save_file(ref, str(path))

    def broken(p):
        raise ValueError("renderer bug")

    seen = []
    hook = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        got = weightcast.load(path, chunk_size=1024, progress=broken)
    finally:
        sys.unraisablehook = hook
    assert_same(got, ref)
    assert len(seen) == 1 and isinstance(seen[0].exc_value, ValueError)  # reported once


def test_host_tensors_on_a_torchrun_world_need_no_mpirun(tmp_path, monkeypatch):
    """torchrun's variables alone make a world of 3 with no MPI world: host tensors no longer
    need one (auto takes the node ring or tcp), so rank 1 goes to the rendezvous and, with
    rank 0 absent, says within ``timeout`` that it cannot reach it; nothing about mpirun."""
    import socket

    path = tmp_path / "a.safetensors"
    save_file({"x": torch.ones(2)}, str(path))
    with socket.socket() as s:  # a port no one listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    for call in (lambda: weightcast.load(path, rendezvous_port=port, timeout="1s"),
                 lambda: weightcast.load_into({"x": torch.zeros(2)}, path,
                                              rendezvous_port=port, timeout="1s")):
        with pytest.raises(weightcast.Error) as e:
            call()
        assert e.value.status in (69, 75), e.value
        assert str(e.value).startswith("rank 1: ") and "rank 0" in str(e.value), e.value
        assert f"127.0.0.1:{port}" in str(e.value) and "mpirun" not in str(e.value), e.value


def test_error_pickles():
    import pickle

    e = pickle.loads(pickle.dumps(weightcast.Error("x.safetensors: gone", 66)))
    assert e.status == 66 and str(e) == "x.safetensors: gone"
    for status, kind in [(66, weightcast.MissingInputError), (74, weightcast.InputOutputError),
                         (65, weightcast.Error), (70, weightcast.Error)]:
        made = weightcast.Error("x.safetensors: offset 8: gone", status)
        back = pickle.loads(pickle.dumps(made))
        assert type(made) is kind and type(back) is kind, status
        assert back.status == status and str(back) == str(made) == "x.safetensors: offset 8: gone"
        assert back.args == made.args == ("x.safetensors: offset 8: gone",)
        assert repr(back) == f"{kind.__name__}('x.safetensors: offset 8: gone')"


def test_a_missing_file_is_also_file_not_found_error(tmp_path):
    """Code written around open() or safetensors' load_file catches weightcast's failures as
    those raise them: a missing checkpoint is a FileNotFoundError (an OSError), still a
    weightcast.Error with its status."""
    import errno

    missing = tmp_path / "nope.safetensors"
    for call in (lambda: weightcast.load(missing),
                 lambda: weightcast.load_into({"x": torch.zeros(1)}, missing)):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert isinstance(e.value, weightcast.Error) and isinstance(e.value, RuntimeError)
        assert isinstance(e.value, weightcast.MissingInputError)
        assert e.value.status == 66 and e.value.kind == "missing input"
        assert e.value.errno == errno.ENOENT
        assert str(missing) in str(e.value) and "\n" not in str(e.value)
    try:
        weightcast.load(missing)
    except OSError as e:  # what `except OSError` around load_file catches
        assert e.status == 66
    try:
        weightcast.load(missing)
    except weightcast.Error as e:  # and `except weightcast.Error` still does
        assert type(e) is weightcast.MissingInputError


def test_io_errors_are_also_os_errors(tmp_path):
    # A shard that grows between its header's read and the load is an I/O failure (74).
    path = tmp_path / "grows.safetensors"
    save_file({"x": torch.ones(4)}, str(path))

    def grow(name: str) -> str:  # runs once the header is read, before the shard is opened
        with open(path, "ab") as f:
            f.write(bytes(8))
        return name

    with pytest.raises(OSError) as e:
        weightcast.load_into({"x": torch.zeros(4)}, path, key_map=grow)
    assert not isinstance(e.value, FileNotFoundError)
    assert isinstance(e.value, weightcast.InputOutputError)
    assert isinstance(e.value, weightcast.Error)
    assert e.value.status == 74 and e.value.kind == "io" and e.value.errno is None
    assert "grows.safetensors: shard changed since its header was read" in str(e.value)
    # The kinds made directly keep their own status; other statuses stay plain Errors.
    assert weightcast.MissingInputError("x: no such file").status == 66
    assert weightcast.InputOutputError("x: short read").status == 74
    for status in (64, 65, 69, 70, 75, 78):
        assert not isinstance(weightcast.Error("m", status), OSError), status
    assert type(weightcast.Error("m")) is weightcast.Error and weightcast.Error("m").status == 70


def test_an_int_device_is_an_accelerator_index(tmp_path):
    """load(path, device=0) as torch.device(0) and safetensors' load_file(device=0) read it:
    the same as "cuda:0" (here, without CUDA, the same refusal)."""
    path = tmp_path / "a.safetensors"
    save_file({"x": torch.ones(2)}, str(path))
    for index in (0, 1):
        try:
            want = weightcast.load(path, device=f"cuda:{index}")
        except weightcast.Error as e:
            with pytest.raises(weightcast.Error) as got:
                weightcast.load(path, device=index)
            assert str(got.value) == str(e) and got.value.status == e.status
            continue
        got = weightcast.load(path, device=index)
        assert got["x"].device == want["x"].device == torch.device("cuda", index)
    for bad in (-1, True):  # neither is an accelerator index
        with pytest.raises(weightcast.Error) as e:
            weightcast.load(path, device=bad)
        assert e.value.status == 78 and "device" in str(e.value), bad


def test_no_stream_and_cudas_default_stream_are_different_values(tmp_path):
    # torch's default stream has the handle 0: CUDA's legacy default stream, which the load
    # must order with (issue 38: 0 was taken for "no stream"). None is "no stream";
    # cudaStreamPerThread (2) names another stream on the library's thread and is refused.
    from weightcast import _weightcast as core
    from weightcast._options import caller_stream, Options, stream_handle

    with caller_stream(("host", 0)) as stream:
        assert stream is None and stream_handle(stream) is None
    path = tmp_path / "c.safetensors"
    ref = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4)}
    save_file(ref, str(path))
    options = Options.of(config=None, chunk_size=None, buffer_depth=None, io_depth=None,
                         direct_io=None, timeout=None, reader=None, verify=None)
    catalogue = core.open_checkpoint(str(path).encode())
    for handle in (None, 0):  # accepted (a host arena has nothing to order)
        result = core.load(catalogue, "host", 0, options.settings, None, 1.0, cuda_stream=handle)
        assert result.stats["bytes"] == 48
    with pytest.raises(weightcast.Error) as raised:
        core.load(catalogue, "host", 0, options.settings, None, 1.0, cuda_stream=2)
    assert raised.value.status == 78
    assert "LoadOptions::cuda_stream is cudaStreamPerThread" in str(raised.value)
