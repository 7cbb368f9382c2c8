"""One rank of tests/python/test_multirank_hostile.py, started by mpirun (not collected by
pytest).

    mpirun -n 3 python multirank_hostile_worker.py POLICY REF OUT_DIR PORT×6

POLICY and REF are two one-tensor checkpoints ("w", the same shape, other values). Rank 0
first runs alone the cases where the others never call weightcast, while ranks 1 and 2 wait
for its word (a file); then every rank runs the cases they share. Every rank writes
OUT_DIR/rank{N}.json with what it saw; the test asserts on those.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch

import weightcast
from multirank_worker import run_worker


def outcome(call) -> dict:
    begin = time.monotonic()
    try:
        value = call()
        return {"ok": True, "value": value, "seconds": time.monotonic() - begin}
    except weightcast.Error as e:
        return {"ok": False, "status": e.status, "message": str(e),
                "seconds": time.monotonic() - begin}
    except KeyboardInterrupt:
        return {"ok": False, "interrupt": True, "seconds": time.monotonic() - begin}


def wait_for(flag: Path) -> None:
    # Bounded: should rank 0 hang, this rank must not outlive the test's mpirun.
    deadline = time.monotonic() + 100
    while not flag.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"rank 0 never wrote {flag}")
        time.sleep(0.05)


def main() -> None:
    policy, ref, out_dir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ports = [int(p) for p in sys.argv[4:]]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    report: dict = {"rank": rank}
    quiet = {"progress": False}
    rank0_done = out_dir / "rank0-alone-done"

    if rank == 0:
        # The others never call weightcast: the rendezvous ends the call within its timeout,
        # naming them (MPI's initialisation, which has no timeout, comes after it).
        report["never_joined"] = outcome(
            lambda: weightcast.load(policy, timeout=2, rendezvous_port=ports[0], **quiet))
        # Ctrl-C while the others never come: KeyboardInterrupt, not a wait for the timeout.
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        report["interrupted"] = outcome(
            lambda: weightcast.load(policy, timeout=60, rendezvous_port=ports[1], **quiet))
        timer.join()
        # A second load on several ranks from another thread while the first waits at the
        # rendezvous: refused at once, the first going on to its own end.
        first: dict = {}
        waiting = threading.Thread(target=lambda: first.update(outcome(
            lambda: weightcast.load(policy, timeout=2, rendezvous_port=ports[4], **quiet))))
        waiting.start()
        time.sleep(0.5)
        second = outcome(lambda: weightcast.load(ref, timeout=2, rendezvous_port=ports[5],
                                                 **quiet))
        waiting.join()
        report["guard"] = {"first": first, "second": second}
        # Alone under mpirun: a load on this rank only, with no rendezvous.
        report["alone"] = outcome(
            lambda: sorted(weightcast.load(policy, alone=True, **quiet)))
        rank0_done.write_text("done")
    else:
        wait_for(rank0_done)

    # Rank 1 names another checkpoint: every rank fails with 78 naming rank 1's and rank 0's.
    mine = ref if rank == 1 else policy
    report["mismatch"] = outcome(
        lambda: sorted(weightcast.load(mine, timeout=30, rendezvous_port=ports[2], **quiet)))

    # Two threads per rank load two checkpoints at once, started in another order on rank 1:
    # paired in arrival order, rank 1's "ref" would receive the policy's bytes. Each thread
    # ends refused, or with its own checkpoint's values.
    expected = {"policy": 1.0, "ref": 2.0}
    order = ["ref", "policy"] if rank == 1 else ["policy", "ref"]
    results: dict = {}

    def load_one(name: str, delay: float) -> None:
        time.sleep(delay)
        dest = torch.zeros(64)
        path = policy if name == "policy" else ref
        got = outcome(lambda: weightcast.load_into(
            {"w": dest}, path, timeout=5, rendezvous_port=ports[3], **quiet).verdict)
        got["values"] = sorted(set(dest.tolist()))
        got["expected"] = expected[name]
        results[name] = got

    threads = [threading.Thread(target=load_one, args=(name, 0.3 * i))
               for i, name in enumerate(order)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report["concurrent"] = results
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_worker(main)
