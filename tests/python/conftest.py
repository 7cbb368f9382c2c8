"""Shared helpers for the Python package's tests."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

# The real-file corpus lives beside the source tree (../shared/corpus), never inside it.
CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"


def corpus_or_skip(sub: str = "") -> Path:
    path = CORPUS / sub
    if not path.exists():
        pytest.skip(f"the corpus is missing: {path} (tests read it as ../shared/corpus)")
    return path


def write_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> Path:
    """Writes a safetensors file by hand: tensors maps name -> (dtype, shape, raw bytes), in
    file order; the header is space-padded to 8 bytes as the reference writer does."""
    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)
    return path


def raw_bytes(t) -> bytes:
    """A tensor's bytes, whatever its dtype (NaN-safe comparison)."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.element_size() == 1:
        return bytes(t.view(torch.uint8).reshape(-1).numpy().tobytes())
    return bytes(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def assert_same(a: dict, b: dict) -> None:
    """Same keys, dtypes, shapes and bytes."""
    assert list(a) == list(b) or set(a) == set(b)
    for k in b:
        assert a[k].dtype == b[k].dtype, k
        assert tuple(a[k].shape) == tuple(b[k].shape), k
        assert raw_bytes(a[k]) == raw_bytes(b[k]), k
