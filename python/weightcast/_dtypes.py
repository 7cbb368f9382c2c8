"""The safetensors dtypes and the torch dtypes they load as."""

from __future__ import annotations

from typing import Any

from ._errors import INVALID_CHECKPOINT, Error

# safetensors dtype -> torch attribute name. As `safetensors.torch.load_file` (0.8) maps them:
# F8_E8M0 is torch.float8_e8m0fnu and F4 is torch.float4_e2m1fn_x2 (two elements per byte,
# the last dimension halved). F6_E2M3 / F6_E3M2 have no torch dtype (load_file refuses them).
TORCH_DTYPE_NAMES: dict[str, str | None] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",
    "F6_E2M3": None,
    "F6_E3M2": None,
}

# Exported by the extension as uint8 of the same bytes, viewed here (see dlpack_export.cpp).
_VIEWED = {"F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4"}


def torch_dtype(st_dtype: str) -> Any:
    """The torch dtype a safetensors dtype loads as, or None where this torch has none."""
    import torch

    name = TORCH_DTYPE_NAMES.get(st_dtype)
    return getattr(torch, name, None) if name else None


def check_representable(meta: dict, unsupported_dtypes: str) -> None:
    """Raises ``Error`` (65) before any byte is read when torch cannot hold tensor ``meta``."""
    dtype = meta["dtype"]
    if unsupported_dtypes == "bytes":
        return
    if torch_dtype(dtype) is None:
        import torch

        raise Error(
            f"tensor '{meta['name']}': dtype {dtype} has no torch dtype (torch {torch.__version__}"
            f"{'' if TORCH_DTYPE_NAMES.get(dtype) is None else ' lacks torch.' + TORCH_DTYPE_NAMES[dtype]}"
            "); pass unsupported_dtypes='bytes' for its raw bytes as a 1-D uint8 tensor",
            INVALID_CHECKPOINT,
        )
    shape = meta["shape"]
    if dtype == "F4" and (len(shape) == 0 or shape[-1] % 2 != 0):
        raise Error(
            f"tensor '{meta['name']}': F4 shape {list(shape)} has an odd last dimension; "
            "torch's float4_e2m1fn_x2 packs two elements per byte; pass "
            "unsupported_dtypes='bytes' for its raw bytes",
            INVALID_CHECKPOINT,
        )


def check_shape(meta: dict, shards: list[str]) -> None:
    """Raises ``Error`` (65) before any byte is read for a shape torch cannot hold: a
    dimension of 2**63 or more (torch sizes are int64; ``load_file`` refuses it too)."""
    for d, size in enumerate(meta["shape"]):
        if size >= 2**63:
            raise Error(f"{shards[meta['shard']]}: tensor '{meta['name']}': shape {list(meta['shape'])}: dimension {d} "
                        f"is {size}, more than torch's largest size (2**63 - 1)",
                        INVALID_CHECKPOINT)


def as_torch(tensor: Any, st_dtype: str, shape: tuple) -> Any:
    """Views the extension's export of a tensor as its torch dtype and shape (no copy)."""
    raw = st_dtype in _VIEWED and (torch_dtype(st_dtype) is None or (
        st_dtype == "F4" and (len(shape) == 0 or shape[-1] % 2)))
    if raw:
        return tensor.reshape(-1)  # raw bytes (unsupported_dtypes='bytes')
    if st_dtype in _VIEWED:
        tensor = tensor.view(torch_dtype(st_dtype))
    if st_dtype in TORCH_DTYPE_NAMES and TORCH_DTYPE_NAMES[st_dtype] is None:
        return tensor  # F6: raw bytes
    want = tuple(shape[:-1]) + (shape[-1] // 2,) if st_dtype == "F4" else tuple(shape)
    if tensor.dim() != len(want):  # exported flat (more dimensions than DLPack carries here)
        tensor = tensor.view(want)
    return tensor
