"""One rank of tests/python/test_dcp.py's 4-rank cases, started by mpirun -n 4 (not collected
by pytest).

    mpirun -n 4 python dcp_mesh_worker.py CHECKPOINT_DIR LLAMA_DIR OUT_DIR TORCH_PORT PORT×10

DTensors on a 2 × 2 (data parallel × tensor parallel) gloo CPU mesh, in the layouts large
models train with — Shard on both dims, Replicate × Shard(1), and FSDP2 over tensor
parallel's (_StridedShard(0), Shard(0)) — load through weightcast's reader and through
torch's; then a transformers Llama (LLAMA_DIR, save_pretrained's) with torch's
tensor-parallel plan on the mesh's "tp" dim and fully_shard on its "dp" dim, BF16 and FP32
params, FSDP2 alone on a 1-D mesh of the 4 ranks, and a key the checkpoint lacks. Every rank
writes OUT_DIR/rank{N}.json with the keys whose local shards differ from torch's reader's
(and, for the plain tensors, from DTensor's own split of the whole tensor). Only rank 0 runs
where the checkpoints' relative paths exist (both directories share a parent).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from multirank_worker import llama, local_shards, raw, run_beside_checkpoint, run_worker, sharded

# torch's tensor-parallel plan for a Llama decoder layer (as in torch's and torchtitan's
# examples): column-wise for the projections into heads and the MLP's hidden width, row-wise
# for the projections out of them.
TP_PLAN = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
           "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise",
           "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise"}


def tp_fsdp(dtype: torch.dtype, mesh):
    """The tiny Llama, parallelised by parallelize_tp_fsdp."""
    return parallelize_tp_fsdp(llama(dtype), mesh)


def parallelize_tp_fsdp(model, mesh):
    """A transformers Llama built on meta with TP_PLAN on mesh["tp"], then fully_shard over
    mesh["dp"] (FSDP2 over tensor parallel: the column-wise weights become
    (_StridedShard(0), Shard(0)), the row-wise ones (Shard(0), Shard(1)); embeddings, norms
    and the head are FSDP's alone), given storage for its local shards only. bench/dcp_bench.py
    builds its model with this too."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    for layer in model.model.layers:
        parallelize_module(layer, mesh["tp"], {k: styles[v]() for k, v in TP_PLAN.items()})
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    model.to_empty(device="cpu")
    return model


def placement_name(p) -> str:
    """"Shard(0)", "_StridedShard(0, split_factor=2)", "Replicate()": stable across torch
    versions, unlike str()."""
    if hasattr(p, "split_factor"):
        return f"{type(p).__name__}({p.dim}, split_factor={p.split_factor})"
    return f"{type(p).__name__}({getattr(p, 'dim', '')})"


def llama_cases(llama_dir: Path, mesh, ports) -> dict:
    """The transformers Llama through both readers: FSDP2 over TP on the 2 × 2 mesh (BF16 and
    FP32 params, the FP32 ones cast at the receiver), FSDP2 on a 1-D mesh of every rank, and a
    key the checkpoint lacks."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.device_mesh import init_device_mesh

    import weightcast.dcp

    mine = llama_dir.name  # relative: rank 0 runs in its parent
    options = {"timeout": 30, "progress": False}
    report: dict = {}
    references: dict = {}
    flat = init_device_mesh("cpu", (dist.get_world_size(),))
    cases = [("tp_fsdp", dtype, lambda d: tp_fsdp(d, mesh))
             for dtype in (torch.bfloat16, torch.float32)]
    cases.append(("fsdp_1d", torch.bfloat16, lambda d: sharded(d, flat)))
    for name, dtype, build in cases:
        model, reference = build(dtype), build(dtype)
        dcp.load(model.state_dict(), storage_reader=weightcast.dcp.HuggingFaceStorageReader(
            mine, rendezvous_port=next(ports), **options))
        dcp.load(reference.state_dict(),
                 storage_reader=dcp.HuggingFaceStorageReader(str(llama_dir)))
        ours, theirs = local_shards(model), local_shards(reference)
        references[(name, dtype)] = theirs
        key = f"llama_{name}_{str(dtype).removeprefix('torch.')}"
        report[f"{key}_keys"] = len(theirs) if sorted(ours) == sorted(theirs) else -1
        report[f"{key}_mismatch"] = [k for k in theirs if raw(ours[k]) != raw(theirs[k])
                                     or ours[k].dtype != theirs[k].dtype]
        if name == "tp_fsdp":
            # load_into on the same layout: its strided shards are the boxes DCP reads into.
            into = build(dtype)
            weightcast.load_into(into, mine, rendezvous_port=next(ports), **options)
            got = local_shards(into)
            report[f"{key}_load_into_mismatch"] = [
                k for k in theirs
                if raw(got[k]) != raw(theirs[k]) or got[k].dtype != theirs[k].dtype]
        report[f"{key}_placements"] = {
            k: [placement_name(p) for p in v.placements] for k, v in model.state_dict().items()
            if k.startswith("model.layers.0.") and hasattr(v, "placements")}

    # A key the checkpoint lacks: DCP's planner refuses it on every rank before any byte
    # moves, naming it; the next load on the same ranks works.
    model = tp_fsdp(torch.float32, mesh)
    target = dict(model.state_dict())
    target["model.layers.0.mlp.not_in_checkpoint"] = torch.zeros(3)
    try:
        dcp.load(target, storage_reader=weightcast.dcp.HuggingFaceStorageReader(
            mine, rendezvous_port=next(ports), **options))
        report["llama_missing_key"] = None
    except CheckpointException as e:
        report["llama_missing_key"] = {str(r): f"{type(exc).__name__}: {exc}"
                                       for r, (exc, _) in e.failures.items()}
    dcp.load(model.state_dict(), storage_reader=weightcast.dcp.HuggingFaceStorageReader(
        mine, rendezvous_port=next(ports), **options))
    ours, theirs = local_shards(model), references[("tp_fsdp", torch.float32)]
    report["llama_after_missing_key"] = all(raw(ours[k]) == raw(theirs[k]) for k in theirs)
    return report


def main() -> None:
    checkpoint, llama_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    torch_port = int(sys.argv[4])
    ports = iter(int(p) for p in sys.argv[5:])
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    mine = str(run_beside_checkpoint(checkpoint, out_dir, rank))
    assert llama_dir.parent == checkpoint.parent

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
    for name, placements in layouts.items():
        # FP32 params everywhere (cast at the receiver); BF16 too for the strided layout.
        dtypes = (torch.bfloat16, torch.float32) if name == "fsdp_over_tp" else (torch.float32,)
        for dtype in dtypes:
            def make():
                return {k: distribute_tensor(torch.zeros(s, dtype=dtype), mesh, placements)
                        for k, s in shapes.items()}

            ours, theirs = make(), make()
            dcp.load(ours, storage_reader=weightcast.dcp.HuggingFaceStorageReader(
                mine, rendezvous_port=next(ports), timeout=30, progress=False))
            dcp.load(theirs, storage_reader=dcp.HuggingFaceStorageReader(str(checkpoint)))
            # Against torch's reader, and against DTensor's own split of the whole tensor
            # (so a box both readers got wrong alike would show).
            expected = {k: distribute_tensor(v.to(dtype), mesh, placements).to_local()
                        for k, v in full.items()}
            report[f"{name}_{str(dtype).removeprefix('torch.')}"] = [
                k for k in shapes if raw(ours[k].to_local()) != raw(theirs[k].to_local())
                or raw(ours[k].to_local()) != raw(expected[k])]
    # load_into on the plain tensors placed FSDP2 over TP, against DTensor's own split.
    into = {k: distribute_tensor(torch.zeros(s), mesh, layouts["fsdp_over_tp"])
            for k, s in shapes.items()}
    weightcast.load_into(into, mine, rendezvous_port=next(ports), timeout=30, progress=False)
    report["fsdp_over_tp_load_into"] = [
        k for k in shapes
        if raw(into[k].to_local()) != raw(distribute_tensor(full[k].float(), mesh,
                                                             layouts["fsdp_over_tp"]).to_local())]
    # A strided shard alone interleaves the ranks' rows: no one box, refused on every rank.
    flat = init_device_mesh("cpu", (world,))
    interleaved = {"wq": distribute_tensor(torch.zeros(shapes["wq"]), flat,
                                           [_StridedShard(0, split_factor=2)])}
    try:
        weightcast.load_into(interleaved, mine, strict=False, rendezvous_port=next(ports),
                             timeout=30, progress=False)
        report["interleaved"] = None
    except weightcast.Error as e:
        report["interleaved"] = [e.status, str(e)]
    report.update(llama_cases(llama_dir, mesh, ports))
    dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_worker(main)
