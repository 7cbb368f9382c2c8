"""weightcast inside the training frameworks, each where it is installed (neither is a
dependency of the project): torchtitan's Hugging Face load through the state-dict adapter of
examples/torchtitan_adapter.py, and accelerate's FSDP2 start through
examples/accelerate_fsdp2.py's weightcast_fsdp2_loading. Each runs its example on 2 ranks
under mpirun (gloo CPU mesh), which compares every rank's local shards with the framework's
own load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_multirank import free_ports, run_ranks, save_tiny_llama

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RANKS = 2


def _reports(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]


def test_torchtitan_loads_the_debug_model_through_weightcasts_reader(tmp_path):
    pytest.importorskip("torchtitan.components.checkpointer.dcp",
                        reason="torchtitan is not installed (pip install torchtitan)")
    out = tmp_path / "out"
    out.mkdir()
    torch_port, weightcast_port = free_ports(2)
    r = run_ranks(EXAMPLES / "torchtitan_adapter.py",
                  [str(tmp_path / "work"), "--master-port", str(torch_port),
                   "--weightcast-port", str(weightcast_port), "--timeout", "30",
                   "--report", str(out)], ranks=RANKS, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for report in _reports(out):
        # torchtitan's CheckpointManager asked the adapter once, and got weightcast's reader
        assert report["readers"] == ["weightcast.dcp.HuggingFaceStorageReader"], report
        # the debugmodel's 57 tensors, FSDP2's DTensors, FP32 params from a BF16 checkpoint,
        # bit-exact against the same load through torch's reader
        assert report["keys"] == 57 and report["sharded"] == 57, report
        assert report["dtypes"] == ["torch.float32"], report
        assert report["mismatch"] == [], report


def test_accelerate_fsdp2_loads_through_load_into_as_its_broadcast_does(tmp_path):
    pytest.importorskip("accelerate", reason="accelerate is not installed (pip install "
                        "accelerate)")
    # save_pretrained omits a tied lm_head.weight: the load must tie it again.
    save_tiny_llama(tmp_path / "untied")
    save_tiny_llama(tmp_path / "tied", tie_word_embeddings=True)
    out = tmp_path / "out"
    out.mkdir()
    torch_port, weightcast_port = free_ports(2)
    r = run_ranks(EXAMPLES / "accelerate_fsdp2.py",
                  [str(tmp_path / "untied"), str(tmp_path / "tied"),
                   "--master-port", str(torch_port),
                   "--weightcast-port", str(weightcast_port), "--timeout", "30",
                   "--report", str(out)], ranks=RANKS, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    for report in _reports(out):
        for tied in ("untied", "tied"):
            for dtype in ("bfloat16", "float32"):  # FP32: cast at the receiver
                got = report[f"{tied}/{dtype}"]
                assert got["keys"] == 21 and got["sharded"] == 21, (report["rank"], got)
                assert got["dtypes"] == [dtype], (report["rank"], got)
                assert got["mismatch"] == [] and got["buffers"] == [], (report["rank"], got)
                assert got["tied"] == [tied == "tied"] * 2, (report["rank"], got)
