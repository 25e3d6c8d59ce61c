#!/usr/bin/python3
"""Run the PyTorch reference on a model + batch file and write everything forja's parity tests
compare against: the initial adapter, step-0 loss and LoRA gradients, logits, and the losses and
gradient norms of N AdamW steps. See README.md for the contract.

    /usr/bin/python3 tests/reference/reference_run.py --model M --batch batch.json \
        --adapter none --out OUT [--steps 20 ...]
"""

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as M  # noqa: E402
import safetensors_io as st  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def load_batch(path: str, vocab_size: int):
    """JSON {"micro_batches": [{"input_ids", "labels", "position_ids"?, "segment_ids"?}, ...]}."""
    with open(path) as f:
        doc = json.load(f)
    mbs = doc.get("micro_batches") if isinstance(doc, dict) else None
    if not mbs:
        raise ValueError(f"{path}: expected an object with a non-empty 'micro_batches' list")
    out = []
    for n, raw in enumerate(mbs):
        mb = {}
        for key in ("input_ids", "labels", "position_ids", "segment_ids"):
            if raw.get(key) is not None:
                try:
                    mb[key] = torch.tensor(raw[key], dtype=torch.long)
                except (ValueError, TypeError) as e:
                    raise ValueError(f"{path}: micro_batches[{n}].{key} is not a rectangular integer array: {e}")
        for key in ("input_ids", "labels"):
            if key not in mb:
                raise ValueError(f"{path}: micro_batches[{n}] lacks {key!r}")
        try:
            M.validate_micro_batch(mb, vocab_size)
        except ValueError as e:
            raise ValueError(f"{path}: micro_batches[{n}]: {e}") from e
        out.append(mb)
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="directory with config.json + model.safetensors")
    ap.add_argument("--batch", required=True, help="batch JSON file")
    ap.add_argument("--adapter", default="none",
                    help="PEFT adapter dir to start from, or 'none' to initialise from --seed")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--steps", type=int, default=20, help="AdamW steps (0: only step-0 outputs)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--betas", default="0.9,0.999", help="beta1,beta2")
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="<= 0 disables clipping (norm still logged)")
    ap.add_argument("--schedule", choices=M.SCHEDULES, default="linear")
    ap.add_argument("--warmup", type=int, default=0, help="warm-up steps")
    ap.add_argument("--grad-accum", type=int, default=None,
                    help="micro-batches per optimizer step (default: all micro-batches in the file)")
    ap.add_argument("--lora-rank", type=int, default=None, help="default 8 (ignored values must match an --adapter)")
    ap.add_argument("--lora-alpha", type=float, default=None, help="default 16")
    ap.add_argument("--rslora", action="store_true", help="scale alpha/sqrt(r) instead of alpha/r")
    ap.add_argument("--lora-dropout", type=float, default=0.0,
                    help="parity runs with p > 0 need --dropout-rng hash")
    ap.add_argument("--dropout-rng", choices=["torch", "hash"], default="torch",
                    help="torch: torch.rand masks from seed + 1; hash: forja's masks, stream (seed, step, "
                         "micro-batch j of the step), and no dropout in the logits forward")
    ap.add_argument("--targets", default=None, help="comma list of q,k,v,o,gate,up,down (default all)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float64", help="compute dtype")
    ap.add_argument("--seed", type=int, default=0, help="seed of the LoRA init (with --adapter none) and dropout")
    ap.add_argument("--b-std", type=float, default=0.05, help="std of the non-zero random B init")
    ap.add_argument("--num-items", choices=[M.NUM_ITEMS_SHIFTED, M.NUM_ITEMS_UNSHIFTED], default=M.NUM_ITEMS_SHIFTED,
                    help="count shifted targets (forja's definition, default) or unshifted labels (HF Trainer)")
    ap.add_argument("--rope-angles", choices=["float32", "float64"], default="float32",
                    help="dtype of the RoPE angle computation (float32 = transformers)")
    a = ap.parse_args(argv)
    try:
        b = [float(x) for x in a.betas.split(",")]
        assert len(b) == 2
        a.betas = (b[0], b[1])
    except (ValueError, AssertionError):
        ap.error("--betas must be two comma-separated numbers, e.g. 0.9,0.999")
    if a.targets is not None:
        a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
        bad = [t for t in a.targets if t not in M.TARGETS]
        if bad or not a.targets:
            ap.error(f"--targets: unknown {bad}; choose from {','.join(M.TARGETS)}")
    if a.steps < 0:
        ap.error("--steps must be >= 0")
    return a


