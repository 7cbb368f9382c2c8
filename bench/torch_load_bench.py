#!/usr/bin/env python3
"""Loading a transformers-saved Llama into an FSDP2 model on N ranks: torch's paths beside
weightcast's, side by side in one run, with a bit-exact cross-check of every rank's local shards.

Every variant runs as a fresh `mpirun -np N` job (gloo CPU backend, rendezvous over TCP on
127.0.0.1), on the same checkpoint, with the page cache warm: the files are read before each job,
as a kernel may page out file pages left idle for a minute (DAMON's pageout scheme does on the VM
bench/RESULTS.md's figures come from):

  fsdp2_broadcast       accelerate's / torch's FSDP2 path (cpu_ram_efficient_loading): rank 0
                        reads the full state dict (safetensors.torch.load_file of every shard);
                        every rank builds the model on meta, fully_shard (each decoder layer,
                        then the root) on a 1-D CPU mesh, to_empty(device="cpu"), then
                        set_model_state_dict(model, sd, StateDictOptions(full_state_dict=True,
                        broadcast_from_rank0=True)).
  dcp_slices            what torch DCP's HuggingFaceStorageReader does: every rank opens every
                        shard (safe_open), reads only its own slice of each tensor (get_slice,
                        from the DTensor's local shape and global offset) and
                        to_local().copy_() it. Needs the files on every node.
  load_file_every_rank  every rank load_file()s every shard (the whole model in each rank's
                        RAM), then set_model_state_dict(full_state_dict=True) slices locally:
                        transformers' path before its FSDP memory fix.
  weightcast_load_into  fully_shard + to_empty as above, then weightcast.load_into(model, path)
                        (rank 0 reads; each rank's local shards land in to_local() itself over
                        MPI, FP32 params cast at the receiver); only where `import weightcast`
                        works; a load_into that refuses the world is reported with its message.
  weightcast_load_into_unverified
                        the same with verify=False (`verify: none`): no digests, the work the
                        rows above do (none of them verifies); weightcast's default is digest.
  weightcast_load_into_shm
                        weightcast_load_into with `transport: shm` (a config file): the node
                        plane instead of MPI, as `auto` picks it under torchrun; with the page
                        cache warm each rank reads its own boxes.
  weightcast_replicate  `mpirun -np N weightcast run CFG --set device=host [--set
  weightcast_fsdp        placement=replicate|fsdp] --report r.{rank}.json` (CLI, no torch, the
                        checkpoint's dtype); fsdp only where the binary accepts the key.

The model's parameters are BF16 (the checkpoint's dtype) or FP32 (master weights; torch casts
at load_state_dict's copy). The weightcast CLI rows exist only in the checkpoint's dtype.

Figures (each variant runs --rounds times, round-robin with the others, so that a noisy
machine's slow spells fall on every variant alike):
  load s    the load alone, timed inside each rank between two barriers (after fully_shard and
            to_empty, before hashing); the max over ranks; the median over the rounds, with
            the fastest and slowest round beside it. weightcast CLI: the reports' `seconds`
            (its pipeline), max over ranks.
  wall s    the whole mpirun job (interpreter, torch import, model build, hashing included).
  peak RSS  each rank's ru_maxrss (GiB = 2^30 B) right after the load; weightcast CLI: the
            report's peak_rss_bytes. File pages mapped by safe_open count in RSS.
  base RSS  ru_maxrss before the load: torch, transformers and the (untouched) to_empty
            storage; the peak minus it is what the load itself cost.
  exact     every rank's local shards (DTensor.to_local(), XXH3-64 of the bytes) equal to
            fsdp2_broadcast's in the same dtype; fsdp2_broadcast's BF16 shards are checked
            against the checkpoint's own bytes cut with torch.chunk semantics, computed here
            in the parent, and weightcast_replicate's whole tensors against the whole tensors.

Usage (from the repository root; bench/torch_placement_bench.sh wraps it):
  torch_load_bench.py --checkpoint DIR [--ranks 3] [--dtypes bf16,fp32]
                      [--variants fsdp2_broadcast,dcp_slices,...] [--weightcast BIN]
                      [--work DIR] [--results-md FILE] [--timeout 300] [--rounds 3]
Needs torch, transformers, safetensors and xxhash importable (xxhash may come from
$WC_BENCH_PYDEPS, a `pip install --target` folder), and Open MPI's mpirun.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if os.environ.get("WC_BENCH_PYDEPS"):
    sys.path.append(os.environ["WC_BENCH_PYDEPS"])

TORCH_VARIANTS = ["fsdp2_broadcast", "dcp_slices", "load_file_every_rank", "weightcast_load_into",
                  "weightcast_load_into_unverified", "weightcast_load_into_shm"]
CLI_VARIANTS = ["weightcast_replicate", "weightcast_fsdp"]
ALL_VARIANTS = TORCH_VARIANTS + CLI_VARIANTS
GIB = 1 << 30


def warm_page_cache(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def shard_files(ckpt: Path) -> list[Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt / n for n in names]
    return sorted(ckpt.glob("*.safetensors"))


def xxh3_hex(t) -> str:
    import xxhash

    t = t.detach().contiguous()
    if t.numel() == 0:
        return xxhash.xxh3_64(b"").hexdigest()
    return xxhash.xxh3_64(t.reshape(-1).view(__import__("torch").uint8).numpy()).hexdigest()


# ----------------------------------------------------------------------------- rank side

def _rank_world() -> tuple[int, int]:
    for r, w in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("RANK", "WORLD_SIZE"),
                 ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ:
            return int(os.environ[r]), int(os.environ[w])
    return 0, 1


def _local_box(t):
    """(local tensor, global offset per dim) of a model state entry: a DTensor's local shard,
    or a plain tensor whole."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if isinstance(t, DTensor):
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        local = t.to_local()
        assert tuple(local.shape) == tuple(shape), (local.shape, shape)
        return local, tuple(offset)
    return t, (0,) * t.dim()


