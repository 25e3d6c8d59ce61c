#!/usr/bin/python3
"""Generate the standard parity cases for forja's training-engine tests in one command.

Each case is a directory  OUT/<case>/  holding
    model/        config.json + model.safetensors  (make_model.py)
    batch.json    the micro-batches                 (make_batch.py)
    ref/          reference_run.py outputs (initial_adapter/, step0_loss.json, step0_grads.safetensors,
                  logits.safetensors, losses.json, grad_norms.json, final_adapter/, run.json)
    case.json     the exact argument lists used, so the C++ test can run forja with the same settings

    /usr/bin/python3 tests/reference/parity_cases.py --out /tmp/parity [--cases a,b] [--steps 20]

The cases together cover every family, tied and untied heads, F32 and BF16 files, Qwen2 biases,
llama3 RoPE scaling with all three frequency bands, Llama attention biases, GQA with n_rep > 1
and several KV heads, packing with padding, accumulation over micro-batches, rsLoRA, a subset of
targets, each schedule with warm-up, weight decay and active clipping, and LoRA dropout with
forja's counter-based masks (qwen3-dropout).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_batch as MB  # noqa: E402
import make_model as MM  # noqa: E402
import reference_run as RR  # noqa: E402

# name -> (make_model args, make_batch kwargs, reference_run args)
CASES = {
    "qwen3-tied": (
        ["--family", "qwen3", "--seed", "1", "--tied"],
        dict(micro_batches=2, batch_size=2, seq_len=11, seed=1),
        ["--schedule", "cosine", "--warmup", "2"],
    ),
    "qwen3-gqa-bf16": (
        ["--family", "qwen3", "--seed", "2", "--dtype", "BF16", "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
         "--hidden", "64", "--intermediate", "72", "--vocab", "131", "--layers", "3"],
        dict(micro_batches=3, batch_size=1, seq_len=13, seed=2),
        ["--schedule", "linear", "--warmup", "1", "--grad-accum", "2", "--weight-decay", "0.01"],
    ),
    "qwen2-packed": (
        ["--family", "qwen2", "--seed", "3"],
        dict(micro_batches=2, batch_size=2, seq_len=16, seed=3, pack=True, docs=2),
        ["--schedule", "constant", "--warmup", "3", "--rslora", "--lora-rank", "4", "--lora-alpha", "8"],
    ),
    "llama3-rope-bias": (
        ["--family", "llama", "--seed", "4", "--tied", "--write-lm-head", "--attention-bias", "--llama3-scaling",
         "--rope-theta", "10000", "--rope-factor", "8", "--rope-original-max", "64"],
        dict(micro_batches=2, batch_size=2, seq_len=12, seed=4, pack=True, docs=3),
        ["--schedule", "cosine", "--warmup", "0", "--max-grad-norm", "0.3"],
    ),
    "mistral-subset": (
        ["--family", "mistral", "--seed", "5", "--kv-heads", "3", "--vocab", "89"],
        dict(micro_batches=1, batch_size=3, seq_len=10, seed=5),
        ["--schedule", "linear", "--targets", "q,v,down", "--lora-rank", "6", "--lora-alpha", "12"],
    ),
    # LoRA dropout with forja's hash masks (a new mask per step and micro-batch)
    "qwen3-dropout": (
        ["--family", "qwen3", "--seed", "6", "--intermediate", "88"],
        dict(micro_batches=2, batch_size=2, seq_len=12, seed=6),
        ["--schedule", "linear", "--warmup", "1", "--grad-accum", "2", "--lora-dropout", "0.1",
         "--dropout-rng", "hash", "--seed", "7"],
    ),
}


def vocab_of(model_args):
    return int(model_args[model_args.index("--vocab") + 1]) if "--vocab" in model_args else 97


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list from {','.join(CASES)}")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    a = ap.parse_args(argv)
    names = [c for c in a.cases.split(",") if c]
    bad = [c for c in names if c not in CASES]
    if bad:
        ap.error(f"unknown cases {bad}")
    for name in names:
        margs, bkw, rargs = CASES[name]
        d = os.path.join(a.out, name)
        mdir, bpath, rdir = os.path.join(d, "model"), os.path.join(d, "batch.json"), os.path.join(d, "ref")
        MM.main(margs + ["--out", mdir])
        os.makedirs(d, exist_ok=True)
        with open(bpath, "w") as f:
            json.dump(MB.make_batch(vocab_of(margs), **bkw), f)
            f.write("\n")
        full = ["--model", mdir, "--batch", bpath, "--adapter", "none", "--out", rdir,
                "--steps", str(a.steps), "--dtype", a.dtype, "--lr", "1e-3"] + rargs
        if RR.main(full) != 0:
            return 1
        with open(os.path.join(d, "case.json"), "w") as f:
            json.dump({"make_model": margs, "make_batch": bkw, "reference_run": full}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
