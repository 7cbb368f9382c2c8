"""A world torch made is weightcast's world: processes started by torch.multiprocessing with a
FileStore gloo group (no launcher variables, no rendezvous port anywhere), and torchrun on
CPU, load bit-exact against torch's own reader — load, placement="fsdp", FSDP2 load_into,
and on a 2 × 2 mesh the DCP reader and load_into; a config that numbers the ranks otherwise
is refused on every rank; a rank killed mid-load ends every other rank with one message.

The ranks: tests/python/torch_world_worker.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import weightcast
from test_multirank import save_tiny_llama

HERE = Path(__file__).resolve().parent
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_WORLD_SIZE",
                      "WEIGHTCAST_TOKEN")


def bare_env() -> dict[str, str]:
    """This environment without any launcher's variables: the world must come from torch."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARIABLES and not k.startswith(("OMPI_", "PMIX_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(HERE))
    return env


def read_reports(out: Path, ranks: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("torch_world") / "llama"
    save_tiny_llama(directory)
    return directory


@pytest.fixture(scope="module")
def large_checkpoint(tmp_path_factory) -> Path:
    """64 MiB: at 4 KiB chunks through a ring of two slots, thousands of hand-offs between
    the ranks, so a rank killed from its (asynchronous) progress callback dies mid-load. On
    the tiny Llama, the whole load could end on every rank before the callback ran."""
    import torch
    from safetensors.torch import save_file

    directory = tmp_path_factory.mktemp("torch_world_large") / "large"
    directory.mkdir()
    generator = torch.Generator().manual_seed(40)
    save_file({f"layer.{i}.weight": torch.randn(1024, 2048, generator=generator)
               for i in range(8)}, str(directory / "model.safetensors"))
    return directory


def run(argv: list[str], timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=bare_env(), capture_output=True, text=True,
                          timeout=timeout)


def spawn(checkpoint: Path, out: Path, ranks: int, case: str = "all"):
    return run([sys.executable, str(HERE / "torch_world_worker.py"), "spawn", str(ranks),
                str(out / "store"), str(checkpoint), str(checkpoint), str(out), case])


def check_cases(reports: list[dict], ranks: int) -> None:
    for report in reports:
        rank = report["rank"]
        assert report["world_size"] == ranks
        assert report["launcher"]["OMPI_COMM_WORLD_SIZE"] is None
        assert report["load_exact"] is True, rank
        assert report["fsdp_exact"] is True, rank
        assert report["fsdp2_keys"] > 0
        assert report["fsdp2_load_into_mismatch"] == [], rank
        status, message = report["bad_config"]
        assert status == 78, message
        assert f"rank {(rank + 1) % ranks} of {ranks}" in message, message
        assert f"process group says rank {rank} of {ranks}" in message, message


@pytest.fixture(scope="module")
def spawned(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("spawned")
    r = spawn(checkpoint, out, 4)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return read_reports(out, 4)


def test_ranks_started_by_torch_multiprocessing_load_bit_exact(spawned):
    assert [r["launcher"]["RANK"] for r in spawned] == [None] * 4
    check_cases(spawned, 4)


def test_a_2x2_mesh_started_by_torch_multiprocessing_matches_torchs_reader(spawned):
    for report in spawned:
        assert report["mesh_keys"] > 0
        assert report["mesh_dcp_mismatch"] == [], report["rank"]
        assert report["mesh_load_into_mismatch"] == [], report["rank"]


def test_local_reads_under_a_torch_process_group_are_bit_exact(spawned):
    # The checkpoints were just written: in the page cache, so every load over the node ring
    # (transport auto: one node, no MPI world) had each rank read its own boxes itself, the
    # same decision on every rank — and the cases above found them bit-exact against
    # torch's own reader.
    for report in spawned:
        assert report["node_reads"], report["rank"]
        assert set(report["node_reads"]) == {"local"}, (report["rank"], report["node_reads"])
    assert len({len(r["node_reads"]) for r in spawned}) == 1


def test_torchrun_on_cpu_loads_bit_exact(checkpoint, tmp_path):
    r = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", "3", str(HERE / "torch_world_worker.py"), "env", "-", "-",
             str(checkpoint), str(checkpoint), str(tmp_path)])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    reports = read_reports(tmp_path, 3)
    assert [r["launcher"]["WORLD_SIZE"] for r in reports] == ["3"] * 3
    check_cases(reports, 3)


def test_a_rank_killed_mid_load_ends_every_other_rank_with_one_message(large_checkpoint,
                                                                       tmp_path):
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    r = spawn(large_checkpoint, tmp_path, 3, "kill")
    assert r.returncode != 0
    assert not (tmp_path / "rank2.json").exists()
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        status, message = report["killed"]
        assert status in (69, 75), message
        assert "rank 2" in message, message
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    # Others' segments (torch's, Open MPI's tests beside this one) aside: the node ring is a
    # memfd, which has no name there.
    left = {n for n in shm_after - shm_before
            if not n.startswith(("torch_", "vader_segment", "sm_segment"))}
    assert not left, sorted(left)
