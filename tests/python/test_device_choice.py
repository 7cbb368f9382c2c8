"""Which GPU ``device="cuda"`` means, as a function of the environment (the launcher's world,
the CUDA devices visible, torch's current device): under torchrun with every GPU visible and
no ``torch.cuda.set_device``, each rank takes its local rank's GPU instead of every rank GPU 0,
and a torch current device on another GPU is refused naming the rank, the devices and the fix.
No GPU needed: the device count and torch's current device are given."""

from __future__ import annotations

import os

import pytest

from weightcast import Error, _landing, _options

LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "SLURM_", "PMI_")


def world_from_env(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int,
                   local_rank: int) -> dict:
    """The world ``weightcast.load`` detects with torchrun's variables set."""
    for key in list(os.environ):
        if key.startswith(LAUNCHER_PREFIXES) or key in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    world = _options.world_of(None, False)
    assert (world["rank"], world["world_size"], world["local_rank"]) == (rank, world_size,
                                                                        local_rank)
    return world


def test_torchrun_with_every_gpu_visible_puts_each_rank_on_its_local_ranks_gpu(monkeypatch):
    for local in range(4):
        world = world_from_env(monkeypatch, 4 + local, 8, local)  # node 1 of 2, 4 GPUs each
        # No set_device: torch has not chosen a device, and GPU 0 would be every rank's.
        assert _landing.cuda_ordinal(world, 4, None) == local
        # set_device(LOCAL_RANK), as torch's FSDP recipes do: the same GPU, accepted.
        assert _landing.cuda_ordinal(world, 4, local) == local


def test_one_visible_device_is_ordinal_0_whatever_the_local_rank(monkeypatch):
    # Slurm --gpus-per-task=1 or a per-rank CUDA_VISIBLE_DEVICES: each process sees its one GPU.
    for local in range(3):
        world = world_from_env(monkeypatch, local, 3, local)
        assert _landing.cuda_ordinal(world, 1, None) == 0
        assert _landing.cuda_ordinal(world, 1, 0) == 0


def test_torchs_current_device_on_another_gpu_is_refused_naming_rank_devices_and_fix(
        monkeypatch):
    world = world_from_env(monkeypatch, 3, 4, 1)
    with pytest.raises(Error) as e:
        # Rank 3 never called set_device but made CUDA tensors: they are on cuda:0.
        _landing.cuda_ordinal(world, 2, 0)
    assert e.value.status == 78
    message = str(e.value)
    for part in ("rank 3", "local rank 1", "2 CUDA devices visible", "cuda:1", "cuda:0",
                 "torch.cuda.set_device(1)", "device='cuda:0'"):
        assert part in message, (part, message)


def test_a_local_rank_past_the_visible_devices_is_refused(monkeypatch):
    world = world_from_env(monkeypatch, 2, 3, 2)
    with pytest.raises(Error) as e:
        _landing.cuda_ordinal(world, 2, None)
    assert e.value.status == 69
    assert "rank 2 has local rank 2" in str(e.value) and "2 CUDA devices" in str(e.value)
    with pytest.raises(Error) as e:
        _landing.cuda_ordinal(world, 0, None)
    assert e.value.status == 69 and "no CUDA device is visible" in str(e.value)


def test_one_rank_takes_torchs_current_device(monkeypatch):
    world = world_from_env(monkeypatch, 0, 1, 0)
    assert _landing.cuda_ordinal(world, 4, 2) == 2  # torch.cuda.set_device(2) before the load
    assert _landing.cuda_ordinal(world, 4, None) == 0
