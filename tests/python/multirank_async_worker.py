"""One rank of tests/python/test_multirank_async.py, started by mpirun (not collected by
pytest).

    mpirun -n 3 python multirank_async_worker.py CHECKPOINT_DIR OUT_DIR TORCH_PORT PORT×3

Every rank starts ``load_into_async`` on an FSDP2 model (a gloo CPU mesh), does torch work of
its own meanwhile (a gloo all_reduce, matmuls), then waits; it writes OUT_DIR/rank{N}.json
with what it saw, and the test asserts on those. Rank 0 alone runs beside the checkpoint
(multirank_worker.run_beside_checkpoint), so the others cannot open it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import weightcast
from multirank_worker import local_shards, raw, run_beside_checkpoint, run_worker, sharded


def main() -> None:
    checkpoint, out_dir, torch_port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    ports = [int(p) for p in sys.argv[4:]]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    mine = run_beside_checkpoint(checkpoint, out_dir, rank)
    from safetensors.torch import load_file

    full = {}
    for f in sorted(checkpoint.glob("*.safetensors")):  # torch's reader: the reference
        full.update(load_file(str(f)))
    report: dict = {"rank": rank, "world_size": world}
    options = {"timeout": 60, "progress": False}

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    for i, dtype in enumerate((torch.bfloat16, torch.float32)):
        name = str(dtype).removeprefix("torch.")
        model = sharded(dtype, mesh)
        # One rank starts late, once the others have started and looked at their handles:
        # their loads cannot end before it joins (the ranks meet inside the load), so what
        # they see of a running load is certain. The late rank's own load may end at once.
        late = i % world
        report[f"{name}_late"] = late
        if rank == late:
            dist.barrier()
        started = time.monotonic()
        handle = weightcast.load_into_async(model, mine, rendezvous_port=ports[i], **options)
        report[f"{name}_returned_s"] = time.monotonic() - started
        report[f"{name}_done_at_once"] = handle.done()
        if rank != late:
            # One load on several ranks at a time per process: a second one, async or
            # blocking, is refused here (64) while this one runs.
            refused = []
            for call in (lambda: weightcast.load_async(mine, rendezvous_port=ports[2],
                                                       **options),
                         lambda: weightcast.load(mine, rendezvous_port=ports[2], **options)):
                try:
                    call()
                    refused.append(None)
                except weightcast.Error as e:
                    refused.append({"status": e.status, "message": str(e)})
            report[f"{name}_second_refused"] = refused
            dist.barrier()
        # Torch work of this rank's own while the load runs: a collective on the gloo group
        # and some matmuls.
        x = torch.full((1024,), float(rank + 1))
        dist.all_reduce(x)
        report[f"{name}_all_reduce"] = float(x[0])
        y = torch.randn(128, 128, generator=torch.Generator().manual_seed(rank))
        for _ in range(10):
            y = torch.tanh(y @ y.T / 128)
        report[f"{name}_matmul_finite"] = bool(torch.isfinite(y).all())
        result = handle.wait()
        report[f"{name}_done"] = handle.done()
        p = handle.progress
        report[f"{name}_progress"] = None if p is None else [p.bytes_done, p.bytes_total]
        report[f"{name}_report"] = {"missing": result.missing_keys,
                                    "unexpected": result.unexpected_keys,
                                    "loaded": len(result.loaded_keys),
                                    "bytes": result.bytes, "verdict": result.verdict}
        # Bit-exact against torch's reader: this rank's local shard against the rows
        # torch.chunk gives it of the reference tensor (cast as Tensor.to casts), and the
        # whole tensor FSDP2 gathers from every rank's shard.
        ours = local_shards(model)
        mismatch = []
        for key, ref in full.items():
            ref = ref.to(dtype)
            rows = torch.chunk(ref, world)
            want = rows[rank] if rank < len(rows) else ref[:0]
            if ours[key].dtype != dtype or raw(ours[key]) != raw(want):
                mismatch.append(key)
        report[f"{name}_mismatch"] = mismatch
        gathered = {k: v.full_tensor() for k, v in model.state_dict().items()}
        report[f"{name}_gathered_mismatch"] = [k for k, ref in full.items()
                                               if raw(gathered[k]) != raw(ref.to(dtype))]
        report[f"{name}_keys"] = sorted(ours) == sorted(full)
    dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_worker(main)
