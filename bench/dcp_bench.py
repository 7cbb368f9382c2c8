#!/usr/bin/env python3
"""DCP loads of a 2 x 2 (data parallel x tensor parallel) Llama on 4 ranks, side by side.

Three ways to fill the same model (and two more, for an account of the first), each job a fresh
`mpirun -n 4` on a gloo CPU mesh:

  weightcast     dcp.load(model.state_dict(),
                          storage_reader=weightcast.dcp.HuggingFaceStorageReader(path))
  torch_reader   dcp.load(model.state_dict(),
                          storage_reader=dcp.HuggingFaceStorageReader(path))   (torch's)
  weightcast_unverified  weightcast's reader with verify=False (no XXH3 of the bytes on any
                 rank; the default, verify=True, has every rank hash what lands and rank 0 what
                 it reads): not in the default set, an account of where weightcast's time goes
  weightcast_buffered    weightcast's reader with direct_io=False (rank 0 reads through the
                 page cache instead of O_DIRECT): not in the default set either
  broadcast      rank 0 safetensors.torch.load_file()s every shard, then
                 set_model_state_dict(model, sd, StateDictOptions(full_state_dict=True,
                                                                  broadcast_from_rank0=True))

The model: the checkpoint's LlamaConfig built on meta in BF16, torch's tensor-parallel plan
(ColwiseParallel for q/k/v/gate/up, RowwiseParallel for o/down) on the mesh's "tp" dim, then
fully_shard of each decoder layer and of the root on its "dp" dim, to_empty(device="cpu") (as
tests/python/dcp_mesh_worker.py does for a tiny Llama).

Modes: `warm` (every shard read once with cat before the job) and `cold` (`sync; echo 3 >
/proc/sys/vm/drop_caches` before the job; the bench stops if the kernel refuses). Each
repetition runs every mode and, within it, every method, the methods' order rotated from one
repetition to the next. Each cold repetition also times the O_DIRECT floor: `dd iflag=direct
bs=16M of=/dev/null` of every shard in turn, after a drop.

Figures:
  load s     rank 0's wall time around the load call (dcp.load, or load_file and
             set_model_state_dict), between barriers;
  job s      the whole mpirun (start-up, imports, model build, load, exit), from this driver;
  peak RSS   each rank's ru_maxrss right after the load (file-backed pages of an mmap count);
  base RSS   the same before the load (torch, transformers, the untouched to_empty storage);
  phases     rank 0's time in the reader's read_metadata / prepare_global_plan / read_data, the
             rest of dcp.load (DCP's planner, its collectives) = load - those; for weightcast also
             the library's job inside read_data (its run_job, and the pipeline's own seconds).
  check      per rank, an int64 sum of every local shard's 16-bit words, from the first
             repetition's jobs; every method must agree rank by rank.

Usage:  dcp_bench.py CHECKPOINT [--reps 3] [--modes cold,warm] [--methods ...] [--stop-at HH:MM]
                                [--work DIR] [--timeout 300] [--results-md FILE]
        (mpirun, as root with --allow-run-as-root, runs this file again with --worker)
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

METHODS = ["weightcast", "torch_reader", "broadcast", "weightcast_unverified",
           "weightcast_buffered"]
MIB = 1 << 20


def shard_files(ckpt: Path) -> list[Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt / n for n in names]
    return [ckpt / "model.safetensors"]


def vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


# ----------------------------------------------------------------------------- one rank

def worker(args) -> int:
    torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    rank = int(os.environ["RANK" if torchrun else "OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["WORLD_SIZE" if torchrun else "OMPI_COMM_WORLD_SIZE"])
    res: dict = {"rank": rank, "method": args.method}
    out = Path(args.result.format(rank=rank))
    try:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             set_model_state_dict)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor
        from transformers import LlamaConfig, LlamaForCausalLM

        # The layout the DCP tests check bit for bit (tests/python/dcp_mesh_worker.py).
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
        from dcp_mesh_worker import parallelize_tp_fsdp

        torch.set_num_threads(1)  # 4 ranks on a few cores, as torchrun sets it
        ckpt = Path(args.checkpoint)
        if torchrun:  # torchrun's env://; weightcast takes its endpoint over the group
            dist.init_process_group("gloo")
        else:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                    rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig.from_pretrained(ckpt))
        model = parallelize_tp_fsdp(model.to(torch.bfloat16), mesh)

        def local(t):
            return t.to_local() if isinstance(t, DTensor) else t

        res["local_bytes"] = sum(local(t).numel() * local(t).element_size()
                                 for t in model.state_dict().values())
        phases: dict[str, float] = {}

        def timed(obj, name, key=None):
            orig = getattr(obj, name)

            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return orig(*a, **k)
                finally:
                    phases[key or name] = phases.get(key or name, 0.0) + time.perf_counter() - t0
            setattr(obj, name, wrapper)
            return orig

        # Every module a method uses is imported before the clock starts (a cold page cache
        # would otherwise time the imports' reads too).
        import weightcast.dcp  # noqa: F401
        from safetensors.torch import load_file
        from weightcast import _options

        dist.barrier()
        res["base_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        t0 = time.perf_counter()
        with torch.no_grad():
            if args.method == "broadcast":
                sd: dict = {}
                if rank == 0:
                    for f in shard_files(ckpt):
                        sd.update(load_file(f))
                phases["load_file"] = time.perf_counter() - t0
                set_model_state_dict(model, sd, options=StateDictOptions(
                    full_state_dict=True, broadcast_from_rank0=True))
                del sd
            else:
                if args.method.startswith("weightcast"):
                    reader = weightcast.dcp.HuggingFaceStorageReader(
                        ckpt, rendezvous_port=None if torchrun else args.wc_port,
                        progress=False, config=args.config,
                        verify=args.method != "weightcast_unverified",
                        direct_io=False if args.method == "weightcast_buffered" else None)
                    stats: dict = {}
                    orig = _options.run_job

                    def run_and_keep(*a, **k):
                        t1 = time.perf_counter()
                        r = orig(*a, **k)
                        phases["wc_run_job"] = time.perf_counter() - t1
                        stats.update(r.stats)
                        return r
                    _options.run_job = run_and_keep
                else:
                    reader = dcp.HuggingFaceStorageReader(str(ckpt))
                for name in ("read_metadata", "prepare_global_plan", "read_data"):
                    timed(reader, name)
                dcp.load(model.state_dict(), storage_reader=reader)
                if args.method.startswith("weightcast"):
                    _options.run_job = orig
                    res["wc_stats"] = {k: stats.get(k) for k in
                                       ("bytes", "seconds", "staging_bytes", "reader",
                                        "io_mode", "transport", "node_reads")}
        res["seconds"] = time.perf_counter() - t0
        res["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        res["vm_hwm"] = vm_hwm()
        res["phases"] = phases
        dist.barrier()
        if args.check:
            total = 0
            for t in model.state_dict().values():
                lt = local(t).contiguous()
                total += int(lt.view(torch.int16).sum(dtype=torch.int64)) if lt.element_size() \
                    == 2 else int(lt.view(torch.int32).sum(dtype=torch.int64))
            res["check"] = total
        dist.destroy_process_group()
        rc = 0
    except Exception as e:  # reported in the table
        res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        rc = 1
    out.write_text(json.dumps(res))
    return rc


# ----------------------------------------------------------------------------- driver

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")  # raises if refused: the bench stops


def warm(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb") as h:
            while h.read(64 * MIB):
                pass


def direct_floor(files: list[Path]) -> float:
    t0 = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def run_job(args, method: str, work: Path, tag: str, check: bool) -> dict:
    result = work / f"{tag}-rank{{rank}}.json"
    if args.launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4"]
    else:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += ["-x", "OMP_NUM_THREADS=1", "-x", "HF_HUB_OFFLINE=1", "-x",
                "TRANSFORMERS_OFFLINE=1", sys.executable]
    cmd += [os.path.abspath(__file__), "--worker", "--method", method,
            str(args.checkpoint), "--port", str(free_port()),
            "--wc-port", str(free_port()), "--result", str(result)]
    if args.config:
        cmd += ["--config", args.config]
    if check:
        cmd.append("--check")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        text, _ = p.communicate(timeout=args.timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # this job's own group: mpirun and its ranks
        text, _ = p.communicate()
        rc = 124
    job = {"method": method, "job_s": time.perf_counter() - t0, "rc": rc, "ranks": []}
    for r in range(4):
        f = Path(str(result).format(rank=r))
        job["ranks"].append(json.loads(f.read_text()) if f.exists() else {"error": "no result"})
    errors = [x.get("error") for x in job["ranks"] if x.get("error")]
    if rc != 0 or errors:
        job["error"] = (errors[0] if errors and errors[0] != "no result"
                        else f"rc {rc}: " + text.strip()[-300:])
        (work / f"{tag}.log").write_text(text)
    return job


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def render(jobs: list[dict], floors: list[float], args, started: str) -> str:
    lines = [f"Started {started}; {len(floors)} O_DIRECT floor runs; reps as run: "
             f"{max([j['rep'] for j in jobs], default=-1) + 1}.", ""]
    lines.append("| mode | method | load s min / median (rank 0) | vs torch_reader (median) | "
                 "job s min / median | peak RSS per rank, MiB (max over reps) | "
                 "base RSS rank 0, MiB | errors |")
    lines.append("|---|---|---|---|---|---|---|---|")
    summary: dict = {}
    for mode in args.modes:
        for method in args.methods:
            js = [j for j in jobs if j["mode"] == mode and j["method"] == method]
            ok = [j for j in js if "error" not in j]
            loads = [j["ranks"][0]["seconds"] for j in ok]
            walls = [j["job_s"] for j in ok]
            peaks = [max(j["ranks"][r]["peak_rss"] for j in ok) // MIB if ok else 0
                     for r in range(4)]
            summary[(mode, method)] = {"load": med(loads), "job": med(walls), "ok": ok,
                                       "peaks": peaks}
            errs = "; ".join(sorted({j["error"] for j in js if "error" in j})) or "—"
            lines.append(
                f"| {mode} | {method} | "
                + (f"{min(loads):.2f} / {med(loads):.2f}" if loads else "—") + " | {ratio} | "
                + (f"{min(walls):.1f} / {med(walls):.1f}" if walls else "—") + " | "
                + " / ".join(str(p) for p in peaks) + " | "
                + (str(max(j["ranks"][0]["base_rss"] for j in ok) // MIB) if ok else "—")
                + f" | {errs} |")
    # ratios against torch's reader in the same mode
    out = []
    for line in lines:
        if "{ratio}" in line:
            mode, method = [c.strip() for c in line.split("|")[1:3]]
            base = summary.get((mode, "torch_reader"), {}).get("load", float("nan"))
            mine = summary[(mode, method)]["load"]
            line = line.replace("{ratio}", f"{mine / base:.2f}×" if base == base and mine == mine
                                else "—")
        out.append(line)
    lines = out
    if floors:
        lines.append(f"| cold | O_DIRECT `dd bs=16M` of every shard | "
                     f"{min(floors):.2f} / {med(floors):.2f} | — | — | — | — | — |")
    lines.append("")

    # Phases on rank 0 (medians).
    lines.append("Rank 0's time by phase, median s (rest = load − the phases listed):")
    lines.append("")
    lines.append("| mode | method | load | phases | rest |")
    lines.append("|---|---|---|---|---|")
    for (mode, method), s in summary.items():
        if not s["ok"]:
            continue
        keys = sorted({k for j in s["ok"] for k in j["ranks"][0]["phases"]})
        meds = {k: med([j["ranks"][0]["phases"].get(k, 0.0) for j in s["ok"]]) for k in keys}
        top = {k: v for k, v in meds.items() if k != "wc_run_job"}
        rest = s["load"] - sum(top.values())
        text = ", ".join(f"{k} {v:.2f}" for k, v in meds.items())
        if method.startswith("weightcast"):
            pipe = med([j["ranks"][0].get("wc_stats", {}).get("seconds") or 0.0
                        for j in s["ok"]])
            text += f", pipeline (stats.seconds) {pipe:.2f}"
        lines.append(f"| {mode} | {method} | {s['load']:.2f} | {text} | {rest:.2f} |")
    lines.append("")

    # Targets (issue 32's "Done when").
    lines.append("Targets:")
    lines.append("")
    c_wc = summary.get(("cold", "weightcast"), {}).get("load", float("nan"))
    c_t = summary.get(("cold", "torch_reader"), {}).get("load", float("nan"))
    w_wc = summary.get(("warm", "weightcast"), {}).get("load", float("nan"))
    w_t = summary.get(("warm", "torch_reader"), {}).get("load", float("nan"))
    fl = med(floors)
    if c_wc == c_wc and c_t == c_t:
        lines.append(f"- cold: torch_reader / weightcast = {c_t / c_wc:.2f} (target ≥ 2): "
                     f"{'met' if c_t / c_wc >= 2 else 'MISSED'}")
    if c_wc == c_wc and fl == fl:
        lines.append(f"- cold: weightcast / O_DIRECT floor = {c_wc / fl:.2f} (target ≤ 2): "
                     f"{'met' if c_wc / fl <= 2 else 'MISSED'}")
    if w_wc == w_wc and w_t == w_t:
        lines.append(f"- warm: weightcast / torch_reader = {w_wc / w_t:.2f} (target ≤ 1): "
                     f"{'met' if w_wc / w_t <= 1 else 'MISSED'}")
    staging = args.staging_mib * MIB
    for mode in args.modes:
        wc = summary.get((mode, "weightcast"), {}).get("ok", [])
        tr = summary.get((mode, "torch_reader"), {}).get("ok", [])
        if not wc or not tr:
            continue
        parts = []
        verdict = True
        for r in range(4):
            base = max(j["ranks"][r]["base_rss"] for j in tr)
            allow = base + wc[0]["ranks"][r]["local_bytes"] + staging + 100 * MIB
            peak = max(j["ranks"][r]["peak_rss"] for j in wc)
            verdict &= peak <= allow
            parts.append(f"rank {r} {peak // MIB} ≤ {allow // MIB}")
        lines.append(f"- {mode}: weightcast peak RSS ≤ torch_reader's base RSS + local shards + "
                     f"staging ({args.staging_mib} MiB) + 100 MiB, MiB: {'; '.join(parts)}: "
                     f"{'met' if verdict else 'MISSED'}")
    checks: dict = {}
    for j in jobs:
        if "error" not in j and all("check" in r for r in j["ranks"]):
            checks.setdefault(j["method"], set()).add(tuple(r["check"] for r in j["ranks"]))
    agree = len({c for cs in checks.values() for c in cs}) == 1
    lines.append(f"- check (per-rank int64 sums of the local shards' words, first repetition): "
                 f"{'every method agrees' if agree else 'DIFFER: ' + repr(checks)}")
    return "\n".join(lines)


def driver(args) -> int:
    ckpt = Path(args.checkpoint)
    files = shard_files(ckpt)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stop_at = None
    if args.stop_at:
        hh, mm = map(int, args.stop_at.split(":"))
        stop_at = datetime.now(timezone.utc).replace(hour=hh, minute=mm, second=0)
    started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    jobs: list[dict] = []
    floors: list[float] = []
    log = open(work / "jobs.jsonl", "w")
    for rep in range(args.reps):
        if stop_at and datetime.now(timezone.utc) >= stop_at:
            print(f"# stop-at {args.stop_at} reached before repetition {rep}", file=sys.stderr)
            break
        k = rep % len(args.methods)
        order = args.methods[k:] + args.methods[:k]
        for mode in args.modes:
            if mode == "cold":
                drop_caches()
                floors.append(direct_floor(files))
                print(f"# rep {rep} O_DIRECT floor {floors[-1]:.2f} s", file=sys.stderr)
            for method in order:
                if mode == "cold":
                    drop_caches()
                else:
                    warm(files)
                job = run_job(args, method, work, f"r{rep}-{mode}-{method}", check=rep == 0)
                job.update(rep=rep, mode=mode)
                jobs.append(job)
                log.write(json.dumps(job) + "\n")
                log.flush()
                print(f"# rep {rep} {mode} {method}: load "
                      f"{job['ranks'][0].get('seconds', float('nan')):.2f} s, job "
                      f"{job['job_s']:.1f} s" + (f", ERROR {job['error']}" if "error" in job
                                                 else ""), file=sys.stderr)
    table = render(jobs, floors, args, started)
    print(table)
    if args.results_md:
        with open(args.results_md, "a") as f:
            f.write(table + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", choices=METHODS)
    ap.add_argument("--port", type=int)
    ap.add_argument("--wc-port", type=int)
    ap.add_argument("--result")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--launcher", choices=("mpirun", "torchrun"), default="mpirun",
                    help="who starts the 4 ranks: mpirun (weightcast's world from Open MPI's "
                         "variables) or torchrun (from the process group)")
    ap.add_argument("--config", help="a weightcast config file for the weightcast methods "
                                     "(e.g. one that sets transport)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--methods", default=",".join(METHODS[:3]))
    ap.add_argument("--stop-at", help="UTC HH:MM: start no repetition after it")
    ap.add_argument("--work", default="/tmp/weightcast-dcp-bench")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--staging-mib", type=int, default=64,
                    help="weightcast's staging ring (chunk_size x buffer_depth), MiB, "
                    "for the RSS target")
    ap.add_argument("--results-md")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    args.modes = args.modes.split(",")
    args.methods = args.methods.split(",")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