def worker(args) -> int:
    import resource

    rank, world = _rank_world()
    out = Path(args.result.format(rank=rank))
    res: dict = {"rank": rank, "world_size": world, "variant": args.worker}
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from transformers import LlamaConfig, LlamaForCausalLM

        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.param_dtype]
        torch.set_num_threads(1)  # N ranks on a few cores: one thread each, as torchrun does
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                                world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        ckpt = Path(args.checkpoint)
        config = LlamaConfig.from_pretrained(ckpt)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model.to(dtype)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        files = shard_files(ckpt)

        dist.barrier()
        res["base_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter()
        with torch.no_grad():
            load(args.worker, model, ckpt, files, rank, args.wc_port)
        res["seconds"] = time.perf_counter() - t0
        res["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        dist.barrier()

        tensors = {}
        for name, t in model.state_dict().items():
            local, offset = _local_box(t)
            tensors[name] = {"shape": list(local.shape), "offset": list(offset),
                             "xxh3": xxh3_hex(local)}
        res["tensors"] = tensors
        dist.destroy_process_group()
        rc = 0
    except Exception as e:  # reported in the table; the other ranks fail or time out alike
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        rc = 1
    out.write_text(json.dumps(res))
    return rc


def load(variant: str, model, ckpt: Path, files: list[Path], rank: int,
         wc_port: int | None = None) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if variant == "fsdp2_broadcast":
        from safetensors.torch import load_file

        sd = {}
        if rank == 0:
            for f in files:
                sd.update(load_file(f))
        set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True,
                                                                 broadcast_from_rank0=True))
    elif variant == "load_file_every_rank":
        from safetensors.torch import load_file

        sd = {}
        for f in files:
            sd.update(load_file(f))
        set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True))
    elif variant == "dcp_slices":
        from safetensors import safe_open

        dst = model.state_dict()
        seen = set()
        for f in files:
            with safe_open(f, framework="pt") as h:
                for key in h.keys():
                    local, offset = _local_box(dst[key])
                    seen.add(key)
                    if local.numel() == 0:
                        continue
                    if local.dim() == 0:
                        local.copy_(h.get_tensor(key))
                        continue
                    index = tuple(slice(o, o + n) for o, n in zip(offset, local.shape))
                    local.copy_(h.get_slice(key)[index])
        missing = set(dst) - seen
        if missing:
            raise KeyError(f"dcp_slices: not in the checkpoint: {sorted(missing)[:5]}")
    elif variant in ("weightcast_load_into", "weightcast_load_into_unverified"):
        import weightcast

        weightcast.load_into(model, ckpt, progress=False, rendezvous_port=wc_port,
                             verify=variant == "weightcast_load_into")
    elif variant == "weightcast_load_into_shm":
        import tempfile

        import weightcast

        # The node plane instead of MPI (what `auto` picks under torchrun): the node's ranks
        # share rank 0's staging ring, or read their own boxes where the files are cached.
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("transport: shm\n")
        weightcast.load_into(model, ckpt, progress=False, rendezvous_port=wc_port, config=f.name)
        os.unlink(f.name)
    else:
        raise ValueError(f"unknown variant {variant}")


