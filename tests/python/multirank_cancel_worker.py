"""One rank of tests/python/test_multirank_async.py's cancel case, started by mpirun (not
collected by pytest).

    mpirun -n 3 python multirank_cancel_worker.py CHECKPOINT OUT_DIR PORT

Every rank starts ``load_async`` of CHECKPOINT in small chunks; rank 1 calls
``handle.cancel()`` once its first progress update has come. Every rank writes
OUT_DIR/rank{N}.json with what its ``wait()`` raised, then waits for the others' (a process
that leaves MPI with a broadcast in flight ends without MPI_Finalize, and mpirun may then end
the rest before they have written theirs), as multirank_interrupt_worker.py does.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import weightcast


def main() -> None:
    checkpoint, out_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    report: dict = {"rank": rank}
    handle = weightcast.load_async(checkpoint, chunk_size=4096, timeout=30,
                                   rendezvous_port=port, progress=False)
    if rank == 1:
        while handle.progress is None and not handle.done():
            time.sleep(0.005)
        report["cancelled_at"] = None if handle.progress is None else [
            handle.progress.bytes_done, handle.progress.bytes_total]
        handle.cancel()
    try:
        handle.wait()
        report["outcome"] = {"ok": True}
    except weightcast.Error as e:
        report["outcome"] = {"ok": False, "status": e.status, "message": str(e)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    deadline = time.monotonic() + 30
    while (time.monotonic() < deadline and
           not all((out_dir / f"rank{r}.json").exists() for r in range(3))):
        time.sleep(0.05)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
