"""weightcast.load_into at world size 1: whole tensors into a model's own parameters and
buffers, tied weights, key_map, load_state_dict's key reports, dtype casts at the receiver."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

import weightcast
from conftest import raw_bytes


def _llama(seed: int, tie: bool = False, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tie)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(dtype)


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random Llama written by transformers' save_pretrained (no download)."""
    out = {}
    for tie in (False, True):
        model = _llama(1, tie)
        path = tmp_path_factory.mktemp(f"llama_tie{tie}")
        model.save_pretrained(path, safe_serialization=True)
        out[tie] = (path, _state(model))
    return out


def test_a_save_pretrained_llama_loads_bit_exact(saved):
    path, want = saved[False]
    model = _llama(2)
    report = weightcast.load_into(model, path)
    assert report.missing_keys == [] and report.unexpected_keys == []
    assert sorted(report.loaded_keys) == sorted(want)
    assert report.cast_keys == []
    assert report.bytes == sum(t.numel() * t.element_size() for t in want.values())
    got = model.state_dict()
    for k, v in want.items():
        assert raw_bytes(got[k]) == raw_bytes(v), k
    # The same as torch's own load of the same file.
    ref = _llama(3)
    ref.load_state_dict(load_file(str(path / "model.safetensors")))
    for k, v in ref.state_dict().items():
        assert raw_bytes(got[k]) == raw_bytes(v), k


def test_tied_weights_load_through_either_key(saved):
    path, want = saved[True]
    assert "lm_head.weight" not in load_file(str(path / "model.safetensors"))
    model = _llama(2, tie=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    report = weightcast.load_into(model, path)  # strict: the tied key is not missing
    assert report.missing_keys == []
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert raw_bytes(model.lm_head.weight) == raw_bytes(want["model.embed_tokens.weight"])


def test_bf16_checkpoint_into_fp32_params_and_back(tmp_path):
    bf16 = _llama(4, dtype=torch.bfloat16)
    bf16.save_pretrained(tmp_path / "bf16", safe_serialization=True)
    fp32 = _llama(5)
    report = weightcast.load_into(fp32, tmp_path / "bf16")
    assert sorted(report.cast_keys) == sorted(fp32.state_dict())
    for k, v in bf16.state_dict().items():
        assert fp32.state_dict()[k].dtype == torch.float32
        assert raw_bytes(fp32.state_dict()[k]) == raw_bytes(v.float()), k

    src = _llama(6)
    src.save_pretrained(tmp_path / "fp32", safe_serialization=True)
    for dtype in (torch.bfloat16, torch.float16):
        dst = _llama(7, dtype=dtype)
        weightcast.load_into(dst, tmp_path / "fp32")
        for k, v in src.state_dict().items():
            assert raw_bytes(dst.state_dict()[k]) == raw_bytes(v.to(dtype)), (dtype, k)


def test_casts_are_bit_exact_with_tensor_to_on_edge_values(tmp_path):
    f32 = torch.tensor([0.0, -0.0, 1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-9, 3.0e38,
                        -3.4e38, 65504.0, 65520.0, 1e-40, -1e-45, 6e-8, 2.0**-24, 2.0**-25,
                        float("inf"), float("-inf"), 1.1754942e-38, 0.1, -123.456,
                        float("nan"), -float("nan")],
                       dtype=torch.float32)
    f32 = torch.cat([f32, torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e4])
    path = tmp_path / "edge.safetensors"
    save_file({"x": f32, "y": f32.bfloat16(), "z": f32.half()}, str(path))
    cases = [("x", torch.bfloat16), ("x", torch.float16), ("x", torch.float64),
             ("y", torch.float32), ("z", torch.float32), ("y", torch.float16)]
    for src_key, dtype in cases:
        ref = load_file(str(path))[src_key]
        dest = {src_key: torch.empty(ref.shape, dtype=dtype)}
        report = weightcast.load_into(dest, path, strict=False)
        assert report.cast_keys == [src_key]
        want = ref.to(dtype)
        # NaN stays NaN of its sign; its payload is the library's (torch's own CPU casts
        # disagree there: the vectorised F32 -> BF16 path gives 0xFFFF for every NaN).
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(dest[src_key]), nan), (src_key, dtype)
        assert raw_bytes(dest[src_key][~nan]) == raw_bytes(want[~nan]), (src_key, dtype)


def test_buffers_load_too(tmp_path):
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    src[1].running_mean.uniform_()
    src[1].num_batches_tracked.fill_(17)
    save_file(src.state_dict(), str(tmp_path / "bn.safetensors"))
    dst = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    weightcast.load_into(dst, tmp_path / "bn.safetensors")
    assert dst[1].num_batches_tracked.item() == 17
    assert torch.equal(dst[1].running_mean, src[1].running_mean)
    assert torch.equal(dst[0].weight, src[0].weight)