# ----------------------------------------------------------------------------- parent side

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpirun_prefix(ranks: int) -> list[str]:
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def run_job(cmd: list[str], timeout: float, env=None) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env=env)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # our own job's group: mpirun and its ranks
        out, _ = p.communicate()
        return 124, time.perf_counter() - t0, out
    return p.returncode, time.perf_counter() - t0, out


def reference_hashes(files: list[Path], ranks: int) -> tuple[dict, dict]:
    """The checkpoint's own bytes: XXH3 of every whole tensor, and of every rank's Shard(0)
    piece with torch.chunk semantics (c = ceil(n / W); rank r gets rows [r*c, min(n, (r+1)*c));
    0-dim tensors whole), independent of torch.distributed."""
    from safetensors import safe_open

    whole, pieces = {}, [dict() for _ in range(ranks)]
    for f in files:
        with safe_open(f, framework="pt") as h:
            for key in h.keys():
                t = h.get_tensor(key)
                whole[key] = xxh3_hex(t)
                if t.dim() == 0:
                    for r in range(ranks):
                        pieces[r][key] = whole[key]
                    continue
                n = t.shape[0]
                c = -(-n // ranks)
                for r in range(ranks):
                    pieces[r][key] = xxh3_hex(t[min(n, r * c):min(n, (r + 1) * c)])
    return whole, pieces


def compare(got: list[dict], want: list[dict]) -> str:
    """'✓' when every rank holds exactly the wanted tensors with the wanted bytes, else '✗'
    with the first difference."""
    for r, (g, w) in enumerate(zip(got, want)):
        if set(g) != set(w):
            extra, missing = sorted(set(g) - set(w)), sorted(set(w) - set(g))
            return f"✗ rank {r}: extra {extra[:2]} missing {missing[:2]}"
        for k in w:
            if g[k] != w[k]:
                return f"✗ rank {r} {k}"
    return "✓"


def gib(b) -> str:
    return f"{b / GIB:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description="FSDP2 loads on N gloo ranks, torch vs weightcast")
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--variants", default=",".join(ALL_VARIANTS))
    ap.add_argument("--weightcast", default="build/weightcast", help="the CLI binary")
    ap.add_argument("--work", type=Path, default=Path("/tmp/weightcast-bench/torch-load"))
    ap.add_argument("--results-md", type=Path, help="also append the table to this file")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per mpirun job")
    ap.add_argument("--rounds", type=int, default=3,
                    help="run every variant this many times, round-robin; report the median")
    # rank side (set by the parent)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--param-dtype", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--wc-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if not args.checkpoint:
        ap.error("--checkpoint is required")

    import xxhash  # noqa: F401  (fail here, not in the ranks)

    ckpt = args.checkpoint.resolve()
    files = shard_files(ckpt)
    if not files:
        print(f"torch_load_bench: no .safetensors in {ckpt}", file=sys.stderr)
        return 66  # EX_NOINPUT
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in ALL_VARIANTS:
            ap.error(f"unknown variant {v} (known: {', '.join(ALL_VARIANTS)})")
    args.work.mkdir(parents=True, exist_ok=True)
    tensor_bytes = 0
    for f in files:
        hlen = int.from_bytes(open(f, "rb").read(8), "little")
        tensor_bytes += f.stat().st_size - 8 - hlen
    print(f"# checkpoint {ckpt}: {len(files)} shards, {tensor_bytes / 1e9:.2f} GB of tensors",
          file=sys.stderr)
    ref_whole, ref_pieces = reference_hashes(files, args.ranks)

    # Whether weightcast's Python package imports (its world support shows in the run itself).
    wc_py = subprocess.run([sys.executable, "-c", "import weightcast, sys; "
                            "sys.stdout.write(weightcast.__file__)"],
                           capture_output=True, text=True)
    wc_py_skip = None if wc_py.returncode == 0 else (
        "import weightcast failed: " + (wc_py.stderr.strip().splitlines() or ["?"])[-1])
    wc_world_skip = None
    wc_bin = Path(args.weightcast)
    wc_bin_skip = None if os.access(wc_bin, os.X_OK) else f"no weightcast binary at {wc_bin}"

    rows = []  # (dtype, variant, cells...)
    refs: dict[str, list[dict]] = {}
    me = str(Path(__file__).resolve())
    for rnd in range(args.rounds):
        for dt in args.dtypes.split(","):
            for v in variants:
                warm_page_cache(files)  # so every job starts alike
                tag = f"{dt}.{v}"
                row = {"dtype": dt, "variant": v}
                if v in CLI_VARIANTS:
                    if dt != "bf16":
                        continue  # the CLI lands the checkpoint's dtype only
                    if wc_bin_skip:
                        row["skip"] = wc_bin_skip
                    else:
                        run_cli(row, v, wc_bin, ckpt, args, tag, ref_whole, refs.get("bf16"))
                    rows.append(row)
                    print(json.dumps({k: row[k] for k in row if k != "ranks"}), file=sys.stderr)
                    continue
                if v.startswith("weightcast_load_into") and (wc_py_skip or wc_world_skip):
                    row["skip"] = wc_py_skip or wc_world_skip
                    rows.append(row)
                    continue
                result = str(args.work / f"{tag}.r{{rank}}.json")
                for r in range(args.ranks):
                    Path(result.format(rank=r)).unlink(missing_ok=True)
                cmd = mpirun_prefix(args.ranks) + [sys.executable, me, "--worker", v,
                                                   "--param-dtype", dt, "--port", str(free_port()),
                                                   "--wc-port", str(free_port()),
                                                   "--checkpoint", str(ckpt), "--result", result]
                rc, wall, out = run_job(cmd, args.timeout)
                row["wall"] = wall
                reps = []
                for r in range(args.ranks):
                    p = Path(result.format(rank=r))
                    reps.append(json.loads(p.read_text()) if p.exists() else {"error": "no result"})
                errs = [f"rank {x.get('rank', r)}: {x['error']}" for r, x in enumerate(reps)
                        if "error" in x]
                if v.startswith("weightcast_load_into") and errs and "several ranks" in errs[0]:
                    # The package refuses this world size (a build without the distributed entry
                    # point): a skip with its message, and no second job for the other dtype.
                    wc_world_skip = "load_into refuses the world: " + errs[0].split(": ", 1)[1]
                    row["skip"] = wc_world_skip
                elif rc != 0 or errs:
                    why = errs[0] if errs else f"mpirun exit {rc}" + (" (timeout)" if rc == 124 else "")
                    row["fail"] = why
                    if rc != 0 and not errs:
                        row["fail"] += ": " + " | ".join(out.strip().splitlines()[-3:])[:300]
                else:
                    row["seconds"] = max(x["seconds"] for x in reps)
                    row["peak"] = [x["peak_rss_bytes"] for x in reps]
                    row["base"] = [x["base_rss_bytes"] for x in reps]
                    got = [{k: t["xxh3"] for k, t in x["tensors"].items()} for x in reps]
                    if v == "fsdp2_broadcast":
                        refs[dt] = got
                        row["exact"] = (compare(got, ref_pieces) + " (= checkpoint slices)"
                                        if dt == "bf16" else "reference")
                    elif dt in refs:
                        row["exact"] = compare(got, refs[dt])
                    else:
                        row["exact"] = "? (no fsdp2_broadcast run)"
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)

    rows = merge_rounds(rows)
    table = render(rows, args, ckpt, tensor_bytes)
    print(table)
    if args.results_md:
        with open(args.results_md, "a") as fh:
            fh.write(table + "\n")
    return 0 if not any("fail" in r or str(r.get("exact", "")).startswith("✗") for r in rows) \
        else 1


