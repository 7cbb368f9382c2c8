"""FSDP2 training from a transformers checkpoint: build on meta, fully_shard, load every
rank's local shards with weightcast (rank 0 alone reads the files), then train.

    # CPU: gloo for torch, MPI for weightcast's host tensors
    mpirun -n 3 python examples/fsdp2_train.py CHECKPOINT_DIR --master-port 29600
    # GPUs: NCCL for both
    torchrun --nproc-per-node 8 examples/fsdp2_train.py CHECKPOINT_DIR --device cuda

Under mpirun the ranks are Open MPI's (OMPI_COMM_WORLD_*), and torch's process group meets at
MASTER_ADDR (default 127.0.0.1) : --master-port; under torchrun, torchrun's variables. The
model is never materialised whole on any rank: `to_empty` gives each rank storage for its
own shards, and `weightcast.load_into` writes them in place, casting a BF16 checkpoint into
FP32 master weights on landing (--dtype). Then --steps optimizer steps on random tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from transformers import AutoConfig, AutoModelForCausalLM

import weightcast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load_hf_model import rebuild_transient_buffers  # noqa: E402  (the example beside this one)


def world_from_launcher(master_port: int | None) -> tuple[int, int, int]:
    """(rank, world size, local rank), and torch's env:// variables set from mpirun's when
    torchrun did not set them."""
    if "RANK" not in os.environ and "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ["RANK"] = os.environ["OMPI_COMM_WORLD_RANK"]
        os.environ["WORLD_SIZE"] = os.environ["OMPI_COMM_WORLD_SIZE"]
        os.environ["LOCAL_RANK"] = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if master_port is not None:
        os.environ["MASTER_PORT"] = str(master_port)
    os.environ.setdefault("MASTER_PORT", "29500")
    return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
            int(os.environ.get("LOCAL_RANK", "0")))


def add_launch_arguments(parser: argparse.ArgumentParser, *, checked: bool = False) -> None:
    """The examples' shared options: torch's and weightcast's rendezvous ports; with
    ``checked``, weightcast's timeout and a directory for each rank's report too."""
    parser.add_argument("--master-port", type=int, default=None, help="torch's rendezvous")
    parser.add_argument("--weightcast-port", type=int, default=None,
                        help="weightcast's rendezvous (default: the config's rendezvous.port)")
    if checked:
        parser.add_argument("--timeout", type=float, default=60.0, help="weightcast's, seconds")
        parser.add_argument("--report", type=Path, default=None,
                            help="a directory for rank{N}.json")


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a directory written by save_pretrained")
    parser.add_argument("--dtype", default="float32", help="the parameters' dtype")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=1)
    add_launch_arguments(parser)
    args = parser.parse_args(argv)

    rank, world_size, local_rank = world_from_launcher(args.master_port)
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        mesh = init_device_mesh(device.type, (world_size,))
        config = AutoConfig.from_pretrained(args.checkpoint)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config,
                                                     torch_dtype=getattr(torch, args.dtype))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device=device)
        rebuild_transient_buffers(model)

        start = time.perf_counter()
        report = weightcast.load_into(model, args.checkpoint, rendezvous_port=args.weightcast_port)
        seconds = time.perf_counter() - start
        if rank == 0:
            print(f"weightcast: {world_size} ranks loaded {len(report.loaded_keys)} tensors "
                  f"({len(report.cast_keys)} cast to {args.dtype}) in {seconds:.3f} s",
                  flush=True)

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)  # the same batch on every rank
        loss_value = float("nan")
        for step in range(args.steps):
            ids = torch.randint(0, config.vocab_size, (2, 16), generator=generator).to(device)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            loss_value = loss.item()
            if rank == 0:
                print(f"step {step + 1}: loss {loss_value:.4f}", flush=True)
        return loss_value
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
