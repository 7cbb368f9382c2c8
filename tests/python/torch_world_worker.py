"""The ranks of tests/python/test_torch_world.py (not collected by pytest): a world that torch
made, with no launcher variables and no rendezvous port given anywhere.

    python torch_world_worker.py spawn N STORE CHECKPOINT_DIR LLAMA_DIR OUT_DIR [CASE]
        torch.multiprocessing starts N processes, each joining a gloo group over a FileStore
        (as mp.spawn, Lightning and notebook launchers do);
    torchrun --nproc-per-node N torch_world_worker.py env - CHECKPOINT_DIR LLAMA_DIR OUT_DIR
        torchrun started the ranks; init_process_group("gloo") from its environment.

Every rank runs the cases below and writes OUT_DIR/rank{N}.json with what it saw; rank 0 runs
in the checkpoints' parent, the others in empty directories (so no other rank can open them).
CASE "kill": rank 2 is killed (SIGKILL) from its progress callback, mid-load; the others
record the error they get.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

import torch

from multirank_worker import llama, local_shards, raw, run_beside_checkpoint, sharded


def cases(checkpoint: Path, llama_dir: Path, out_dir: Path, rank: int, world: int) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh

    import weightcast
    import weightcast.dcp

    llama_name = llama_dir.name  # relative: rank 0 runs in its parent
    full = load_file(str(checkpoint / "model.safetensors"))
    report: dict = {"rank": rank, "world_size": world,
                    "launcher": {k: os.environ.get(k) for k in
                                 ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "MASTER_PORT")}}
    options = {"timeout": 60, "progress": False}
    # How each load's bytes reached this rank (LoadStats' node_reads: "local" where every rank
    # read its own boxes from the page cache, "ring" through rank 0's node ring).
    report["node_reads"] = node_reads = []
    from weightcast import _api, _options

    def keeping(run_job):
        def run_and_keep(*args, **kwargs):
            result = run_job(*args, **kwargs)
            node_reads.append(result.stats.get("node_reads", ""))
            return result
        return run_and_keep

    _api.run_job = keeping(_api.run_job)
    _options.run_job = keeping(_options.run_job)

    got = weightcast.load(checkpoint.name, **options)
    report["load_exact"] = sorted(got) == sorted(full) and all(
        got[k].dtype == v.dtype and raw(got[k]) == raw(v) for k, v in full.items())
    del got
    got = weightcast.load(checkpoint.name, placement="fsdp", **options)
    report["fsdp_exact"] = all(
        raw(got[k]) == raw(torch.chunk(v, world)[rank] if rank < len(torch.chunk(v, world))
                           else v[:0])
        for k, v in full.items())
    del got

    # FSDP2 load_into on a 1-D mesh of every rank, BF16 params, against torch's reader.
    flat = init_device_mesh("cpu", (world,))
    ours, theirs = sharded(torch.bfloat16, flat), sharded(torch.bfloat16, flat)
    weightcast.load_into(ours, llama_name, **options)
    dcp.load(theirs.state_dict(), storage_reader=dcp.HuggingFaceStorageReader(str(llama_dir)))
    a, b = local_shards(ours), local_shards(theirs)
    report["fsdp2_load_into_mismatch"] = [k for k in b if raw(a[k]) != raw(b[k])]
    report["fsdp2_keys"] = len(b)

    if world == 4:
        # 2 × 2 (data parallel × tensor parallel): the DCP reader and load_into.
        from dcp_mesh_worker import tp_fsdp

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        ours, theirs, into = (tp_fsdp(torch.bfloat16, mesh) for _ in range(3))
        dcp.load(ours.state_dict(),
                 storage_reader=weightcast.dcp.HuggingFaceStorageReader(llama_name, **options))
        dcp.load(theirs.state_dict(),
                 storage_reader=dcp.HuggingFaceStorageReader(str(llama_dir)))
        weightcast.load_into(into, llama_name, **options)
        a, b, c = local_shards(ours), local_shards(theirs), local_shards(into)
        report["mesh_dcp_mismatch"] = [k for k in b if raw(a[k]) != raw(b[k])]
        report["mesh_load_into_mismatch"] = [k for k in b if raw(c[k]) != raw(b[k])]
        report["mesh_keys"] = len(b)

    # A config that numbers the ranks otherwise is refused, naming both.
    bad = out_dir / f"bad{rank}.yaml"
    bad.write_text(f"world:\n  rank: {(rank + 1) % world}\n  size: {world}\n")
    try:
        weightcast.load(checkpoint.name, config=str(bad), **options)
        report["bad_config"] = None
    except weightcast.Error as e:
        report["bad_config"] = [e.status, str(e)]
    dist.barrier()
    return report


def kill_case(checkpoint: Path, rank: int) -> dict:
    import weightcast

    def progress(p) -> None:
        if rank == 2 and p.chunks_done >= 1:
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        weightcast.load(checkpoint.name, chunk_size="4KiB", buffer_depth=2, timeout=20,
                        progress=progress)
        return {"rank": rank, "killed": None}
    except weightcast.Error as e:
        return {"rank": rank, "killed": [e.status, str(e)]}


def rank_main(rank: int, world: int, store: str | None, checkpoint: Path, llama_dir: Path,
              out_dir: Path, case: str) -> None:
    import torch.distributed as dist

    faulthandler.enable(all_threads=True)  # a fatal signal prints every thread's stack
    run_beside_checkpoint(checkpoint, out_dir, rank)
    if store is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank,
                                world_size=world)
    if case == "kill":
        report = kill_case(checkpoint, rank)
    else:
        report = cases(checkpoint, llama_dir, out_dir, rank, world)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    # Where a rank that dies (SIGABRT) got to: the test prints the ranks' stderr.
    print(f"rank {rank}: report written", file=sys.stderr, flush=True)
    if case != "kill":
        dist.destroy_process_group()
        print(f"rank {rank}: process group destroyed", file=sys.stderr, flush=True)


def _spawned(rank: int, world: int, store: str, checkpoint: str, llama_dir: str, out_dir: str,
             case: str) -> None:
    rank_main(rank, world, store, Path(checkpoint), Path(llama_dir), Path(out_dir), case)


def main() -> None:
    how, n, store, checkpoint, llama_dir, out_dir = sys.argv[1:7]
    case = sys.argv[7] if len(sys.argv) > 7 else "all"
    if how == "spawn":
        import torch.multiprocessing as mp

        world = int(n)
        args = (world, store, checkpoint, llama_dir, out_dir, case)
        # join=False: torch's join would end the other ranks as soon as one dies, and the
        # kill case is about what the others see.
        context = mp.start_processes(_spawned, args=args, nprocs=world, join=False,
                                     start_method="spawn")
        for process in context.processes:
            process.join(300)
        sys.exit(max(abs(p.exitcode or 0) for p in context.processes))
    else:
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None,
                  Path(checkpoint), Path(llama_dir), Path(out_dir), case)


if __name__ == "__main__":
    main()
