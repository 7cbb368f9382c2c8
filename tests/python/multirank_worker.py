"""One rank of tests/python/test_multirank.py, started by mpirun (not collected by pytest).

    mpirun -n 3 python multirank_worker.py CHECKPOINT_DIR OUT_DIR TORCH_PORT PORT×7

Every rank names the checkpoint alike, by a relative path (every rank must name rank 0's),
but only rank 0 runs in the directory that holds it: the others run in an empty one, so a
load that passes proves they never open a file. Every rank writes OUT_DIR/rank{N}.json with
what it saw; the test asserts on those. Each weightcast call meets on a port of its own
(picked free by the test), torch's gloo group on TORCH_PORT.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch

import weightcast


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().reshape(-1)
    return bytes(t.view(torch.uint8).numpy().tobytes()) if t.numel() else b""


def llama(dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    # 64, 128 and 256 rows over 3 ranks: every Shard(0) is uneven (22/22/20, 43/43/42,
    # 86/86/84), so FSDP2's padded last shard is exercised on every parameter.
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False)
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(dtype)


def sharded(dtype: torch.dtype, mesh):
    from torch.distributed.fsdp import fully_shard

    model = llama(dtype)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    return model


def local_shards(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {k: (v.to_local() if isinstance(v, DTensor) else v)
            for k, v in model.state_dict().items()}


def run_beside_checkpoint(checkpoint: Path, out_dir: Path, rank: int) -> Path:
    """Rank 0 runs in the checkpoint's directory, every other rank in an empty one of its own
    under ``out_dir``, so that the relative name every rank passes (the load's identity must
    be rank 0's) exists for rank 0 alone: a rank other than 0 that opened it would fail.
    Returns that name."""
    if rank == 0:
        os.chdir(checkpoint.parent)
    else:
        (out_dir / f"cwd{rank}").mkdir()
        os.chdir(out_dir / f"cwd{rank}")
    mine = Path(checkpoint.name)
    assert mine.exists() == (rank == 0)
    return mine


def run_worker(main) -> None:
    """A worker's entry point: a failing rank's traceback reaches mpirun's output before the
    rank exits (mpirun may end the others first)."""
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        raise


def main() -> None:
    checkpoint, out_dir, torch_port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    ports = [int(p) for p in sys.argv[4:]]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    mine = run_beside_checkpoint(checkpoint, out_dir, rank)
    files = sorted(checkpoint.glob("*.safetensors"))
    from safetensors.torch import load_file

    full = {}
    for f in files:  # the test's own reference (every rank may read it to compare)
        full.update(load_file(str(f)))
    report: dict = {"rank": rank, "world_size": world}
    options = {"timeout": 60, "progress": False}

    # weightcast.load: every tensor on every rank, bit-exact.
    got = weightcast.load(mine, rendezvous_port=ports[0], **options)
    report["load_keys"] = list(got) == list(full)
    report["load_exact"] = all(got[k].dtype == v.dtype and raw(got[k]) == raw(v)
                               for k, v in full.items())
    del got
    # placement="fsdp": each rank its torch.chunk rows of every tensor.
    got = weightcast.load(mine, placement="fsdp", rendezvous_port=ports[1], **options)
    report["fsdp_exact"] = all(
        raw(got[k]) == raw(torch.chunk(v, world)[rank] if rank < len(torch.chunk(v, world))
                           else v[:0])
        for k, v in full.items())
    del got

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{torch_port}", rank=rank,
                            world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    for i, dtype in enumerate((torch.bfloat16, torch.float32)):
        name = str(dtype).removeprefix("torch.")
        model = sharded(dtype, mesh)
        result = weightcast.load_into(model, mine, rendezvous_port=ports[2 + i], **options)
        reference = sharded(dtype, mesh)
        sd = {k: v.to(dtype) for k, v in full.items()} if rank == 0 else {}
        set_model_state_dict(reference, sd, options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))
        ours, theirs = local_shards(model), local_shards(reference)
        report[f"{name}_keys"] = sorted(ours) == sorted(theirs)
        report[f"{name}_mismatch"] = [k for k in theirs if raw(ours[k]) != raw(theirs[k])
                                      or ours[k].dtype != theirs[k].dtype]
        report[f"{name}_shapes"] = {k: list(v.shape) for k, v in ours.items()}
        report[f"{name}_report"] = {"missing": result.missing_keys,
                                    "unexpected": result.unexpected_keys,
                                    "cast": len(result.cast_keys),
                                    "staged": result.staged_keys,
                                    "loaded": len(result.loaded_keys)}
        report[f"{name}_verdict"] = result.verdict
        if dtype == torch.bfloat16:
            bf16_shards = ours

    # verify=False: the same bytes, nothing hashed, and the verdict says so on every rank.
    model = sharded(torch.bfloat16, mesh)
    result = weightcast.load_into(model, mine, rendezvous_port=ports[8], verify=False,
                                  **options)
    report["unverified_exact"] = all(raw(t) == raw(bf16_shards[k])
                                     for k, t in local_shards(model).items())
    report["unverified_verdict"] = result.verdict

    # Bad input: a destination the checkpoint lacks, under strict, raises on every rank.
    target = dict(sharded(torch.float32, mesh).state_dict())
    target["extra.not_in_checkpoint"] = torch.zeros(3)
    try:
        weightcast.load_into(target, mine, rendezvous_port=ports[4], **options)
        report["strict"] = None
    except weightcast.Error as e:
        report["strict"] = {"status": e.status, "message": str(e)}
    # The failure was unwound before any byte moved: a later load on every rank works.
    got = weightcast.load(mine, rendezvous_port=ports[5], **options)
    report["after_failure"] = len(got) == len(full)
    dist.destroy_process_group()

    # examples/fsdp2_train.py, as mpirun would start it: its own process group and load,
    # then a training step (run here to spare the test a second start of torch).
    import importlib.util

    example = Path(__file__).resolve().parents[2] / "examples" / "fsdp2_train.py"
    spec = importlib.util.spec_from_file_location("fsdp2_train", example)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report["example_loss"] = module.main([str(checkpoint), "--master-port", str(ports[6]),
                                          "--weightcast-port", str(ports[7])])
    (out_dir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    run_worker(main)
