"""One rank of tests/python/test_dcp.py's 2 × 2 mesh case, started by mpirun -n 4 (not
collected by pytest).

    mpirun -n 4 python dcp_mesh_worker.py CHECKPOINT_DIR OUT_DIR TORCH_PORT PORT×5

DTensors on a 2 × 2 (data parallel × tensor parallel) gloo CPU mesh, in the layouts large
models train with — Shard on both dims, Replicate × Shard(1), and FSDP2 over tensor
parallel's (_StridedShard(0), Shard(0)) — load through weightcast's reader and through
torch's; every rank writes OUT_DIR/rank{N}.json with the keys whose local shards differ from
torch's reader's or from DTensor's own split of the whole tensor. Only rank 0 runs where the
checkpoint's relative path exists.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from multirank_worker import raw, run_beside_checkpoint, run_worker


def main() -> None:
    checkpoint, out_dir, torch_port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    ports = [int(p) for p in sys.argv[4:]]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    mine = str(run_beside_checkpoint(checkpoint, out_dir, rank))

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    import weightcast.dcp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:  # the test's reference
        full = {k: f.get_tensor(k) for k in f.keys()}
    shapes = {k: list(v.shape) for k, v in full.items()}
    layouts = {
        "shard0_shard1": [Shard(0), Shard(1)],
        "replicate_shard1": [Replicate(), Shard(1)],
        "shard1_shard0": [Shard(1), Shard(0)],
        "fsdp_over_tp": [_StridedShard(0, split_factor=2), Shard(0)],
    }
    report: dict = {"rank": rank}
    i = 0
    for name, placements in layouts.items():
        # FP32 params everywhere (cast at the receiver); BF16 too for the strided layout.
        dtypes = (torch.bfloat16, torch.float32) if name == "fsdp_over_tp" else (torch.float32,)
        for dtype in dtypes:
            def make():
                return {k: distribute_tensor(torch.zeros(s, dtype=dtype), mesh, placements)
                        for k, s in shapes.items()}

            ours, theirs = make(), make()
            dcp.load(ours, storage_reader=weightcast.dcp.HuggingFaceStorageReader(
                mine, rendezvous_port=ports[i], timeout=30, progress=False))
            dcp.load(theirs, storage_reader=dcp.HuggingFaceStorageReader(str(checkpoint)))
            i += 1
            # Against torch's reader, and against DTensor's own split of the whole tensor
            # (so a box both readers got wrong alike would show).
            expected = {k: distribute_tensor(v.to(dtype), mesh, placements).to_local()
                        for k, v in full.items()}
            report[f"{name}_{str(dtype).removeprefix('torch.')}"] = [
                k for k in shapes if raw(ours[k].to_local()) != raw(theirs[k].to_local())
                or raw(ours[k].to_local()) != raw(expected[k])]
    dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_worker(main)