def test_strict_names_missing_and_unexpected_keys_before_reading(tmp_path):
    save_file({"0.weight": torch.ones(3, 4), "extra.thing": torch.zeros(1)},
              str(tmp_path / "m.safetensors"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    before = model[0].weight.detach().clone()
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_into(model, tmp_path / "m.safetensors")
    assert e.value.status == 65
    msg = str(e.value)
    assert 'missing key(s) in the checkpoint: "0.bias"' in msg
    assert 'unexpected key(s) in the checkpoint: "extra.thing"' in msg
    assert "Sequential" in msg
    assert torch.equal(model[0].weight, before)  # nothing landed
    report = weightcast.load_into(model, tmp_path / "m.safetensors", strict=False)
    assert report.missing_keys == ["0.bias"] and report.unexpected_keys == ["extra.thing"]
    assert torch.equal(model[0].weight, torch.ones(3, 4))
    # Alone, the verdict counts what landed (one of the checkpoint's two tensors).
    assert report.verdict == "1 rank: 1 tensor loaded (nothing to compare)"


def test_a_shape_mismatch_raises_even_when_not_strict(tmp_path):
    save_file({"0.weight": torch.ones(3, 5), "0.bias": torch.ones(3)},
              str(tmp_path / "s.safetensors"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    for strict in (True, False):
        with pytest.raises(weightcast.Error) as e:
            weightcast.load_into(model, tmp_path / "s.safetensors", strict=strict)
        assert e.value.status == 65
        assert "size mismatch for 0.weight" in str(e.value)
        assert "[3, 5]" in str(e.value) and "[3, 4]" in str(e.value)


def test_integer_against_float_does_not_cast(tmp_path):
    save_file({"n": torch.arange(3)}, str(tmp_path / "i.safetensors"))
    with pytest.raises(weightcast.Error, match="dtype mismatch for n") as e:
        weightcast.load_into({"n": torch.zeros(3)}, tmp_path / "i.safetensors")
    assert e.value.status == 65


def test_key_map_prefix_dict_and_callable(saved):
    from transformers import LlamaModel

    path, want = saved[False]
    bare = LlamaModel(_llama(2).config)
    # The prefix leaves lm_head.weight unexpected (a bare LlamaModel has no head).
    with pytest.raises(weightcast.Error, match='"lm_head.weight"'):
        weightcast.load_into(bare, path, key_map="model.")
    report = weightcast.load_into(bare, path, key_map="model.", strict=False)
    assert report.unexpected_keys == ["lm_head.weight"] and report.missing_keys == []
    assert raw_bytes(bare.norm.weight) == raw_bytes(want["model.norm.weight"])
    # A callable returning None skips a tensor: not unexpected.
    report = weightcast.load_into(
        bare, path, key_map=lambda k: None if k == "lm_head.weight" else k[len("model."):])
    assert report.unexpected_keys == []
    # A dict renames single keys.
    dest = {"head": torch.empty_like(want["lm_head.weight"])}
    report = weightcast.load_into(dest, path, key_map={"lm_head.weight": "head"}, strict=False)
    assert report.loaded_keys == ["head"]
    assert raw_bytes(dest["head"]) == raw_bytes(want["lm_head.weight"])
    with pytest.raises(weightcast.Error, match="maps both") as e:
        weightcast.load_into(dest, path, key_map=lambda k: "head", strict=False)
    assert e.value.status == 64


def test_a_key_map_callable_that_raises_raises_its_own_exception(tmp_path):
    save_file({"w": torch.ones(2)}, str(tmp_path / "w.safetensors"))

    def broken(key: str) -> str:
        raise LookupError(f"no rule for {key}")

    dest = {"w": torch.zeros(2)}
    with pytest.raises(LookupError, match="no rule for w"):
        weightcast.load_into(dest, tmp_path / "w.safetensors", key_map=broken)
    assert dest["w"].tolist() == [0.0, 0.0]


def test_meta_tensors_ask_for_to_empty(saved):
    path, _ = saved[False]
    with torch.device("meta"):
        model = _llama(2)
    with pytest.raises(weightcast.Error, match=r"to_empty\(device=") as e:
        weightcast.load_into(model, path)
    assert e.value.status == 64
    model.to_empty(device="cpu")
    assert weightcast.load_into(model, path).missing_keys == []


def test_non_contiguous_and_odd_destinations(tmp_path):
    save_file({"t": torch.arange(12.0).reshape(3, 4)}, str(tmp_path / "t.safetensors"))
    big = torch.zeros(4, 3)
    dest = {"t": big.t()[:, :]}  # a transposed view: not contiguous
    report = weightcast.load_into(dest, tmp_path / "t.safetensors")
    assert torch.equal(big.t(), torch.arange(12.0).reshape(3, 4))
    assert report.staged_keys == ["t"]  # strided: it lands first, then copy_ scatters it


def test_destinations_the_receiver_can_write_land_in_place(tmp_path):
    """Contiguous host tensors in the checkpoint's dtype, or one cast away (BF16/F16 <-> F32),
    receive the bytes themselves; other casts land first in the checkpoint's dtype."""
    save_file({"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4).bfloat16(),
               "c": torch.full((2,), 0.5, dtype=torch.float16)}, str(tmp_path / "m.safetensors"))
    dest = {"a": torch.zeros(2, 3), "b": torch.zeros(4), "c": torch.zeros(2, dtype=torch.bfloat16)}
    pointers = {k: v.data_ptr() for k, v in dest.items()}
    report = weightcast.load_into(dest, tmp_path / "m.safetensors")
    assert report.loaded_keys == ["a", "b", "c"] and report.cast_keys == ["b", "c"]
    assert report.staged_keys == ["c"]  # F16 -> BF16 is torch's cast, not the receiver's
    assert report.bytes == 6 * 4 + 4 * 2 + 2 * 2
    assert {k: v.data_ptr() for k, v in dest.items()} == pointers
    assert torch.equal(dest["a"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(dest["b"], torch.ones(4)) and dest["c"].tolist() == [0.5, 0.5]


def test_a_missing_checkpoint_is_66(tmp_path):
    with pytest.raises(weightcast.Error) as e:
        weightcast.load_into({"x": torch.zeros(1)}, tmp_path / "nope")
    assert e.value.status == 66


def test_fsdp2_on_a_one_rank_gloo_mesh(saved, tmp_path):
    """fully_shard + to_empty + load_into on world size 1: DTensor parameters land through
    to_local() (the multi-rank path's local-shard derivation, with one shard)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    path, want = saved[False]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        with torch.device("meta"):
            model = _llama(2)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        model.to_empty(device="cpu")
        assert isinstance(model.model.embed_tokens.weight, DTensor)
        report = weightcast.load_into(model, path)
        assert report.missing_keys == [] and report.unexpected_keys == []
        for k, v in model.state_dict().items():
            local = v.to_local() if isinstance(v, DTensor) else v
            assert raw_bytes(local) == raw_bytes(want[k]), k
        # A training step runs on what was loaded.
        out = model(torch.randint(0, 256, (2, 8))).logits.float().sum()
        out.backward()
    finally:
        dist.destroy_process_group()


def test_tensors_torch_cannot_hold_do_not_block_the_others(tmp_path):
    from conftest import write_safetensors

    path = write_safetensors(tmp_path / "mixed.safetensors", {
        "w": ("F32", [2], b"\0\0\x80\x3f\0\0\0\x40"),
        "six": ("F6_E3M2", [4], bytes(3)),
        "odd": ("F4", [3, 2, 1], bytes(3)),
    })
    dest = {"w": torch.zeros(2)}
    report = weightcast.load_into(dest, path, strict=False)
    assert report.unexpected_keys == ["six", "odd"]
    assert dest["w"].tolist() == [1.0, 2.0]
    with pytest.raises(weightcast.Error, match="F6_E3M2") as e:
        weightcast.load_into({"six": torch.zeros(4)}, path, strict=False)
    assert e.value.status == 65


def test_the_load_hf_model_example_runs(saved):
    import subprocess
    import sys
    from pathlib import Path

    path, _ = saved[False]
    example = Path(__file__).resolve().parents[2] / "examples" / "load_hf_model.py"
    out = subprocess.run([sys.executable, str(example), str(path), "--dtype", "bfloat16"],
                         check=True, capture_output=True, text=True).stdout
    assert "missing [], unexpected []" in out and "finite: True" in out, out
    # The same logits as transformers' own from_pretrained of the same directory.
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ref.config, torch_dtype=torch.float32)
    model.to_empty(device="cpu")
    sys.path.insert(0, str(example.parent))
    try:
        from load_hf_model import rebuild_transient_buffers
    finally:
        sys.path.remove(str(example.parent))
    rebuild_transient_buffers(model)
    weightcast.load_into(model, path)
    ids = torch.arange(8).unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, ref.eval()(ids).logits)
