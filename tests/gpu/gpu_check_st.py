"""A safetensors writer for tests/gpu/gpu_check.sh's Python rows that needs no numpy.

safetensors.torch.save_file converts each tensor through numpy (safetensors 0.8's
_to_ndarray), and neither torch nor the bundle brings numpy to a bare GPU host; reading
(safetensors.torch.load_file, the rows' reference) needs no numpy. Same format: an 8-byte
little-endian header length, the JSON header (padded with spaces to 8 bytes), the bytes.
"""
import ctypes
import json
import struct

import torch

_NAMES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
          torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def save_file(tensors, path, metadata=None):
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        t = tensor.detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        blobs.append(ctypes.string_at(t.data_ptr(), n) if n else b"")
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)
