"""Checks a merged model written by `forja merge` against its base model and PEFT adapter, with
this folder's own safetensors reader and float64 torch arithmetic (no forja code involved).

    /usr/bin/python3 tests/reference/merge_check.py --model BASE --adapter ADAPTER --merged OUT

For every adapted projection: merged == round(W + scale * B @ A) in the merged tensor's dtype,
where W is the base tensor widened exactly, the product is float64 and scale is lora_alpha / r
(alpha / sqrt(r) with use_rslora); allowed: 1 ulp (float64 -> float32 -> bfloat16 rounds twice
here, forja rounds once). Every other tensor must equal the base tensor bit for bit (same dtype
assumed: run forja with --dtype auto). config.json must equal the base's but for torch_dtype.
Prints the numbers and PASS or FAIL; exit status 0 / 1 (2 on unusable input).
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402
from model import load_checkpoint  # noqa: E402


def files_dtypes(model_dir):
    """name -> stored dtype string, across a single file or shards."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return st.load_dtypes(single)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        index = json.load(f)
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        dts = st.load_dtypes(os.path.join(model_dir, shard))
        for name in dts:
            if index["weight_map"].get(name) != shard:
                raise SystemExit(f"FAIL: index places {name} in {index['weight_map'].get(name)}, found in {shard}")
        out.update(dts)
    if set(out) != set(index["weight_map"]):
        raise SystemExit("FAIL: index weight_map and the shards hold different tensors")
    total = sum(int(np.prod(st.read_header(os.path.join(model_dir, s))[0][n]["shape"] or [1])) *
                {"F32": 4, "F16": 2, "BF16": 2}[d]
                for s in set(index["weight_map"].values())
                for n, d in st.load_dtypes(os.path.join(model_dir, s)).items())
    if index["metadata"]["total_size"] != total:
        raise SystemExit(f"FAIL: index total_size {index['metadata']['total_size']} != {total}")
    return out


def ordered_bits(x: torch.Tensor, dtype: str) -> np.ndarray:
    """Bit patterns of float32 values (holding `dtype` values) mapped to ordered integers."""
    bits = x.contiguous().numpy().view(np.uint32).astype(np.int64)
    if dtype in ("BF16",):
        bits >>= 16
        sign = 1 << 15
    elif dtype == "F16":
        bits = x.to(torch.float16).numpy().view(np.uint16).astype(np.int64)
        sign = 1 << 15
    else:
        sign = 1 << 31
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def round_to(x64: torch.Tensor, dtype: str) -> torch.Tensor:
    """float64 -> the stored dtype, returned as float32 (as the reader returns BF16)."""
    if dtype == "BF16":
        return torch.from_numpy(st.bf16_bits_to_f32(st.f32_to_bf16_bits(x64.to(torch.float32).numpy())))
    if dtype == "F16":
        return x64.to(torch.float16)
    return x64.to(torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--merged", required=True)
    args = ap.parse_args()

    with open(os.path.join(args.adapter, "adapter_config.json")) as f:
        acfg = json.load(f)
    r, alpha = acfg["r"], acfg["lora_alpha"]
    scale = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    lora = st.load_file(os.path.join(args.adapter, "adapter_model.safetensors"))
    base = load_checkpoint(args.model)
    base_dtypes = files_dtypes(args.model)
    merged = load_checkpoint(args.merged)
    merged_dtypes = files_dtypes(args.merged)
    failures = []
    if set(base) != set(merged):
        failures.append(f"tensor names differ: {sorted(set(base) ^ set(merged))}")

    prefix = "base_model.model."
    targets = {}
    for key in lora:
        if key.endswith(".lora_A.weight"):
            module = key[len(prefix):-len(".lora_A.weight")]
            targets[module + ".weight"] = (lora[key], lora[key.replace("lora_A", "lora_B")])

    worst_ulps, inexact, elements, max_rel = 0, 0, 0, 0.0
    for name, (a, b) in sorted(targets.items()):
        dtype = merged_dtypes[name]
        want64 = base[name].to(torch.float64) + scale * (b.to(torch.float64) @ a.to(torch.float64))
        got = merged[name]
        ulps = np.abs(ordered_bits(got.to(torch.float32), dtype) -
                      ordered_bits(round_to(want64, dtype).to(torch.float32), dtype))
        worst_ulps = max(worst_ulps, int(ulps.max()))
        inexact += int((ulps != 0).sum())
        elements += ulps.size
        rel = ((got.to(torch.float64) - want64).abs().max() / want64.abs().max()).item()
        max_rel = max(max_rel, rel)
        if ulps.max() > 1:
            failures.append(f"{name}: {int(ulps.max())} ulps from round(W + scale*B@A)")
    if not targets:
        failures.append("the adapter has no lora_A/lora_B tensors")

    copied = 0
    for name in sorted(set(base) & set(merged)):
        if name in targets:
            continue
        copied += 1
        if base_dtypes[name] != merged_dtypes[name]:
            failures.append(f"{name}: dtype {base_dtypes[name]} became {merged_dtypes[name]}")
        elif not torch.equal(base[name], merged[name]):
            failures.append(f"{name}: not bit-exact")

    with open(os.path.join(args.model, "config.json")) as f:
        cfg_base = json.load(f)
    with open(os.path.join(args.merged, "config.json")) as f:
        cfg_merged = json.load(f)
    names = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}
    want_dtype = names[merged_dtypes[next(iter(sorted(targets)))]] if targets else None
    if cfg_merged.get("torch_dtype") != want_dtype:
        failures.append(f"config.json torch_dtype {cfg_merged.get('torch_dtype')} != {want_dtype}")
    cfg_base["torch_dtype"] = cfg_merged.get("torch_dtype")
    if cfg_base != cfg_merged:
        failures.append("config.json differs from the base's beyond torch_dtype")

    print(f"merged tensors {len(targets)} ({elements} elements, scale {scale:g}): max {worst_ulps} ulp, "
          f"{inexact} off by one ulp, max rel error vs float64 {max_rel:.3g}; copied {copied} bit-exact")
    for f in failures:
        print("  " + f)
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
