#!/usr/bin/python3
"""Compare forja's outputs with the reference's and report relative errors (exit 1 on failure).

    /usr/bin/python3 tests/reference/compare.py \
        [--grads REF.safetensors GOT.safetensors] [--logits REF.safetensors GOT.safetensors] \
        [--losses REF.json GOT.json] [--rtol 1e-4] [--loss-rtol 1e-4] [--mask-padding batch.json]

Metric, per tensor: max|got - ref| / max|ref| (a norm-wise relative error, so that entries that
happen to be near zero do not dominate). Losses: |got - ref| / |ref| per step. Loss files may be
{"losses": [...]}, {"loss": x} (step0_loss.json) or a bare list. Tensor files must hold exactly
the same keys and shapes. --mask-padding zeroes logits at segment-0 positions of micro-batch 0
in both files before comparing (padding rows are convention-dependent).
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    den = float(ref.abs().max()) if ref.numel() else 0.0
    num = float((got - ref).abs().max()) if ref.numel() else 0.0
    if not torch.isfinite(got).all():
        return float("inf")
    return num / den if den > 0 else num


def load_losses(path):
    with open(path) as f:
        d = json.load(f)
    if isinstance(d, list):
        return [float(x) for x in d]
    if "losses" in d:
        return [float(x) for x in d["losses"]]
    if "loss" in d:
        return [float(d["loss"])]
    raise ValueError(f"{path}: no 'losses' or 'loss'")


def compare_tensors(kind, ref_path, got_path, rtol, mask=None):
    ref, got = st.load_file(ref_path), st.load_file(got_path)
    ok = True
    if set(ref) != set(got):
        print(f"FAIL {kind}: keys differ; only in ref: {sorted(set(ref) - set(got))[:5]}, "
              f"only in got: {sorted(set(got) - set(ref))[:5]}")
        return False
    worst = 0.0
    for k in sorted(ref):
        if ref[k].shape != got[k].shape:
            print(f"FAIL {kind} {k}: shape {tuple(got[k].shape)} != {tuple(ref[k].shape)}")
            ok = False
            continue
        r, g = ref[k], got[k]
        if mask is not None:
            r, g = r * mask, g * mask
        e = rel_err(g, r)
        worst = max(worst, e)
        if e > rtol:
            print(f"FAIL {kind} {k}: rel err {e:.3e} > {rtol:g}")
            ok = False
    print(f"{'PASS' if ok else 'FAIL'} {kind}: {len(ref)} tensors, worst rel err {worst:.3e} (rtol {rtol:g})")
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grads", nargs=2, metavar=("REF", "GOT"))
    ap.add_argument("--logits", nargs=2, metavar=("REF", "GOT"))
    ap.add_argument("--losses", nargs=2, metavar=("REF", "GOT"))
    ap.add_argument("--rtol", type=float, default=1e-4, help="tensor tolerance")
    ap.add_argument("--loss-rtol", type=float, default=1e-4)
    ap.add_argument("--mask-padding", metavar="BATCH_JSON", help="ignore segment-0 logits of micro-batch 0")
    a = ap.parse_args(argv)
    if not (a.grads or a.logits or a.losses):
        ap.error("nothing to compare")
    ok = True
    if a.grads:
        ok &= compare_tensors("grads", *a.grads, a.rtol)
    if a.logits:
        mask = None
        if a.mask_padding:
            with open(a.mask_padding) as f:
                seg = json.load(f)["micro_batches"][0].get("segment_ids")
            if seg is not None:
                mask = (torch.tensor(seg) != 0).double()[..., None]
        ok &= compare_tensors("logits", *a.logits, a.rtol, mask)
    if a.losses:
        ref, got = load_losses(a.losses[0]), load_losses(a.losses[1])
        if len(ref) != len(got):
            print(f"FAIL losses: {len(got)} steps vs {len(ref)} in the reference")
            ok = False
        else:
            errs = [abs(g - r) / abs(r) for r, g in zip(ref, got)]
            worst = max(errs)
            bad = [i for i, e in enumerate(errs) if not e <= a.loss_rtol]
            for i in bad[:5]:
                print(f"FAIL losses step {i}: got {got[i]:.9g}, ref {ref[i]:.9g}, rel err {errs[i]:.3e}")
            ok &= not bad
            print(f"{'PASS' if not bad else 'FAIL'} losses: {len(ref)} steps, worst rel err {worst:.3e} "
                  f"(rtol {a.loss_rtol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
