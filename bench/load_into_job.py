#!/usr/bin/env python3
"""One FSDP2 load job for quick A/B runs: run under `mpirun -n N`, every rank builds the Llama of a
transformers checkpoint on meta, fully_shard (each decoder layer, then the root) on a gloo CPU
mesh, to_empty(device="cpu"), then times `--loads` loads of it between barriers and prints rank
0's seconds, one line per load:

    load 0: 1.31 s (weightcast pipeline 0.80 s)

`--mode weightcast` (default) is weightcast.load_into(model, checkpoint); `--mode dcp` is every
rank reading its own slices (safe_open(...).get_slice, to_local().copy_(): torch DCP's
HuggingFaceStorageReader's way). The first load of a job also pays MPI_Init_thread and the
first touch of to_empty's storage; later ones show the load alone. bench/torch_load_bench.py is
the full side-by-side bench with RSS and a bit-exact check; this is the short loop for comparing
two builds of the package in one shell loop, e.g. (PYTHONPATH picks the other build):

    for i in 1 2 3 4; do for v in /tmp/old ''; do
      PYTHONPATH=$v mpirun -x PYTHONPATH --oversubscribe --bind-to none -n 3 \\
        python bench/load_into_job.py CHECKPOINT --dtype bf16; done; done
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                    help="the model's parameters (the checkpoint's are BF16)")
    ap.add_argument("--mode", choices=["weightcast", "dcp"], default="weightcast")
    ap.add_argument("--loads", type=int, default=1, help="loads per job")
    ap.add_argument("--port", type=int, default=29531, help="gloo's rendezvous port")
    ap.add_argument("--config", help="weightcast.load_into's config file (e.g. verify: none)")
    args = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)  # N ranks on a few cores, as torchrun sets it
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig.from_pretrained(args.checkpoint))
    model.to({"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    for i in range(args.loads):
        dist.barrier()
        t0 = time.perf_counter()
        with torch.no_grad():
            pipeline = load(args.mode, model, args.checkpoint, args.config)
        seconds = time.perf_counter() - t0
        dist.barrier()
        if rank == 0:
            extra = f" (weightcast pipeline {pipeline:.2f} s)" if pipeline is not None else ""
            print(f"load {i}: {seconds:.2f} s{extra}", flush=True)
    dist.destroy_process_group()
    return 0


def load(mode: str, model, checkpoint: str, config: str | None) -> float | None:
    if mode == "weightcast":
        import weightcast

        return weightcast.load_into(model, checkpoint, progress=False, config=config).seconds
    from safetensors import safe_open
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    state = model.state_dict()
    for path in sorted(glob.glob(os.path.join(checkpoint, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                t = state[key]
                shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh,
                                                                      t.placements)
                local = t.to_local()
                if local.numel() == 0:
                    continue
                local.copy_(f.get_slice(key)[tuple(slice(o, o + n)
                                                   for o, n in zip(offset, local.shape))])
    return None


if __name__ == "__main__":
    sys.exit(main())
