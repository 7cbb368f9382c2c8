"""One rank of tests/python/test_netns.py, started by mpirun on nodes made of network
namespaces (scripts/netns_cluster.sh), 2 nodes × 2 ranks (not collected by pytest).

    mpirun -n 4 python netns_worker.py CHECKPOINT_DIR TORCH_INIT_METHOD

FSDP2 on a gloo mesh whose store is at TORCH_INIT_METHOD (tcp://node 0's address:port): torch
needs it; weightcast is given no address and finds rank 0's host from mpirun. Rank 0 alone
reads CHECKPOINT_DIR (node 1 has an empty directory there); every rank names it, as the
load's identity must be rank 0's on every rank. After load_into every parameter is gathered whole and rank 0 compares it
with the file, bytes for bytes; rank 0 prints `netns: N tensors bit-exact` and every rank
exits 0, or it raises.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import weightcast


def main() -> None:
    checkpoint, init_method = Path(sys.argv[1]), sys.argv[2]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    assert "MASTER_ADDR" not in os.environ
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from multirank_worker import llama  # the 3-rank test's tiny Llama

    mesh = init_device_mesh("cpu", (world,))
    model = llama(torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    import socket

    if socket.gethostname() != "node0":
        assert not any(checkpoint.glob("*.safetensors")), "a rank off node 0 sees the files"
        on_other_node = True
    else:
        on_other_node = False
    weightcast.load_into(model, checkpoint, timeout=60, progress=False)
    whole = {k: (v.full_tensor() if isinstance(v, DTensor) else v)
             for k, v in model.state_dict().items()}
    if rank == 0:
        from safetensors.torch import load_file

        expected = {}
        for f in sorted(checkpoint.glob("*.safetensors")):
            expected.update(load_file(str(f)))
        assert sorted(whole) == sorted(expected), (sorted(whole), sorted(expected))
        for k, v in expected.items():
            got = whole[k].contiguous()
            assert got.dtype == v.dtype and torch.equal(got.view(torch.uint8).reshape(-1),
                                                        v.contiguous().view(torch.uint8).reshape(-1)), k
        print(f"netns: {len(expected)} tensors bit-exact", flush=True)
    print(f"netns: rank {rank} on {socket.gethostname()}, off node 0: {on_other_node}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
