"""weightcast.load and load_into on 3 ranks under mpirun: rank 0 alone reads a transformers
checkpoint, FSDP2 local shards (uneven, on a gloo CPU mesh) land bit-exact against torch's own
`set_model_state_dict(broadcast_from_rank0=True)`, BF16 and FP32 params (the FP32 ones cast
at the receiver), and a strict failure raises on every rank naming the key.

One mpirun runs every case (tests/python/multirank_worker.py); each test reads what the ranks
wrote. Ports are picked free (bound to port 0), never fixed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import weightcast

RANKS = 3
HERE = Path(__file__).resolve().parent


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on every address now, at random below the kernel's ephemeral
    range: a port from that range, free a moment ago, may be another process's connection by
    the time a rank binds it ("Address already in use"), one below it only if that process
    asks for it (tests/support/ports.cpp)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            highest = int(f.read().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        highest = 32767
    ports: list[int] = []
    for _ in range(1000):
        port = random.randint(10000, highest)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"free_ports: found {len(ports)} of {n} free ports below {highest + 1}")


def mpirun_argv(ranks: int) -> list[str]:
    """mpirun as tests/support/mpirun.cpp starts it (--oversubscribe; --allow-run-as-root as
    root), unbound: 3 ranks on a 2-core machine must not be pinned to one core each."""
    mpirun = shutil.which("mpirun")
    if mpirun is None or not weightcast.build_info()["mpi"]:
        pytest.skip("no MPI in this build or no mpirun on PATH (scripts/install-deps.sh)")
    argv = [mpirun, "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    return argv + ["-n", str(ranks)]


def run_ranks(script: Path, args: list[str], ranks: int = RANKS, timeout: float = 240):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # the world comes from mpirun's environment
    return subprocess.run(mpirun_argv(ranks) + [sys.executable, str(script), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def save_tiny_llama(directory: Path, tie_word_embeddings: bool = False) -> None:
    """A seeded 2-layer Llama in BF16, as transformers' ``save_pretrained`` writes it (one
    ``model.safetensors``; with tied embeddings, without ``lm_head.weight``): the checkpoint
    the multi-rank tests load."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(3)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory,
                                                                safe_serialization=True)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("llama_bf16")
    save_tiny_llama(checkpoint)
    out = tmp_path_factory.mktemp("ranks")
    ports = free_ports(10)
    r = run_ranks(HERE / "multirank_worker.py", [str(checkpoint), str(out)] +
                  [str(p) for p in ports])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]


def test_load_gives_every_rank_every_tensor_only_rank_0_reading(ranks):
    for r in ranks:
        assert r["world_size"] == RANKS
        assert r["load_keys"] and r["load_exact"], r["rank"]


def test_load_with_placement_fsdp_gives_each_rank_its_rows(ranks):
    assert all(r["fsdp_exact"] for r in ranks)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fsdp2_load_into_matches_set_model_state_dict_bit_exact(ranks, dtype):
    for r in ranks:
        assert r[f"{dtype}_keys"], r["rank"]
        assert r[f"{dtype}_mismatch"] == [], r["rank"]
        rep = r[f"{dtype}_report"]
        assert rep["missing"] == [] and rep["unexpected"] == [] and rep["loaded"] > 0
        assert rep["staged"] == []  # every local shard landed in to_local() itself
        # A BF16 checkpoint: FP32 params are every one a cast at the receiver.
        assert rep["cast"] == (rep["loaded"] if dtype == "float32" else 0)
    # The shards are uneven and each rank holds its own: 256 vocab rows as 86/86/84.
    rows = [r[f"{dtype}_shapes"]["model.embed_tokens.weight"][0] for r in ranks]
    assert rows == [86, 86, 84]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_load_into_reports_rank_0s_verdict_on_every_rank(ranks, dtype):
    # By default every rank's local shards are hashed and checked by rank 0.
    verdicts = {r[f"{dtype}_verdict"] for r in ranks}
    assert len(verdicts) == 1, verdicts
    verdict = verdicts.pop()
    assert verdict.startswith("3 ranks, ") and "local shards bit-exact" in verdict, verdict


def test_load_into_with_verify_false_lands_the_same_bytes_and_says_it_did_not_compare(ranks):
    for r in ranks:
        assert r["unverified_exact"], r["rank"]
        assert r["unverified_verdict"].endswith("not compared (verify: none)"), r
        assert "bit-exact" not in r["unverified_verdict"]


def test_a_strict_failure_raises_on_every_rank_naming_the_key(ranks):
    for r in ranks:
        assert r["strict"] is not None, r["rank"]
        assert r["strict"]["status"] == 65
        assert "extra.not_in_checkpoint" in r["strict"]["message"]
        assert "missing key(s)" in r["strict"]["message"]
        assert r["after_failure"], r["rank"]


def test_the_fsdp2_train_example_loads_and_takes_a_training_step(ranks):
    """examples/fsdp2_train.py on 3 ranks (its main, in the same mpirun): every rank computes
    the same finite loss on the same batch."""
    losses = [r["example_loss"] for r in ranks]
    assert all(loss == loss and abs(loss) < 1e4 for loss in losses), losses
    assert len(set(losses)) == 1, losses
