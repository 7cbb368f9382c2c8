"""One rank of tests/python/test_multirank_hostile.py's Ctrl-C case, started by mpirun (not
collected by pytest).

    mpirun -n 3 python multirank_interrupt_worker.py CHECKPOINT OUT_DIR PORT

Every rank loads CHECKPOINT in small chunks; rank 1 gets SIGINT (as from Ctrl-C) at its first
progress update. Every rank writes OUT_DIR/rank{N}.json with what it saw, then waits for the
others' (a process that leaves MPI with a broadcast in flight ends without MPI_Finalize, and
mpirun may then end the rest before they have written theirs).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import weightcast


def main() -> None:
    checkpoint, out_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    sent: list = []

    def progress(p) -> None:
        if rank == 1 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    signal.signal(signal.SIGINT, signal.default_int_handler)
    report: dict = {"rank": rank}
    try:
        weightcast.load(checkpoint, chunk_size=4096, timeout=30, rendezvous_port=port,
                        progress=progress)
        report["outcome"] = {"ok": True}
    except weightcast.Error as e:
        report["outcome"] = {"ok": False, "status": e.status, "message": str(e)}
    except KeyboardInterrupt:
        report["outcome"] = {"ok": False, "interrupt": True}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    deadline = time.monotonic() + 30
    while (time.monotonic() < deadline and
           not all((out_dir / f"rank{r}.json").exists() for r in range(3))):
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
