#!/usr/bin/env python3
"""weightcast against its peers, on the same checkpoint in the same run.

Peers (each in a fresh child process; time and peak RSS of that child):
  safetensors   safetensors.numpy.load_file() of every shard (the state dict in host RAM)
  read          a plain Python read() of every shard file into memory (the I/O floor)
  weightcast    `weightcast run --set device=host` (host arena, world size 1)

"load s" is the load alone, timed inside the child (weightcast: its pipeline seconds);
"wall s" is the whole child process, interpreter or launcher start included. Peak RSS is
the child's ru_maxrss (os.wait4). GB/s uses 1 GB = 1e9 B of tensor bytes (file bytes for
`read`).

Warm: every file is in the page cache (a warm-up run first, then --iterations timed runs;
the median is reported). Cold: `echo 3 > /proc/sys/vm/drop_caches` before each run (root
only; skipped where not permitted).

Also a chunk_size x buffer_depth sweep of weightcast (warm cache) rendered as a heatmap.

Usage: peer_bench.py --weightcast BUILD/weightcast --checkpoint NAME=PATH [...]
                     [--sweep PATH] [--png OUT.png] [--iterations 3] [--cold]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SAFETENSORS_CHILD = r"""
import sys, time, json
from safetensors.numpy import load_file
t0 = time.perf_counter()
tensors = {}
for path in sys.argv[1:]:
    tensors.update(load_file(path))
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "bytes": sum(a.nbytes for a in tensors.values()),
                  "tensors": len(tensors)}))
"""

READ_CHILD = r"""
import sys, time, json
t0 = time.perf_counter()
blobs = []
for path in sys.argv[1:]:
    with open(path, "rb", buffering=0) as f:
        blobs.append(f.read())
elapsed = time.perf_counter() - t0
print(json.dumps({"seconds": elapsed, "bytes": sum(len(b) for b in blobs)}))
"""


def shard_files(checkpoint: Path) -> list[Path]:
    if checkpoint.is_file() and checkpoint.suffix == ".safetensors":
        return [checkpoint]
    directory = checkpoint if checkpoint.is_dir() else checkpoint.parent
    index = sorted(directory.glob("*.safetensors.index.json"))
    if index:
        weight_map = json.loads(index[0].read_text())["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    return sorted(directory.glob("*.safetensors"))


def run_child(argv: list[str]) -> tuple[dict, float, int]:
    """Runs argv; returns (its JSON stdout, wall seconds, peak RSS bytes)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return json.loads(out.decode().strip().splitlines()[-1]), wall, usage.ru_maxrss * 1024


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def peers(weightcast: str, checkpoint: Path, files: list[Path]) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "safetensors": [py, "-c", SAFETENSORS_CHILD, *map(str, files)],
        "read": [py, "-c", READ_CHILD, *map(str, files)],
        "weightcast": [weightcast, "run", "--quiet", "--json", "--set",
                       f"checkpoint={checkpoint}", "--set", "device=host"],
    }


