#!/usr/bin/env python3
"""tests/gpu/gpu_check.sh's ordering row: weightcast.load_into of an FSDP2 model must wait for the
work the caller queued on its current CUDA stream (docs/python.md § CUDA and streams).

Run as one rank of 2 (torchrun's RANK, WORLD_SIZE, MASTER_ADDR; tests/gpu/gpu_check.sh's
two_ranks.sh): gpu_check_fsdp2.py WORK_DIR RENDEZVOUS_PORT

Deterministic, not by luck: the load is first timed alone (W seconds: rendezvous, NCCL set-up
and the bytes). Then, for torch's default stream and for a side stream made current with
`torch.cuda.stream(s)`, the caller queues a GPU sleep S >= W + 1.5 s (cycles from a timed
calibration of `torch.cuda._sleep`), then a fill of every destination with NaN, then calls
load_into. An unordered load would finish writing within W < S, while the sleep still runs;
the NaN fill would then overwrite it and the comparison fails. An ordered load waits for the
fill, so the parameters equal the file bit for bit (torch.equal of each full_tensor() against
safetensors.torch.load_file of the same file) and its wall time is at least S (printed: the
row shows that the load waited). Exit 1 on any failure, naming it.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.fsdp import fully_shard

from gpu_check_st import save_file  # no numpy needed (tests/gpu/gpu_check_st.py)

import weightcast

rank = int(os.environ["RANK"])
work, port = sys.argv[1], int(sys.argv[2])
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
failures = []
waits = []  # (label, wall, slept) per ordered case, for the last line


def say(text):
    print(f"rank {rank}: {text}", flush=True)


def model():
    return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                               torch.nn.Linear(4096, 1024))


path = os.path.join(work, "model.safetensors")
if rank == 0:
    torch.manual_seed(0)
    save_file({k: v.contiguous() for k, v in model().state_dict().items()}, path)
dist.barrier()
reference = load_file(path)  # safetensors' own load of the file, on the host
with torch.device("meta"):
    target = model()
for layer in target:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(target)
target.to_empty(device="cuda")


def fill_garbage():
    # What init_weights() after to_empty() does: writes queued on the current stream.
    with torch.no_grad():
        for p in target.parameters():
            p.to_local().fill_(float("nan"))


def differing():
    # full_tensor() all-gathers each parameter on the current stream.
    return [name for name, p in target.state_dict().items()
            if not torch.equal(p.full_tensor().cpu(), reference[name])]


def load(port_offset):
    start = time.perf_counter()
    report = weightcast.load_into(target, path, rendezvous_port=port + port_offset, timeout=30)
    return report, time.perf_counter() - start


# 1. The load alone: how long an unordered load takes to write everything.
torch.cuda.synchronize()
fill_garbage()
torch.cuda.synchronize()
dist.barrier()
report, alone = load(0)
bad = differing()
if bad:
    failures.append(f"load_into alone: {len(bad)} tensor(s) differ from the file: {bad[:3]}")
longest = torch.tensor([alone], device="cuda")
dist.all_reduce(longest, op=dist.ReduceOp.MAX)
alone_max = float(longest.item())
sleep_s = max(4.0, alone_max + 1.5)
say(f"load_into alone: {alone:.2f} s (the slower rank {alone_max:.2f} s); "
    f"{'bit-exact' if not bad else 'DIFFERS'}; the sleep will be {sleep_s:.1f} s")
if sleep_s > 8.0:
    failures.append(f"inconclusive: the load alone took {alone_max:.2f} s, too long for a sleep "
                    "within the row's cap to outlast it")

# 2. Cycles per second of torch.cuda._sleep (it spins on the SM clock), from a timed run.
torch.cuda._sleep(20_000_000)  # clocks up
calibrate = 200_000_000
a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
a.record()
torch.cuda._sleep(calibrate)
b.record()
b.synchronize()
cycles_per_s = calibrate / (a.elapsed_time(b) / 1e3)
cycles = int(sleep_s * cycles_per_s)
say(f"torch.cuda._sleep: {cycles_per_s / 1e9:.2f} G cycles/s; {cycles} cycles queued per case")


def ordered_case(label, port_offset):
    torch.cuda.synchronize()
    dist.barrier()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    torch.cuda._sleep(cycles)
    end.record()
    fill_garbage()  # queued behind the sleep: runs S seconds from now
    _, wall = load(port_offset)
    end.synchronize()
    slept = begin.elapsed_time(end) / 1e3
    bad = differing()
    waits.append(f"{label.split(' (')[0]}: waited {wall:.2f} s for {slept:.2f} s of sleep")
    waited = wall >= slept - 0.25  # the call began within a few ms of the sleep
    say(f"{label}: slept {slept:.2f} s on the GPU, then NaN queued; load_into took {wall:.2f} s "
        f"({'waited for the queued work' if waited else 'DID NOT WAIT'}; alone {alone_max:.2f} s); "
        f"{len(reference) - len(bad)} of {len(reference)} tensors bit-exact against "
        "safetensors.load_file")
    if bad:
        failures.append(f"{label}: {len(bad)} tensor(s) differ from the file (NaN from the queued "
                        f"fill landed after the load's bytes?): {bad[:3]}")
    if not waited:
        failures.append(f"{label}: load_into returned after {wall:.2f} s, before the {slept:.2f} s "
                        "of queued work finished")
    if slept <= alone_max:
        failures.append(f"{label}: inconclusive: the sleep ({slept:.2f} s) did not outlast the "
                        f"load alone ({alone_max:.2f} s)")


ordered_case("default stream", 1)
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    ordered_case("side stream (torch.cuda.stream(s))", 2)
torch.cuda.synchronize()
dist.destroy_process_group()
if failures:
    for f in failures:
        say(f"FAIL {f}")
    sys.exit(1)
say(f"load_into(FSDP2) ordered after queued work ({', '.join(waits)}; alone {alone_max:.2f} s), "
    f"bit-exact against the file ({len(reference)} tensors); {report.verdict}")