def build_lora(a, cfg, dtype):
    if a.adapter.lower() != "none":
        lora = M.LoRA.load_peft(a.adapter, cfg, dtype=dtype)
        # The adapter's own config is authoritative; explicit flags that contradict it are errors
        # (silently ignoring them would make a parity test compare different set-ups).
        clash = []
        if a.lora_rank is not None and a.lora_rank != lora.rank:
            clash.append(f"--lora-rank {a.lora_rank} vs r={lora.rank}")
        if a.lora_alpha is not None and a.lora_alpha != lora.alpha:
            clash.append(f"--lora-alpha {a.lora_alpha} vs lora_alpha={lora.alpha}")
        if a.rslora and not lora.use_rslora:
            clash.append("--rslora vs use_rslora=false")
        if a.targets is not None and [t for t in M.TARGETS if t in a.targets] != lora.targets:
            clash.append(f"--targets {a.targets} vs {lora.targets}")
        if clash:
            raise ValueError(f"{a.adapter}: flags contradict adapter_config.json: {'; '.join(clash)}")
        lora.dropout = a.lora_dropout
        return lora
    lora = M.LoRA(cfg, a.lora_rank or 8, 16.0 if a.lora_alpha is None else a.lora_alpha,
                  a.targets or list(M.TARGETS), use_rslora=a.rslora, dropout=a.lora_dropout, dtype=dtype)
    lora.init_random(a.seed, b_std=a.b_std)
    return lora


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def run(a):
    dtype = DTYPES[a.dtype]
    model = M.BaseModel.load(a.model, dtype=dtype, rope_angle_dtype=DTYPES[a.rope_angles])
    cfg = model.cfg
    mbs = load_batch(a.batch, cfg.vocab_size)
    G = a.grad_accum or len(mbs)
    if G <= 0:
        raise ValueError("--grad-accum must be >= 1")
    lora = build_lora(a, cfg, dtype)
    os.makedirs(a.out, exist_ok=True)
    lora.save_peft(os.path.join(a.out, "initial_adapter"))

    # Optimizer step s uses micro-batches (s*G + j) mod M, j = 0..G-1 (cycling through the file).
    def step_mbs(s):
        return [(s * G + j) % len(mbs) for j in range(G)]

    drop_gen = torch.Generator().manual_seed(a.seed + 1)
    hash_rng = a.dropout_rng == "hash"

    # Forward parity: fp32 logits of the first micro-batch with the initial adapter.
    with torch.no_grad():
        mb0 = mbs[0]
        logits = M.forward(model, mb0["input_ids"], mb0.get("position_ids"), mb0.get("segment_ids"), lora,
                           M.HashDropout(None) if hash_rng else torch.Generator().manual_seed(a.seed + 1))
    st.save_file({"logits": logits.float()}, os.path.join(a.out, "logits.safetensors"), dtype="F32")

    params = lora.parameters()
    opt = M.AdamW(params, lr=a.lr, betas=a.betas, eps=a.eps, weight_decay=a.weight_decay)
    losses, norms, lrs, items, schedule_mbs = [], [], [], [], []
    n_steps = max(1, a.steps)  # step 0's loss/grads are produced even with --steps 0
    for s in range(n_steps):
        idx = step_mbs(s)
        batch = [mbs[i] for i in idx]
        num_items = M.count_num_items([mb["labels"] for mb in batch], a.num_items)
        for p in params:
            p.grad = None
        total = 0.0
        parts = []
        for j, mb in enumerate(batch):  # true accumulation: one backward per micro-batch, grads add up
            gen = M.HashDropout(M.dropout_stream(a.seed, s, j)) if hash_rng else drop_gen
            logits = M.forward(model, mb["input_ids"], mb.get("position_ids"), mb.get("segment_ids"), lora, gen)
            l = M.loss_sum(logits, mb["labels"]) / num_items
            l.backward()
            parts.append(float(l.detach()))
            total += parts[-1]
        if not math.isfinite(total):
            raise FloatingPointError(f"non-finite loss at step {s}")
        if s == 0:
            write_json(os.path.join(a.out, "step0_loss.json"), {
                "loss": total, "num_items": num_items, "num_items_mode": a.num_items,
                "micro_batches": idx, "micro_batch_losses": parts})
            grads = {k: g.float() for k, g in lora.grads_state_dict().items()}
            st.save_file(grads, os.path.join(a.out, "step0_grads.safetensors"), dtype="F32")
        if a.steps == 0:
            break
        norm = M.clip_grad_norm(params, a.max_grad_norm if a.max_grad_norm > 0 else None)
        lr = a.lr * M.lr_multiplier(a.schedule, s, a.warmup, a.steps)
        opt.step(lr)
        losses.append(total)
        norms.append(norm)
        lrs.append(lr)
        items.append(num_items)
        schedule_mbs.append(idx)

    if a.steps > 0:
        write_json(os.path.join(a.out, "losses.json"),
                   {"losses": losses, "lr": lrs, "num_items": items, "micro_batches": schedule_mbs})
        write_json(os.path.join(a.out, "grad_norms.json"), {"grad_norms": norms, "max_grad_norm": a.max_grad_norm})
        lora.save_peft(os.path.join(a.out, "final_adapter"))

    write_json(os.path.join(a.out, "run.json"), {
        "model": os.path.abspath(a.model), "batch": os.path.abspath(a.batch), "adapter": a.adapter,
        "model_type": cfg.model_type, "dtype": a.dtype, "rope_angles": a.rope_angles,
        "steps": a.steps, "lr": a.lr, "weight_decay": a.weight_decay, "betas": list(a.betas), "eps": a.eps,
        "max_grad_norm": a.max_grad_norm, "schedule": a.schedule, "warmup": a.warmup, "grad_accum": G,
        "num_micro_batches": len(mbs), "num_items_mode": a.num_items,
        "lora_rank": lora.rank, "lora_alpha": lora.alpha, "use_rslora": lora.use_rslora, "lora_scale": lora.scale,
        "lora_dropout": lora.dropout, "dropout_rng": a.dropout_rng, "targets": lora.targets, "seed": a.seed,
        "b_std": a.b_std,
    })
    msg = f"step0 loss {losses[0] if losses else total:.8f}"
    if losses:
        msg += f", step {len(losses) - 1} loss {losses[-1]:.8f}"
    print(f"reference_run: {cfg.model_type}, {len(lora.keys())} LoRA modules, {msg}; wrote {a.out}")


def main(argv=None):
    a = parse_args(argv)
    try:
        run(a)
    except (ValueError, FileNotFoundError, NotImplementedError, FloatingPointError) as e:
        print(f"reference_run: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