def run_cli(row, v, wc_bin, ckpt, args, tag, ref_whole, ref_bf16) -> None:
    cfg = args.work / "weightcast.yaml"
    cfg.write_text(f"checkpoint: {ckpt}\ndevice: host\n")
    placement = "fsdp" if v == "weightcast_fsdp" else "replicate"
    report = str(args.work / f"{tag}.r{{rank}}.json")
    for r in range(args.ranks):
        Path(report.format(rank=r)).unlink(missing_ok=True)

    def job(extra):
        cmd = mpirun_prefix(args.ranks) + [str(wc_bin), "run", str(cfg), "--set", "device=host",
                                           *extra, "--report", report]
        return run_job(cmd, args.timeout)

    rc, wall, out = job(["--set", f"placement={placement}"])
    if rc != 0 and "placement" in out and placement == "replicate":
        # A binary without the placement key still replicates (its only behaviour).
        rc, wall, out = job([])
        row["note"] = "binary has no `placement` key: its default (whole tensors)"
    if rc != 0:
        lines = [ln for ln in out.strip().splitlines() if ln.strip()]
        msg = next((ln for ln in lines if "placement" in ln), lines[-1] if lines else "")
        if "placement" in out and rc == 78:
            row["skip"] = f"binary refuses placement={placement}: {msg.strip()[:200]}"
        else:
            row["fail"] = f"exit {rc}: {msg.strip()[:200]}"
        return
    reps = [json.loads(Path(report.format(rank=r)).read_text()) for r in range(args.ranks)]
    row["wall"] = wall
    row["seconds"] = max(x["seconds"] for x in reps)
    row["peak"] = [x["peak_rss_bytes"] for x in reps]
    got = [{k: t["xxh3"] for k, t in x.get("tensors", {}).items()} for x in reps]
    if placement == "replicate":
        row["exact"] = compare(got, [ref_whole] * args.ranks) + " (= whole tensors)"
    elif got and all(g == ref_whole for g in got):
        row["exact"] = "✗ every rank got whole tensors (placement=fsdp accepted, not applied)"
    elif ref_bf16 is not None:
        row["exact"] = compare(got, ref_bf16)
    else:
        row["exact"] = "? (no bf16 fsdp2_broadcast run)"


