"""What a hostile caller does on 3 ranks under mpirun: rank 0 loads while the others never
call weightcast (the rendezvous names them within `timeout`; Ctrl-C ends the wait), a rank
names another checkpoint (78 on every rank, naming both), two threads per rank load two
checkpoints at once (refused, never paired into the wrong destinations), and `alone=True`
loads on rank 0 alone.

One mpirun runs every case (tests/python/multirank_hostile_worker.py); each test reads what
the ranks wrote. The time bounds are hang checks with room for a loaded 2-core machine, not
speed figures.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from test_multirank import HERE, RANKS, free_ports, run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    policy, ref = root / "policy.safetensors", root / "ref.safetensors"
    save_file({"w": torch.full((64,), 1.0)}, str(policy))
    save_file({"w": torch.full((64,), 2.0)}, str(ref))
    out = tmp_path_factory.mktemp("hostile_ranks")
    r = run_ranks(HERE / "multirank_hostile_worker.py",
                  [str(policy), str(ref), str(out)] + [str(p) for p in free_ports(6)],
                  timeout=120)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return [json.loads((out / f"rank{i}.json").read_text()) for i in range(RANKS)]


def test_a_load_the_other_ranks_never_join_ends_within_its_timeout_naming_them(ranks):
    got = ranks[0]["never_joined"]
    assert not got["ok"]
    assert got["status"] == 75
    assert "rank 0: rendezvous: rank(s) 1-2 did not join rank 0" in got["message"], got["message"]
    # timeout=2: MPI's initialisation, which waits for every rank with no timeout of its own,
    # used to come first and hold rank 0 until mpirun gave up.
    assert got["seconds"] < 15, got


def test_ctrl_c_ends_a_load_the_other_ranks_never_join(ranks):
    got = ranks[0]["interrupted"]
    assert got.get("interrupt"), got
    assert got["seconds"] < 10, got  # SIGINT at 1 s; timeout 60


def test_a_second_load_on_several_ranks_from_another_thread_is_refused_at_once(ranks):
    first, second = ranks[0]["guard"]["first"], ranks[0]["guard"]["second"]
    assert not second["ok"] and second["status"] == 64, second
    assert second["message"].startswith("rank 0: another load on several ranks is in "
                                        "progress in this process"), second
    assert second["seconds"] < 1.5, second  # not after the first one's timeout
    assert not first["ok"] and first["status"] == 75, first  # the first went on to its end


def test_alone_loads_on_this_rank_only_under_mpirun(ranks):
    assert ranks[0]["alone"] == {**ranks[0]["alone"], "ok": True, "value": ["w"]}


def test_a_rank_naming_another_checkpoint_fails_every_rank_naming_both(ranks):
    for r in ranks:
        got = r["mismatch"]
        assert not got["ok"], got
        assert got["status"] == 78, got
        assert got["message"].startswith("rank 1: this rank's load is not rank 0's: this rank "
                                         "loads checkpoint '"), got
        assert "ref.safetensors', rank 0 loads checkpoint '" in got["message"], got
        assert "policy.safetensors'" in got["message"], got


def test_two_loads_at_once_are_refused_or_correct_never_swapped(ranks):
    for r in ranks:
        for name, got in r["concurrent"].items():
            where = f"rank {r['rank']}, {name}: {got}"
            if got["ok"]:
                assert got["values"] == [got["expected"]], where
            else:
                assert got["values"] == [0.0], where  # nothing landed
                assert got["status"] in (64, 75, 78), where
    # Started in another order on rank 1, the first loads met and were refused.
    assert any(not got["ok"] and got["status"] == 78
               for r in ranks for got in r["concurrent"].values())


def test_a_rank_interrupted_by_ctrl_c_is_named_as_such_on_the_others(tmp_path):
    # A load long enough (2,048 chunks) that rank 1's SIGINT at its first chunk stops it.
    checkpoint = tmp_path / "big.safetensors"
    save_file({"w": torch.zeros(8 << 20, dtype=torch.uint8)}, str(checkpoint))
    out = tmp_path / "ranks"
    out.mkdir()
    # Rank 1 ends without MPI_Finalize (a broadcast was in flight): mpirun's status is not
    # the test's; what each rank saw is.
    run_ranks(HERE / "multirank_interrupt_worker.py",
              [str(checkpoint), str(out), str(free_ports(1)[0])], timeout=120)
    got = [json.loads((out / f"rank{i}.json").read_text())["outcome"] for i in range(RANKS)]
    assert got[1].get("interrupt"), got
    for outcome in (got[0], got[2]):
        assert outcome.get("status") == 130, got
        assert outcome["message"] == "rank 1: interrupted by SIGINT (Ctrl-C) during the load", got
