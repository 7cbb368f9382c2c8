"""torchtitan loads a Hugging Face checkpoint through weightcast: one method.

torchtitan's CheckpointManager loads a Hugging Face checkpoint (`--checkpoint.initial_load_in_hf`)
with ``dcp.load(hf_state_dict, storage_reader=sd_adapter.get_hf_storage_reader(path,
from_quantized))``. A state-dict adapter whose ``get_hf_storage_reader`` returns
``weightcast.dcp.HuggingFaceStorageReader`` makes that load weightcast's: rank 0 alone opens
the files and reads each byte once, every rank receives its own boxes. In a trainer config::

    config.model_spec.state_dict_adapter = WeightcastLlama3StateDictAdapter

Run as a script, it tries the adapter on torchtitan's ``debugmodel`` Llama 3 with torchtitan's
own FSDP2 (``apply_fsdp_to_decoder``) and its own load path (``CheckpointManager.load``), and
checks every rank's local shards against the same load through torch's reader. torchtitan's
trainer needs CUDA, so the script builds the model and the CheckpointManager itself; on CPU
the ranks meet over gloo and weightcast's bytes travel over MPI::

    mpirun -n 2 python examples/torchtitan_adapter.py WORK_DIR --master-port 29600

WORK_DIR/hf gets a seeded checkpoint of the debug model (BF16 or FP32, ``--checkpoint-dtype``)
unless it holds one. The script prints one JSON line per rank (``--report`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter

import weightcast.dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The example beside this one.
from fsdp2_train import add_launch_arguments, world_from_launcher  # noqa: E402


class WeightcastLlama3StateDictAdapter(Llama3StateDictAdapter):
    """torchtitan's Llama 3 adapter (key renames, the q/k permutation), loading through
    weightcast: the one method a user writes, on any model's adapter alike. A quantized
    checkpoint (``from_quantized``) keeps torchtitan's own reader: weightcast's reads no
    quantized layout."""

    # load_into's keywords for the reader (timeout, rendezvous_port, chunk_size, ...):
    # torchtitan makes the adapter itself, from the model's config alone.
    reader_options: dict[str, Any] = {}

    def get_hf_storage_reader(self, path: str, from_quantized: bool = False):
        if from_quantized:
            return super().get_hf_storage_reader(path, from_quantized)
        return weightcast.dcp.HuggingFaceStorageReader(path, **self.reader_options)


# --- the demo ------------------------------------------------------------------------------

def _debug_model(mesh, dtype: torch.dtype, seed: int):
    """torchtitan's ``debugmodel`` Llama 3 (6 layers, dim 256, 6.2 M parameters), built on
    meta, sharded with torchtitan's FSDP2 over ``mesh`` (None: one process, unsharded), then
    given storage and torchtitan's own initial values (seeded, so a load must overwrite them)."""
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.models.llama3 import model_registry

    spec = model_registry("debugmodel")
    with torch.device("meta"):
        model = spec.model.build()
    model = model.to(dtype)
    if mesh is not None:
        apply_fsdp_to_decoder(model, mesh, param_dtype=dtype, reduce_dtype=torch.float32,
                              pp_enabled=False)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights()
    return spec, model


def _load(spec, model, adapter: type, checkpoint: Path) -> None:
    """torchtitan's own load of a Hugging Face checkpoint at the start of training."""
    from torchtitan.components.checkpointer.dcp import CheckpointManager

    manager = CheckpointManager.Config(
        enable=True, initial_load_path=str(checkpoint), initial_load_in_hf=True,
        folder=str(checkpoint.parent / "no_checkpoints_here"),
    ).build(dataloader=None, model_parts=[model], optimizers=None, lr_schedulers=None,
            states={}, sd_adapter=adapter(spec.model, None))
    assert manager.load(), "torchtitan loaded nothing"


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A rank's local shard of ``t`` as bytes (NaN-safe, bit-exact comparison)."""
    from torch.distributed.tensor import DTensor

    local = (t.to_local() if isinstance(t, DTensor) else t).detach()
    return local.contiguous().reshape(-1).view(torch.uint8)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--dtype", default="float32", help="the parameters' dtype")
    parser.add_argument("--checkpoint-dtype", default="bfloat16")
    add_launch_arguments(parser, checked=True)
    args = parser.parse_args(argv)

    import safetensors.torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh


    rank, world_size, _ = world_from_launcher(args.master_port)
    dist.init_process_group("gloo")
    try:
        mesh = init_device_mesh("cpu", (world_size,)) if world_size > 1 else None
        dtype = getattr(torch, args.dtype)
        # torchtitan wants an absolute directory that every rank sees; only rank 0 reads it.
        checkpoint = args.work_dir.resolve() / "hf"
        if rank == 0 and not (checkpoint / "model.safetensors").exists():
            spec, seeded = _debug_model(None, getattr(torch, args.checkpoint_dtype), seed=1)
            checkpoint.mkdir(parents=True, exist_ok=True)
            hf = Llama3StateDictAdapter(spec.model, None).to_hf(seeded.state_dict())
            safetensors.torch.save_file({k: v.contiguous() for k, v in hf.items()},
                                        str(checkpoint / "model.safetensors"))
        dist.barrier()

        readers: list[str] = []

        class Ours(WeightcastLlama3StateDictAdapter):
            reader_options = {"rendezvous_port": args.weightcast_port,
                              "timeout": args.timeout, "progress": False}

            def get_hf_storage_reader(self, path: str, from_quantized: bool = False):
                reader = super().get_hf_storage_reader(path, from_quantized)
                readers.append(f"{type(reader).__module__}.{type(reader).__name__}")
                return reader

        spec, ours = _debug_model(mesh, dtype, seed=2)
        _load(spec, ours, Ours, checkpoint)
        spec, theirs = _debug_model(mesh, dtype, seed=3)
        _load(spec, theirs, Llama3StateDictAdapter, checkpoint)

        a, b = ours.state_dict(), theirs.state_dict()
        mismatch = [k for k in b if a[k].dtype != b[k].dtype
                    or not torch.equal(_raw(a[k]), _raw(b[k]))]
        report = {"rank": rank, "world_size": world_size, "keys": len(b),
                  "sharded": sum(type(v).__name__ == "DTensor" for v in a.values()),
                  "dtypes": sorted({str(v.dtype) for v in a.values()}),
                  "readers": readers, "mismatch": mismatch}
        print(json.dumps(report), flush=True)
        if args.report is not None:
            (args.report / f"rank{rank}.json").write_text(json.dumps(report))
        return report
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
