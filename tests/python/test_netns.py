"""load_into across nodes: FSDP2 on gloo, 2 nodes × 2 ranks made of network namespaces
(scripts/netns_cluster.sh), mpirun through its rsh agent, the checkpoint on node 0 only, no
MASTER_ADDR for weightcast (rank 0's host comes from mpirun's PMIx). Needs root and iproute2:
skipped with the reason elsewhere (tests/netns has the CLI's cases)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import weightcast

HERE = Path(__file__).resolve().parent
CLUSTER = HERE.parent.parent / "scripts" / "netns_cluster.sh"


def test_fsdp2_load_into_across_two_nodes_is_bit_exact(tmp_path):
    check = subprocess.run(["bash", str(CLUSTER), "check"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"no namespace cluster here: {check.stdout.strip()}")
    if shutil.which("mpirun") is None or not weightcast.build_info()["mpi"]:
        pytest.skip("no MPI in this build or no mpirun on PATH (scripts/install-deps.sh)")
    from safetensors.torch import save_file

    sys.path.insert(0, str(HERE))
    from multirank_worker import llama

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    model = llama(torch.bfloat16).to_empty(device="cpu")
    gen = torch.Generator().manual_seed(7)
    state = {k: torch.randn(v.shape, generator=gen).to(v.dtype)
             for k, v in model.state_dict().items()}
    save_file(state, str(ckpt / "model.safetensors"))
    inner = (
        'exec mpirun --allow-run-as-root --bind-to none --hostfile "$NETNS_CLUSTER_HOSTFILE" '
        '--mca plm_rsh_agent "$NETNS_CLUSTER_AGENT" -x OMP_NUM_THREADS=1 -x PYTHONPATH '
        f'-np 4 {sys.executable} {HERE / "netns_worker.py"} {ckpt} tcp://10.99.0.1:29400')
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(HERE)
    r = subprocess.run(["bash", str(CLUSTER), "run", "-n", "2", "--only-on-node0", str(ckpt),
                        "--", "sh", "-c", inner], env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"netns: {len(state)} tensors bit-exact" in r.stdout, r.stdout + r.stderr
    for rank, node in ((0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")):
        assert f"netns: rank {rank} on {node}, off node 0: {node != 'node0'}" in r.stdout
