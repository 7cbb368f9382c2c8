"""Builds a transformers model from a checkpoint directory's config.json without allocating
its weights twice, loads them with weightcast, and runs one forward pass.

    python examples/load_hf_model.py CHECKPOINT_DIR [--dtype bfloat16] [--device cpu|cuda]

The model is built on the meta device (no memory), given empty storage with `to_empty`, and
`weightcast.load_into` writes every parameter and buffer in place, casting the checkpoint's
dtype to the model's where they differ (e.g. a BF16 checkpoint into FP32 master weights).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import weightcast


def rebuild_transient_buffers(model: torch.nn.Module) -> None:
    """Non-persistent buffers (a rotary embedding's inv_freq) are in no checkpoint, and
    to_empty left them uninitialised: rebuild each such module from its config."""
    for module in model.modules():
        persistent = set(module.state_dict(keep_vars=True))
        transient = [n for n, _ in module.named_buffers(recurse=False) if n not in persistent]
        if transient and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name in transient:
                getattr(module, name).copy_(getattr(fresh, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a directory written by save_pretrained")
    parser.add_argument("--dtype", default="float32", help="the parameters' dtype")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    config = AutoConfig.from_pretrained(args.checkpoint)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=getattr(torch, args.dtype))
    model.to_empty(device=args.device)
    rebuild_transient_buffers(model)

    start = time.perf_counter()
    report = weightcast.load_into(model, args.checkpoint)
    seconds = time.perf_counter() - start
    print(f"loaded {len(report.loaded_keys)} tensors, {report.bytes / 2**20:.1f} MiB in "
          f"{seconds:.3f} s ({len(report.cast_keys)} cast to {args.dtype}); "
          f"missing {report.missing_keys}, unexpected {report.unexpected_keys}")

    model.eval()
    with torch.no_grad():
        ids = torch.arange(8, device=args.device).unsqueeze(0) % config.vocab_size
        logits = model(ids).logits
    print(f"forward pass: logits {tuple(logits.shape)}, finite: {bool(torch.isfinite(logits).all())}")


if __name__ == "__main__":
    main()
