"""``load_into_async`` on 3 ranks under mpirun: each rank starts the load on an FSDP2 model
(uneven shards on a gloo CPU mesh), does torch work of its own meanwhile (a gloo collective,
matmuls), then waits; every local shard is bit-exact against torch's reader
(``safetensors.torch.load_file``), and a second load on several ranks while one runs is
refused (64). The ranks run tests/python/multirank_async_worker.py."""

from __future__ import annotations

import json

import pytest

from test_multirank import HERE, RANKS, free_ports, run_ranks, save_tiny_llama


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("llama_bf16")
    save_tiny_llama(checkpoint)
    out = tmp_path_factory.mktemp("ranks")
    ports = free_ports(4)
    r = run_ranks(HERE / "multirank_async_worker.py", [str(checkpoint), str(out)] +
                  [str(p) for p in ports])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_fsdp2_load_into_async_is_bit_exact_against_torchs_reader(ranks, dtype):
    for r in ranks:
        assert r["world_size"] == RANKS
        assert r[f"{dtype}_keys"], r["rank"]
        assert r[f"{dtype}_mismatch"] == [], r["rank"]
        assert r[f"{dtype}_gathered_mismatch"] == [], r["rank"]
        rep = r[f"{dtype}_report"]
        assert rep["missing"] == [] and rep["unexpected"] == [] and rep["loaded"] > 0
        assert rep["verdict"].startswith("3 ranks, ") and "bit-exact" in rep["verdict"]
        # The last progress update is this rank's last chunk.
        done, total = r[f"{dtype}_progress"]
        assert done == total > 0


def _early(ranks, dtype):
    """The ranks that started before the late one joined: their loads were surely running
    when they looked (the late rank is rank 0 in one round, rank 1 in the other)."""
    early = [r for r in ranks if r["rank"] != r[f"{dtype}_late"]]
    assert len(early) == RANKS - 1
    return early


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_handle_comes_back_before_the_load_and_torch_work_runs_meanwhile(ranks, dtype):
    for r in _early(ranks, dtype):
        assert r[f"{dtype}_done_at_once"] is False, r["rank"]
    for r in ranks:
        assert r[f"{dtype}_returned_s"] < 2.0, r
        assert r[f"{dtype}_all_reduce"] == sum(range(1, RANKS + 1))
        assert r[f"{dtype}_matmul_finite"]
        assert r[f"{dtype}_done"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_second_load_on_several_ranks_while_one_runs_is_64(ranks, dtype):
    for r in _early(ranks, dtype):
        async_refused, blocking_refused = r[f"{dtype}_second_refused"]
        for refused in (async_refused, blocking_refused):
            assert refused is not None, r["rank"]
            assert refused["status"] == 64, refused
            assert "one at a time per process" in refused["message"], refused


def test_a_rank_that_cancels_ends_every_ranks_load_naming_it(tmp_path):
    import torch
    from safetensors.torch import save_file

    # A load long enough (2,048 chunks) that rank 1's cancel at its first update stops it.
    checkpoint = tmp_path / "big.safetensors"
    save_file({"w": torch.zeros(8 << 20, dtype=torch.uint8)}, str(checkpoint))
    out = tmp_path / "ranks"
    out.mkdir()
    # Rank 1 may end without MPI_Finalize (a broadcast was in flight): mpirun's status is not
    # the test's; what each rank saw is.
    run_ranks(HERE / "multirank_cancel_worker.py",
              [str(checkpoint), str(out), str(free_ports(1)[0])], timeout=120)
    got = [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]
    done, total = got[1]["cancelled_at"]
    assert done < total, got[1]
    for r in got:
        outcome = r["outcome"]
        assert outcome.get("status") == 130, got
        assert outcome["message"] == "rank 1: cancelled (LoadHandle.cancel()) during the load", got