def merge_rounds(rows: list[dict]) -> list[dict]:
    """One row per (params, variant) from its rounds: the median load and wall seconds, with
    the range in `spread`; per rank the highest peak and base RSS; failed or skipped if any
    round was, else the first not-exact verdict, else the first."""
    import statistics

    merged: dict[tuple, list[dict]] = {}
    for r in rows:
        merged.setdefault((r["dtype"], r["variant"]), []).append(r)
    out = []
    for (dt, v), rs in merged.items():
        bad = next((r for r in rs if "skip" in r or "fail" in r), None)
        if bad is not None:
            out.append(bad)
            continue
        row = dict(rs[0])
        secs = sorted(r["seconds"] for r in rs)
        row["seconds"] = statistics.median(secs)
        row["spread"] = (secs[0], secs[-1], len(secs))
        row["wall"] = statistics.median(r["wall"] for r in rs)
        row["peak"] = [max(x) for x in zip(*(r["peak"] for r in rs))]
        if "base" in row:
            row["base"] = [max(x) for x in zip(*(r["base"] for r in rs))]
        row["exact"] = next((r["exact"] for r in rs if not str(r["exact"]).startswith("✓")
                             and r["exact"] != "reference"), rs[0]["exact"])
        out.append(row)
    return out


def render(rows, args, ckpt, tensor_bytes) -> str:
    cmd = " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    base = {r["dtype"]: r.get("seconds") for r in rows if r["variant"] == "fsdp2_broadcast"}
    out = [f"`{cmd}`", "",
           f"{args.ranks} ranks (gloo CPU, mpirun on one node), checkpoint {ckpt.name}: "
           f"{tensor_bytes / 1e9:.2f} GB BF16; page cache warm. RSS in GiB (2^30 B), "
           f"ranks 0/1/2...", "",
           "| params | variant | load s (max over ranks): median (min–max) | × fsdp2_broadcast "
           "| peak RSS per rank | base RSS per rank | wall s | local shards bit-exact |",
           "|---|---|---:|---:|---|---|---:|---|"]
    for r in rows:
        if "skip" in r or "fail" in r:
            what = ("skipped: " + r["skip"]) if "skip" in r else ("FAILED: " + r["fail"])
            out.append(f"| {r['dtype']} | {r['variant']} | {what} | | | | | |")
            continue
        b = base.get(r["dtype"])
        ratio = f"{b / r['seconds']:.2f}" if b else ""
        peak = " / ".join(gib(x) for x in r["peak"])
        basr = " / ".join(gib(x) for x in r["base"]) if "base" in r else "(no torch)"
        note = f" ({r['note']})" if "note" in r else ""
        lo, hi, n = r.get("spread", (r["seconds"], r["seconds"], 1))
        spread = f" ({lo:.2f}–{hi:.2f})" if n > 1 else ""
        out.append(f"| {r['dtype']} | {r['variant']}{note} | {r['seconds']:.2f}{spread} | {ratio} | "
                   f"{peak} | {basr} | {r['wall']:.1f} | {r['exact']} |")
    out.append("")
    out.append(f"{args.rounds} round(s), every variant once per round in this order; × "
               "fsdp2_broadcast: its median load seconds over this row's (above 1: faster); "
               "peak and base RSS: each rank's highest over the rounds.")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
