"""One rank of tests/python/test_dcp.py's multi-rank cases, started by mpirun (not collected
by pytest).

    mpirun -n 2 python dcp_worker.py CHECKPOINT_DIR OUT_DIR TORCH_PORT PORT×8

Every rank names the checkpoint by the same relative path, but only rank 0 runs in the
directory that holds it (as in multirank_worker.py): a load that passes proves the others
never open a file. The reference is torch's own HuggingFaceStorageReader given the absolute
path (it needs the files on every rank). Every rank writes OUT_DIR/rank{N}.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from multirank_worker import local_shards, raw, run_beside_checkpoint, run_worker, sharded


def main() -> None:
    checkpoint, out_dir, torch_port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    ports = [int(p) for p in sys.argv[4:]]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    mine = str(run_beside_checkpoint(checkpoint, out_dir, rank))

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.device_mesh import init_device_mesh

    import weightcast
    import weightcast.dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    report: dict = {"rank": rank}
    options = {"timeout": 30, "progress": False}
    for i, dtype in enumerate((torch.bfloat16, torch.float32)):
        name = str(dtype).removeprefix("torch.")
        model = sharded(dtype, mesh)
        dcp.load(model.state_dict(), storage_reader=weightcast.dcp.HuggingFaceStorageReader(
            mine, rendezvous_port=ports[i], **options))
        reference = sharded(dtype, mesh)
        dcp.load(reference.state_dict(),
                 storage_reader=dcp.HuggingFaceStorageReader(str(checkpoint)))
        ours, theirs = local_shards(model), local_shards(reference)
        report[f"{name}_keys"] = sorted(ours) == sorted(theirs) and len(ours) > 0
        report[f"{name}_mismatch"] = [k for k in theirs if raw(ours[k]) != raw(theirs[k])
                                      or ours[k].dtype != theirs[k].dtype]
        report[f"{name}_sharded"] = sum(type(v).__name__ == "DTensor"
                                        for v in model.state_dict().values())

    # Shard(1) DTensors (a box that is not one contiguous run: a row piece per row), FP32
    # from BF16, against torch's reader.
    from torch.distributed.tensor import Shard, distribute_tensor

    shapes = {k: list(v.shape) for k, v in model.state_dict().items()
              if k.endswith("proj.weight")}  # global shapes
    names = sorted(shapes)[:4]

    def by_columns():
        return {k: distribute_tensor(torch.zeros(shapes[k]), mesh, [Shard(1)]) for k in names}

    ours, theirs = by_columns(), by_columns()
    dcp.load(ours, storage_reader=weightcast.dcp.HuggingFaceStorageReader(
        mine, rendezvous_port=ports[3], **options))
    dcp.load(theirs, storage_reader=dcp.HuggingFaceStorageReader(str(checkpoint)))
    report["shard1_count"] = len(names)
    report["shard1_mismatch"] = [k for k in names
                                 if raw(ours[k].to_local()) != raw(theirs[k].to_local())]

    # torch's HuggingFaceStorageWriter(save_distributed=True) from both ranks: a file per rank,
    # each tensor in two pieces. It loads through weightcast's reader into other layouts —
    # a 1 × 2 (dp × tp) mesh of tensor parallel under FSDP2, then, saved from there, back to
    # FSDP2 on the 1-D mesh — every local shard bit-exact against torch's reader of the
    # original checkpoint. Only rank 0 finds the pieces' directory by its relative name.
    from dcp_mesh_worker import tp_fsdp

    pieces = checkpoint.parent / "pieces_1d"
    dcp.save(model.state_dict(),  # the FP32 FSDP2 model loaded above
             storage_writer=dcp.HuggingFaceStorageWriter(str(pieces), save_distributed=True))
    report["pieces_1d_files"] = sorted(p.name for p in pieces.glob("*.safetensors"))
    mesh_2d = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
    for i, (source, build, port) in enumerate((
            ("pieces_1d", lambda: tp_fsdp(torch.float32, mesh_2d), ports[5]),
            ("pieces_2d", lambda: sharded(torch.float32, mesh), ports[6]))):
        if source == "pieces_2d":
            dcp.save(into.state_dict(), storage_writer=dcp.HuggingFaceStorageWriter(
                str(checkpoint.parent / source), save_distributed=True))
        into, reference = build(), build()
        dcp.load(into.state_dict(), storage_reader=weightcast.dcp.HuggingFaceStorageReader(
            source, rendezvous_port=port, **options))
        dcp.load(reference.state_dict(),
                 storage_reader=dcp.HuggingFaceStorageReader(str(checkpoint)))
        ours, theirs = local_shards(into), local_shards(reference)
        report[f"{source}_keys"] = len(theirs) if sorted(ours) == sorted(theirs) else -1
        report[f"{source}_mismatch"] = [k for k in theirs if raw(ours[k]) != raw(theirs[k])]
    # The same directory through weightcast.load: refused, naming the reader that loads it.
    try:
        weightcast.load(str(pieces), alone=True)
        report["pieces_load"] = None
    except weightcast.Error as e:
        report["pieces_load"] = [e.status, str(e)]

    # A failure inside read_data: rank 1 names another checkpoint than rank 0 (the metadata
    # came from rank 0, so it got that far). weightcast.Error on every rank, which DCP hands
    # back in CheckpointException.failures as is.
    try:
        dcp.load(by_columns(), storage_reader=weightcast.dcp.HuggingFaceStorageReader(
            mine if rank == 0 else "other_checkpoint", rendezvous_port=ports[4], **options))
        report["read_data_failure"] = None
    except CheckpointException as e:
        report["read_data_failure"] = {
            str(r): [type(exc).__name__, getattr(exc, "status", None), str(exc)]
            for r, (exc, _) in e.failures.items()}

    # Rank 0 cannot open the checkpoint: every rank's read_metadata raises weightcast.Error
    # with rank 0's message, which DCP hands back as CheckpointException holding each rank's
    # failure (its own AssertionError quoting the message).
    try:
        dcp.load(by_columns(), storage_reader=weightcast.dcp.HuggingFaceStorageReader(
            "no_such_checkpoint", rendezvous_port=ports[2], **options))
        report["missing_file"] = None
    except CheckpointException as e:
        report["missing_file"] = {
            str(r): [type(exc).__name__, getattr(exc, "status", None), str(exc)]
            for r, (exc, _) in e.failures.items()}
    dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_worker(main)
