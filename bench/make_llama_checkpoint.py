#!/usr/bin/env python3
"""Write a transformers `save_pretrained` checkpoint of a Llama with random weights.

The model is built from a hand-made LlamaConfig (no download, HF_HUB_OFFLINE=1) and saved in
BF16 as sharded safetensors plus model.safetensors.index.json, the layout a trainer meets on
the Hub. Weights come from transformers' own initialisation under a fixed torch seed, so the
same --seed and torch version give the same bytes.

Sizes (untied embeddings, vocab 32000: not divisible by 3, so Shard(0) over 3 ranks is uneven):
  default  hidden 2048, 16 layers, GQA 16/4 heads, MLP 5632: 0.85 B params, 1.71 GB (1.59 GiB)
  --small  hidden  512,  8 layers, GQA  8/2 heads, MLP 1376: 55 M params, 110 MB
Both are split into --shards (default 4) files of roughly equal size.

Usage: make_llama_checkpoint.py OUT_DIR [--small] [--seed 0] [--shards 4]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SIZES = {
    "full": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=4),
    "small": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=2),
}


def make_config(size: str):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, torch_dtype="bfloat16", **SIZES[size])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory to write (created; must be empty or absent)")
    ap.add_argument("--small", action="store_true", help="~110 MB instead of ~1.7 GB")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()

    if args.out.exists() and any(args.out.iterdir()):
        print(f"make_llama_checkpoint: {args.out} exists and is not empty", file=sys.stderr)
        return 73  # EX_CANTCREAT
    import torch
    from transformers import LlamaForCausalLM

    config = make_config("small" if args.small else "full")
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    # Built directly in BF16 so the host holds one copy of the weights (1.7 GB), not an FP32 one.
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    nbytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    # save_pretrained splits at max_shard_size (decimal units); a little over 1/N of the model
    # gives N files, since a shard closes on the tensor that would pass the limit.
    shard = max(1, nbytes // args.shards + nbytes // (8 * args.shards))
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size=shard)
    files = sorted(p.name for p in args.out.glob("*.safetensors"))
    index = args.out / "model.safetensors.index.json"
    print(json.dumps({"dir": str(args.out), "params": sum(p.numel() for p in model.parameters()),
                      "tensor_bytes": nbytes, "files": files, "index": index.exists(),
                      "seed": args.seed, "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