def measure(argv: list[str], iterations: int, cold: bool, warm_up: bool = True) -> dict:
    if not cold and warm_up:
        run_child(argv)  # warm-up: fills the page cache
    samples = []
    for _ in range(iterations):
        if cold and not drop_caches():
            return {}
        samples.append(run_child(argv))
    load = statistics.median(s[0]["seconds"] for s in samples)
    wall = statistics.median(s[1] for s in samples)
    rss = max(s[2] for s in samples)
    return {"load_s": load, "wall_s": wall, "rss": rss, "bytes": samples[0][0]["bytes"]}


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def peer_table(name: str, checkpoint: Path, weightcast: str, iterations: int,
               cold: bool) -> str:
    files = shard_files(checkpoint)
    file_bytes = sum(f.stat().st_size for f in files)
    rows = {}
    for peer, argv in peers(weightcast, checkpoint, files).items():
        rows[peer] = measure(argv, iterations, cold)
        if not rows[peer]:
            return f"(cold cache not measurable here: /proc/sys/vm/drop_caches not writable)\n"
        print(f"  {name} {'cold' if cold else 'warm'} {peer}: {rows[peer]}", file=sys.stderr)
    ref = rows["weightcast"]
    lines = [
        f"{name}: {len(files)} file(s), {gib(file_bytes)} ({file_bytes} B); "
        f"page cache {'cold (dropped before each run)' if cold else 'warm'}; "
        f"median of {iterations}",
        "",
        "| peer | load s | GB/s | wall s | peak RSS | load time / weightcast | RSS / weightcast |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for peer, r in rows.items():
        gbps = r["bytes"] / r["load_s"] / 1e9 if r["load_s"] > 0 else 0
        lines.append(f"| {peer} | {r['load_s']:.3f} | {gbps:.2f} | {r['wall_s']:.3f} | "
                     f"{gib(r['rss'])} | {r['load_s'] / ref['load_s']:.2f}x | "
                     f"{r['rss'] / ref['rss']:.2f}x |")
    return "\n".join(lines) + "\n"


SWEEP_CHUNKS = ["256KiB", "1MiB", "4MiB", "16MiB", "64MiB"]
SWEEP_DEPTHS = [1, 2, 4, 8, 16]


def sweep(weightcast: str, checkpoint: Path, iterations: int, png: Path | None) -> str:
    # One warm-up for the whole sweep: it only has to bring the file into the page cache.
    run_child(peers(weightcast, checkpoint, [checkpoint])["weightcast"])
    grid = []
    for chunk in SWEEP_CHUNKS:
        row = []
        for depth in SWEEP_DEPTHS:
            argv = [weightcast, "run", "--quiet", "--json", "--set", f"checkpoint={checkpoint}",
                    "--set", "device=host", "--set", f"chunk_size={chunk}",
                    "--set", f"buffer_depth={depth}", "--set", f"io_depth={depth}"]
            r = measure(argv, iterations, cold=False, warm_up=False)
            row.append(r["bytes"] / r["load_s"] / 1e9)
            print(f"  sweep {chunk} x {depth}: {row[-1]:.2f} GB/s", file=sys.stderr)
        grid.append(row)
    lines = ["GB/s (median of %d, warm page cache); rows chunk_size, columns buffer_depth "
             "(io_depth = buffer_depth)" % iterations, "",
             "| chunk_size | " + " | ".join(f"depth {d}" for d in SWEEP_DEPTHS) + " |",
             "| --- |" + " ---: |" * len(SWEEP_DEPTHS)]
    for chunk, row in zip(SWEEP_CHUNKS, grid):
        lines.append(f"| {chunk} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    if png:
        render_heatmap(grid, checkpoint, png)
    return "\n".join(lines) + "\n"


def render_heatmap(grid: list[list[float]], checkpoint: Path, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=100)
    image = ax.imshow(grid, cmap="viridis", origin="upper", aspect="auto")
    ax.set_xticks(range(len(SWEEP_DEPTHS)), [str(d) for d in SWEEP_DEPTHS])
    ax.set_yticks(range(len(SWEEP_CHUNKS)), SWEEP_CHUNKS)
    ax.set_xlabel("buffer_depth (staging slots; io_depth the same)")
    ax.set_ylabel("chunk_size")
    peak = max(max(row) for row in grid)
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            # Dark text on the bright (fast) cells, light text on the dark ones.
            colour = "black" if value > 0.6 * peak else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color=colour, fontsize=10)
    fig.colorbar(image, ax=ax, label="GB/s (1 GB = 1e9 B)")
    # "synth-250m-f16/model.safetensors" says more than "model.safetensors".
    label = f"{checkpoint.parent.name}/{checkpoint.name}"
    size = checkpoint.stat().st_size / 1e9
    ax.set_title(f"weightcast run, host arena, warm page cache, {os.cpu_count()} CPUs\n"
                 f"{label} ({size:.2f} GB): load GB/s", fontsize=10)
    fig.tight_layout()
    fig.savefig(png)
    print(f"wrote {png}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weightcast", required=True, help="path of the weightcast launcher")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also measure a cold page cache")
    parser.add_argument("--sweep", type=Path, help="checkpoint of the chunk x depth sweep")
    parser.add_argument("--png", type=Path, help="heatmap of the sweep")
    args = parser.parse_args()

    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs ({cpu}), {gib(mem)} RAM, "
          f"Linux {platform.release()}, Python {platform.python_version()}\n")
    for spec in args.checkpoint:
        name, _, path = spec.partition("=")
        print(peer_table(name, Path(path), args.weightcast, args.iterations, cold=False))
        if args.cold:
            print(peer_table(name, Path(path), args.weightcast, args.iterations, cold=True))
    if args.sweep:
        print(sweep(args.weightcast, args.sweep, args.iterations, args.png))


if __name__ == "__main__":
    main()
