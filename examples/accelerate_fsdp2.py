"""accelerate's FSDP2 start from a checkpoint with weightcast instead of rank 0's broadcast.

With ``cpu_ram_efficient_loading`` (``fsdp_cpu_ram_efficient_loading: true``), accelerate's
``prepare`` shards the model on meta and then ``fsdp2_load_full_state_dict`` broadcasts rank
0's whole state dict, one parameter at a time, for every rank to keep its own shards of it:
rank 0 must first have read the whole model (``from_pretrained``), and every rank receives
every byte. Inside ``weightcast_fsdp2_loading(checkpoint)`` that step is
``weightcast.load_into(model, checkpoint)``: every rank gets storage for its own shards, rank 0
alone reads the files, each byte once, and each rank receives only its shards (cast at the
receiver where the parameters' dtype differs, BF16 -> FP32)::

    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from transformers import AutoConfig, AutoModelForCausalLM
    from accelerate import init_empty_weights

    accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
        fsdp_version=2, cpu_ram_efficient_loading=True, ...))
    with init_empty_weights():  # no rank reads the weights here; buffers stay real
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(checkpoint))
    model.tie_weights()  # from_config leaves a tied pair apart, as from_pretrained does not
    with weightcast_fsdp2_loading(checkpoint):
        model, optimizer = accelerator.prepare(model, optimizer)

Run as a script it loads each transformers checkpoint both ways on a gloo CPU mesh and compares
every rank's local shards (one JSON line per rank)::

    mpirun -n 2 python examples/accelerate_fsdp2.py CHECKPOINT_DIR... --master-port 29600
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import weightcast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The example beside this one.
from fsdp2_train import add_launch_arguments, world_from_launcher  # noqa: E402


@contextlib.contextmanager
def weightcast_fsdp2_loading(checkpoint: str | os.PathLike, **load_options: Any) -> Iterator[None]:
    """Within the block, accelerate's FSDP2 ``prepare`` under ``cpu_ram_efficient_loading``
    fills the sharded model with ``weightcast.load_into(model, checkpoint, **load_options)``
    (``strict``, ``timeout``, ``rendezvous_port``, ... as ``load_into`` takes them) instead of
    broadcasting rank 0's state dict, which it ignores. Every rank must call ``prepare`` (as
    accelerate requires anyway) and name the same ``checkpoint``; rank 0 alone opens it.

    What accelerate does around the load stays its own: it moved the model to meta and
    sharded it before, and re-registers the non-persistent buffers (rotary ``inv_freq``) it
    copied beforehand and re-ties the weights after. So the model must be built with real
    buffers (``init_empty_weights()``'s default), not all on meta."""
    from accelerate.utils import fsdp_utils
    from torch.distributed.tensor import DTensor

    def load_full_state_dict(accelerator, model: torch.nn.Module, full_sd: dict,
                             cpu_offload: bool = False) -> torch.nn.Module:
        # The parameters are FSDP2's DTensors on meta: storage for this rank's shards, then
        # the shards themselves, in place.
        model.to_empty(device=accelerator.device)
        weightcast.load_into(model, checkpoint, **load_options)
        if cpu_offload:
            # As accelerate's own: sharded parameters live on the host under CPU offload,
            # buffers stay on the accelerator.
            moved = {k: v.to("cpu") if isinstance(v, DTensor) else v
                     for k, v in model.state_dict().items()}
            model.load_state_dict(moved, assign=True)
        return model

    original = fsdp_utils.fsdp2_load_full_state_dict
    fsdp_utils.fsdp2_load_full_state_dict = load_full_state_dict
    try:
        yield
    finally:
        fsdp_utils.fsdp2_load_full_state_dict = original


# --- the demo ------------------------------------------------------------------------------

def _raw(t: torch.Tensor) -> torch.Tensor:
    """A rank's local shard of ``t`` as bytes (NaN-safe, bit-exact comparison)."""
    from torch.distributed.tensor import DTensor

    local = (t.to_local() if isinstance(t, DTensor) else t).detach()
    return local.contiguous().reshape(-1).view(torch.uint8)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path, nargs="+",
                        help="directories written by save_pretrained")
    parser.add_argument("--dtypes", default="bfloat16,float32",
                        help="the parameters' dtypes, one load each way per dtype")
    add_launch_arguments(parser, checked=True)
    args = parser.parse_args(argv)

    from accelerate import Accelerator, PartialState, init_empty_weights
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from transformers import AutoConfig, AutoModelForCausalLM


    rank, world_size, _ = world_from_launcher(args.master_port)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, cpu_ram_efficient_loading=True,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["LlamaDecoderLayer"])
    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    if accelerator.state.distributed_type == DistributedType.MULTI_CPU:
        # accelerate runs FSDP on accelerators only (a CPU world is DDP's); FSDP2 itself runs
        # on a gloo CPU mesh, so the demo declares the state FSDP's for prepare to take that
        # path, as it does on GPUs (AcceleratorState copies PartialState's on each call).
        PartialState().distributed_type = DistributedType.FSDP
        accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = plugin
    report: dict = {"rank": rank, "world_size": world_size}
    for checkpoint, dtype_name in ((c, d) for c in args.checkpoints
                                   for d in args.dtypes.split(",")):
        config = AutoConfig.from_pretrained(checkpoint)
        dtype = getattr(torch, dtype_name)
        # accelerate's own way: rank 0 reads the whole model, prepare broadcasts it.
        if accelerator.is_main_process:
            theirs = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype)
        else:
            with init_empty_weights():
                theirs = AutoModelForCausalLM.from_config(config, dtype=dtype)
            theirs.tie_weights()
        theirs, _ = accelerator.prepare(theirs, torch.optim.SGD(theirs.parameters(), lr=0.1))
        # weightcast's: no rank reads the weights before prepare.
        with init_empty_weights():
            ours = AutoModelForCausalLM.from_config(config, dtype=dtype)
        ours.tie_weights()
        with weightcast_fsdp2_loading(checkpoint, rendezvous_port=args.weightcast_port,
                                      timeout=args.timeout, progress=False):
            ours, _ = accelerator.prepare(ours, torch.optim.SGD(ours.parameters(), lr=0.1))
        a, b = ours.state_dict(), theirs.state_dict()
        report[f"{checkpoint.name}/{dtype_name}"] = {
            "keys": sorted(a) == sorted(b) and len(b),
            "sharded": sum(type(v).__name__ == "DTensor" for v in a.values()),
            "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in a.values()}),
            "mismatch": [k for k in b if a[k].dtype != b[k].dtype
                         or not torch.equal(_raw(a[k]), _raw(b[k]))],
            # the non-persistent buffers accelerate re-registers after the load
            "buffers": [k for k, v in ours.named_buffers()
                        if not torch.equal(v, dict(theirs.named_buffers())[k])],
            "tied": [m.get_output_embeddings().weight is m.get_input_embeddings().weight
                     for m in (ours, theirs)],
        }
    print(json.dumps(report), flush=True)
    if args.report is not None:
        (args.report / f"rank{rank}.json").write_text(json.dumps(report))
    accelerator.end_training()
    return report


if __name__ == "__main__":
    main()
