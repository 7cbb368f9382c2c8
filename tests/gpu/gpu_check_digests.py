#!/usr/bin/env python3
"""Compares weightcast `--report` digests with the checkpoint's files (tests/gpu/gpu_check.sh).

Every GPU row of the check that moves tensor bytes is judged against the files, not against
another GPU load: a bug that corrupts every upload alike would pass a GPU-against-GPU check.

  gpu_check_digests.py --checkpoint DIR [--xxhash LIB] host HOST_REPORT
      The reference itself: HOST_REPORT (`weightcast run --set device=host --report`) must list
      every tensor of the files, and (with LIB) each digest must equal the XXH3-64 of the
      tensor's bytes read from the files here, so the reference is the files' and not only
      weightcast's host path.
  gpu_check_digests.py --checkpoint DIR [--xxhash LIB] rows HOST_REPORT REPORT...
      Each REPORT (one per rank) against the files: a whole tensor's digest must equal
      HOST_REPORT's; a local shard's (docs/placement.md § Reports: shape, global_shape,
      offset) must equal the XXH3-64 of that box's bytes read from the files (needs LIB).
      Every tensor of the files must be covered: whole on some rank, or by boxes whose
      elements add up to the tensor's.

LIB is libxxhash (XXH3-64, seed 0, as weightcast's digests): the bundle's lib/libxxhash.so.0.
Needs only python3's standard library. Exit status: 0 equal, 1 a digest differs or a tensor
is missing, 2 the inputs cannot be read.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import itertools
import json
import math
import mmap
import os
import struct
import sys


def fail_setup(message: str) -> None:
    print(f"digests: {message}")
    sys.exit(2)


def checkpoint_tensors(path: str) -> dict[str, dict]:
    """name -> {file, start, bytes, shape} from the safetensors headers (file order)."""
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")) \
        if os.path.isdir(path) else [path]
    if not files:
        fail_setup(f"no .safetensors file in {path}")
    tensors: dict[str, dict] = {}
    for f in files:
        with open(f, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            begin, end = meta["data_offsets"]
            tensors[name] = {"file": f, "start": 8 + length + begin, "bytes": end - begin,
                             "shape": meta["shape"]}
    return tensors


class Hasher:
    """XXH3-64 (seed 0) of byte ranges of the files, through libxxhash and mmap (no copies)."""

    def __init__(self, library: str | None):
        name = library if library and os.path.exists(library) else ctypes.util.find_library("xxhash")
        if not name:
            raise OSError(f"no libxxhash ({library or 'none given'}, none on the loader's path)")
        self.lib = ctypes.CDLL(name)
        self.name = name
        self.lib.XXH3_createState.restype = ctypes.c_void_p
        self.lib.XXH3_64bits_reset.argtypes = [ctypes.c_void_p]
        self.lib.XXH3_64bits_update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.XXH3_64bits_digest.argtypes = [ctypes.c_void_p]
        self.lib.XXH3_64bits_digest.restype = ctypes.c_uint64
        self.lib.XXH3_freeState.argtypes = [ctypes.c_void_p]
        self.maps: dict[str, tuple[mmap.mmap, int]] = {}

    def _base(self, path: str) -> int:
        if path not in self.maps:
            with open(path, "rb") as handle:
                # ACCESS_COPY: a private mapping ctypes can take the address of (a read-only
                # one exports no writable buffer); nothing is written, so nothing is copied.
                m = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            self.maps[path] = (m, ctypes.addressof(ctypes.c_char.from_buffer(m)))
        return self.maps[path][1]

    def runs(self, path: str, runs: list[tuple[int, int]]) -> str:
        """Hex digest of the concatenation of (offset, length) runs of @p path."""
        base = self._base(path)
        state = self.lib.XXH3_createState()
        try:
            self.lib.XXH3_64bits_reset(state)
            for offset, length in runs:
                if length:
                    self.lib.XXH3_64bits_update(state, base + offset, length)
            return f"{self.lib.XXH3_64bits_digest(state):016x}"
        finally:
            self.lib.XXH3_freeState(state)


def box_runs(meta: dict, shape: list[int], offset: list[int]) -> list[tuple[int, int]]:
    """(file offset, bytes) runs of the row-major box @p shape at @p offset of the tensor."""
    full = meta["shape"]
    count = math.prod(full)
    if count == 0 or math.prod(shape) == 0:
        return []
    element = meta["bytes"] // count
    if not full:
        return [(meta["start"], meta["bytes"])]
    # k: the last dim where the box is narrower than the tensor; dims after it are whole, so
    # each index over dims [0, k) gives one contiguous run.
    k = max([d for d in range(len(full)) if shape[d] != full[d]], default=0)
    strides = [math.prod(full[d + 1:]) * element for d in range(len(full))]
    run = shape[k] * strides[k]
    runs = []
    for index in itertools.product(*(range(offset[d], offset[d] + shape[d]) for d in range(k))):
        start = sum(i * strides[d] for d, i in enumerate(index)) + offset[k] * strides[k]
        runs.append((meta["start"] + start, run))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--xxhash", default=None)
    parser.add_argument("mode", choices=["host", "rows"])
    parser.add_argument("host_report")
    parser.add_argument("reports", nargs="*")
    args = parser.parse_args()
    files = checkpoint_tensors(args.checkpoint)
    try:
        host = json.load(open(args.host_report))["tensors"]
    except (OSError, ValueError, KeyError) as e:
        fail_setup(f"no host digests ({args.host_report}): {e}")
    try:
        hasher: Hasher | None = Hasher(args.xxhash)
    except OSError as e:
        hasher, why = None, str(e)

    bad: list[str] = []
    if args.mode == "host":
        missing = sorted(set(files) - set(host))
        extra = sorted(set(host) - set(files))
        bad += [f"{n}: in the files, not in the host report" for n in missing[:5]]
        bad += [f"{n}: in the host report, not in the files" for n in extra[:5]]
        how = "the tensor set"
        if hasher is not None:
            for name, meta in files.items():
                got = hasher.runs(meta["file"], [(meta["start"], meta["bytes"])])
                if name in host and host[name]["xxh3"] != got:
                    bad.append(f"{name}: host report {host[name]['xxh3']}, files {got}")
            how = f"every digest recomputed from the files ({hasher.name})"
        else:
            how += f" only (digests not recomputed: {why})"
        total = sum(m["bytes"] for m in files.values())
        print(f"digests: host report vs files: {len(files)} tensors, {total} B; {how}; "
              f"{len(bad)} differ")
    else:
        if not args.reports:
            fail_setup("no report to compare")
        covered = {name: 0 for name in files}
        whole = 0
        boxes = 0
        for path in args.reports:
            try:
                report = json.load(open(path))
            except (OSError, ValueError) as e:
                bad.append(f"{path}: unreadable: {e}")
                continue
            label = f"{os.path.basename(path)} (rank {report.get('rank', '?')})"
            if not report.get("tensors"):
                bad.append(f"{label}: no tensors")
            for name, entry in report.get("tensors", {}).items():
                meta = files.get(name)
                if meta is None:
                    bad.append(f"{label}: {name} is not in the files")
                    continue
                shape = entry.get("shape", meta["shape"])
                offset = entry.get("offset", [0] * len(shape))
                if list(shape) == list(meta["shape"]) and not any(offset):
                    whole += 1
                    covered[name] = -1  # whole on some rank: covered
                    if host.get(name, {}).get("xxh3") != entry.get("xxh3"):
                        bad.append(f"{label}: {name}: {entry.get('xxh3')}, host digest "
                                   f"{host.get(name, {}).get('xxh3')}")
                    continue
                boxes += 1
                if hasher is None:
                    bad.append(f"{label}: {name}: a shard, and its digest cannot be computed "
                               f"from the files: {why}")
                    continue
                if covered[name] >= 0:
                    covered[name] += math.prod(shape)
                want = hasher.runs(meta["file"], box_runs(meta, list(shape), list(offset)))
                if entry.get("xxh3") != want:
                    bad.append(f"{label}: {name} shard {shape} at {offset}: {entry.get('xxh3')}, "
                               f"files {want}")
        for name, meta in files.items():
            if covered[name] != -1 and covered[name] != math.prod(meta["shape"]):
                bad.append(f"{name}: covered by no rank whole, and its shards hold "
                           f"{covered[name]} of {math.prod(meta['shape'])} elements")
        print(f"digests: {len(args.reports)} report(s) vs the files: {whole} whole tensors "
              f"(against the host digests), {boxes} shards (recomputed from the files); "
              f"{len(files)} tensors covered; {len(bad)} differ")
    for line in bad[:10]:
        print(f"  MISMATCH {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
