#!/usr/bin/env python3
"""tests/gpu/gpu_check.sh's Python rows on one GPU, one process (torch imported and CUDA set up
once for all three): gpu_check_cuda.py CHECKPOINT_DIR WORK_DIR

  load   weightcast.load(CHECKPOINT, device="cuda"): seconds and GB/s; every tensor equal
         (torch.equal) to safetensors.torch.load_file of the same shard, on the host.
  dcp    weightcast.dcp.HuggingFaceStorageReader into CUDA tensors: BF16 (in place) and FP32
         (landed in BF16, then copy_), from one file and from two pieces as torch's
         HuggingFaceStorageWriter(save_distributed=True) writes them; torch.equal.
  bench  the checkpoint into a CUDA model (a module with the checkpoint's names and shapes),
         two ways: model.load_state_dict(safetensors.torch.load_file(shard, device="cuda"))
         and weightcast.load_into(model, CHECKPOINT); each: seconds, GB/s, peak GPU memory
         (torch.cuda.max_memory_allocated, and the device's memory in use sampled every 2 ms
         with cudaMemGetInfo, which also counts what weightcast allocates outside torch: an
         arena, staged tensors, NCCL buffers), over the memory in use before; then every
         parameter equal to load_file's (torch.equal).

Each part prints `PASS <part>: ...` or `FAIL <part>: ...` (gpu_check.sh records a row per
part from them); the exit status is 1 when any part failed.
"""
import json
import os
import sys
import threading
import time
import traceback
import warnings

import torch
from safetensors.torch import load_file

from gpu_check_st import save_file  # no numpy needed (tests/gpu/gpu_check_st.py)

import weightcast

ckpt, work = sys.argv[1], sys.argv[2]
shards = sorted(os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
GIB = 1 << 30
torch.zeros(1, device="cuda")  # the CUDA context outside the timed parts, as weightcast's is
torch.cuda.synchronize()
failed = False


def part(name):
    """Decorator that runs the part at once, printing its verdict line (and a failure's
    traceback), so one part's failure leaves the others their rows."""
    def run(body):
        global failed
        try:
            print(f"PASS {name}: {body()}", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is the part's verdict
            failed = True
            traceback.print_exc()
            print(f"FAIL {name}: {type(e).__name__}: {e}"[:400], flush=True)
    return run


def differing(got):
    """Names whose tensor in @p got (name -> tensor) differs from load_file's, on the host."""
    bad = []
    for shard in shards:
        for name, want in load_file(shard).items():
            if name not in got or not torch.equal(got[name].cpu(), want):
                bad.append(name)
    return bad


@part("load")
def _():
    start = time.perf_counter()
    tensors = weightcast.load(ckpt, device="cuda")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    devices = {str(t.device) for t in tensors.values()}
    assert devices == {"cuda:0"}, devices
    bad = differing(tensors)
    assert not bad, f"{len(bad)} tensor(s) differ from safetensors.load_file: {bad[:3]}"
    return (f"weightcast.load(device='cuda'): {len(tensors)} tensors, {total} B in {seconds:.3f} s: "
            f"{total / seconds / 1e9:.2f} GB/s; torch.equal to safetensors.load_file")


@part("dcp")
def _():
    import torch.distributed.checkpoint as dcp

    import weightcast.dcp
    whole = torch.randn(300, 70, generator=torch.Generator().manual_seed(0)).bfloat16()
    os.makedirs(f"{work}/one", exist_ok=True)
    os.makedirs(f"{work}/pieces", exist_ok=True)
    save_file({"w": whole}, f"{work}/one/model.safetensors")
    for i, (a, b) in enumerate([(0, 200), (200, 300)], start=1):
        save_file({"w": whole[a:b].contiguous()},
                  f"{work}/pieces/shard-{i:05d}-model-00001-of-00001.safetensors",
                  metadata={"DCP_SHARDING_INFO": json.dumps({"w": {"saved_offsets": [a, 0]}})})
    reference = load_file(f"{work}/one/model.safetensors")["w"]
    with warnings.catch_warnings():  # DCP warns that no process group means one process
        warnings.simplefilter("ignore", UserWarning)
        for source in ("one", "pieces"):
            for dtype in (torch.bfloat16, torch.float32):
                got = {"w": torch.full((300, 70), float("nan"), dtype=dtype, device="cuda")}
                dcp.load(got, storage_reader=weightcast.dcp.HuggingFaceStorageReader(
                    f"{work}/{source}", timeout=20, progress=False))
                torch.cuda.synchronize()
                assert torch.equal(got["w"].cpu(), reference.to(dtype)), (source, dtype)
    return ("weightcast.dcp.HuggingFaceStorageReader into CUDA BF16/FP32, whole and in pieces: "
            "torch.equal to safetensors.load_file")


class DevicePeak:
    """The device's memory in use (cudaMemGetInfo), sampled every 2 ms while it runs."""

    def __enter__(self):
        free, self.total = torch.cuda.mem_get_info()
        self.before = self.total - free
        self.peak = self.before
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def _sample(self):
        while not self.stop.wait(0.002):
            self.peak = max(self.peak, self.total - torch.cuda.mem_get_info()[0])

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.total - torch.cuda.mem_get_info()[0])


DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
          "I8": torch.int8, "BOOL": torch.bool}


def cuda_model():
    """A module whose state_dict has the checkpoint's names, shapes and dtypes, on the GPU."""
    root = torch.nn.Module()
    for shard in shards:
        with open(shard, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            owner = root
            *path, leaf = name.split(".")
            for step in path:
                if not hasattr(owner, step):
                    owner.add_module(step, torch.nn.Module())
                owner = getattr(owner, step)
            owner.register_parameter(leaf, torch.nn.Parameter(
                torch.empty(meta["shape"], dtype=DTYPES[meta["dtype"]], device="cuda"),
                requires_grad=False))
    return root


@part("bench")
def _():
    model = cuda_model()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    lines = []

    def timed(label, body):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with DevicePeak() as device:
            start = time.perf_counter()
            body()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        torch_peak = torch.cuda.max_memory_allocated() - base
        lines.append(f"{label}: {seconds:.3f} s, {total / seconds / 1e9:.2f} GB/s, peak GPU memory "
                     f"over the model: torch {torch_peak / GIB:.2f} GiB, device "
                     f"{(device.peak - device.before) / GIB:.2f} GiB")
        return total / seconds / 1e9

    def with_safetensors():
        state = {}
        for shard in shards:
            state.update(load_file(shard, device="cuda"))
        model.load_state_dict(state)
        del state

    def garbage():
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan")) if p.is_floating_point() else p.zero_()
        torch.cuda.synchronize()

    garbage()
    st_gbps = timed("model.load_state_dict(load_file(device='cuda'))", with_safetensors)
    garbage()
    report = None

    def with_weightcast():
        nonlocal report
        report = weightcast.load_into(model, ckpt, timeout=30)

    wc_gbps = timed("weightcast.load_into(model)", with_weightcast)
    bad = differing(dict(model.state_dict()))
    assert not bad, f"{len(bad)} tensor(s) differ from safetensors.load_file: {bad[:3]}"
    for line in lines:
        print(f"  {line}")
    return (f"{total} B into a CUDA model: load_into {wc_gbps:.2f} GB/s, load_state_dict(load_file"
            f"(cuda)) {st_gbps:.2f} GB/s ({wc_gbps / st_gbps:.2f}x); {lines[1].split(': ', 1)[1]}"
            f" | safetensors: {lines[0].split(': ', 1)[1]}; staged {len(report.staged_keys)}; "
            f"torch.equal to safetensors.load_file")


sys.exit(1 if failed else 0)
