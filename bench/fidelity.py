"""Issue 14.4: per-step training loss of forja against transformers + PEFT at a real shape.

Runs on the device machine (torch with CUDA, transformers, peft, safetensors); bench/fidelity.sh
drives it and forja. Three subcommands, so that forja runs between them on the same files:

  make    DIR     a random Qwen3 checkpoint of a named shape (HF initialisation: normal(0, 0.02)
                  linears and embedding, RMSNorm weights 1), written by save_pretrained in bf16,
                  and DIR/ids.jsonl: STEPS random token sequences of SEQ ids ({"input_ids": [...]})
  peft    DIR ADAPTER OUT.json   STEPS optimizer steps of PEFT LoRA from the adapter directory
                  ADAPTER (forja random-adapter wrote it, so both start from the same factors),
                  one sequence per step in file order, fp32 base weights (the reference), AdamW
                  and clipping as docs/formats.md §6, constant learning rate: the loss of each
                  step's forward, in a JSON list
  compare PEFT.json FORJA_METRICS.jsonl...   per-step relative difference; exit 1 beyond --tol

The loss is transformers' mean over the shifted targets, as forja's (docs/formats.md §6.1:
forja labels the first token -100 and counts the shifted targets; the same terms).
"""
import argparse
import json
import random
import sys

SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                        num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128),
}
VOCAB = 151936


def make(a):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(a.seed)
    cfg = Qwen3Config(vocab_size=VOCAB, rope_theta=1e6, max_position_embeddings=40960,
                      tie_word_embeddings=True, **SHAPES[a.shape])
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.dir, safe_serialization=True)
    rng = random.Random(a.seed)
    with open(f"{a.dir}/ids.jsonl", "w") as f:
        for _ in range(a.steps):
            f.write(json.dumps({"input_ids": [rng.randrange(VOCAB) for _ in range(a.seq)]}) + "\n")


def peft(a):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32).cuda()
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    model = PeftModel.from_pretrained(model, a.adapter, is_trainable=True)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    rows = [json.loads(line)["input_ids"] for line in open(f"{a.dir}/ids.jsonl")]
    losses, norms = [], []
    for step in range(a.steps):
        ids = torch.tensor([rows[step % len(rows)]], device="cuda")
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        print(f"peft step {step + 1} loss {losses[-1]:.6f} norm {norms[-1]:.6f}", flush=True)
    json.dump({"loss": losses, "grad_norm": norms}, open(a.out, "w"))


def compare(a):
    ref = json.load(open(a.peft))["loss"]
    worst_all = 0.0
    for path in a.forja:
        rows = [json.loads(line) for line in open(path)]
        got = [r["loss"] for r in rows if "loss" in r]  # training rows (eval rows carry eval_loss)
        n = min(len(got), len(ref))
        if n < len(ref):
            print(f"{path}: {len(got)} losses, the reference has {len(ref)}")
        worst = 0.0
        for i in range(n):
            rel = abs(got[i] - ref[i]) / abs(ref[i])
            worst = max(worst, rel)
            print(f"{path} step {i + 1}: forja {got[i]:.6f} peft {ref[i]:.6f} rel {rel:.2e}")
        print(f"{path}: worst relative difference {worst:.2e} over {n} steps (tolerance {a.tol:g})")
        worst_all = max(worst_all, worst if n == len(ref) else float("inf"))
    sys.exit(0 if worst_all <= a.tol else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--shape", default="qwen3-4b", choices=sorted(SHAPES))
    m.add_argument("--seq", type=int, default=2048)
    m.add_argument("--steps", type=int, default=20)
    m.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("peft")
    e.add_argument("dir")
    e.add_argument("adapter")
    e.add_argument("out")
    e.add_argument("--steps", type=int, default=20)
    e.add_argument("--lr", type=float, default=1e-4)
    e.add_argument("--weight-decay", type=float, default=0.0)
    e.add_argument("--max-grad-norm", type=float, default=1.0)
    c = sub.add_parser("compare")
    c.add_argument("peft")
    c.add_argument("forja", nargs="+")
    c.add_argument("--tol", type=float, default=1e-2)
    a = p.parse_args()
    {"make": make, "peft": peft, "compare": compare}[a.cmd](a)


if __name__ == "__main__":
    main()
