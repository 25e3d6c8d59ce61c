#!/usr/bin/env python3
"""Adapter interoperability between forja and Hugging Face transformers + PEFT (run by
run_interop.sh on a machine with torch, transformers, peft and safetensors).

    interop.py make-model   --family qwen3|llama --out DIR [--size tiny|qwen3-0.6b]
                                                                  random model in HF layout
                                                                  (+ forja's tiny tokenizer, data.jsonl)
    interop.py peft-adapter --model DIR --out DIR [--seed S]      adapter saved by PEFT, B != 0
    interop.py compare      --model DIR [--adapter DIR] --logits FORJA.safetensors [--eval-json J]
                            --data DIR/data.jsonl --name TEXT     forja's logits (and eval loss) vs
                                                                  transformers (+ PeftModel)

compare prints one line "PASS|FAIL name: max rel diff logits X (loss Y)" and exits 1 on FAIL.
The metric is max|forja - hf| / max|hf| over the whole logits tensor; the tolerance 1e-3.
Everything runs on the CPU in float32 (no TF32), so the reference is exact fp32.
"""

import argparse
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "generate"))
TOL = 1e-3


def make_model(a):
    import transformers
    from make_cases import write_tokenizer  # the tiny byte-level BPE tokenizer of forja's tests

    os.makedirs(a.out, exist_ok=True)
    vocab = write_tokenizer(a.out)
    if a.size == "tiny":
        dims = dict(hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, initializer_range=0.1)
    else:  # the body of Qwen3-0.6B (for timing forja generate; the vocabulary stays tiny)
        dims = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=128, initializer_range=0.02)
    common = dict(vocab_size=vocab, max_position_embeddings=40960 if a.size != "tiny" else 512, rms_norm_eps=1e-6,
                  bos_token_id=vocab - 3, eos_token_id=vocab - 1, **dims)
    if a.family == "qwen3":
        cfg = transformers.Qwen3Config(tie_word_embeddings=False, **common)
        cls = transformers.Qwen3ForCausalLM
    else:
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, attention_bias=True, **common)
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(a.seed)
    model = cls(cfg).float()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))  # never the all-ones init
            elif n.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(a.out)  # safetensors
    g = torch.Generator().manual_seed(a.seed)
    with open(os.path.join(a.out, "data.jsonl"), "w") as f:
        for n in (29, 7, 16):
            ids = torch.randint(0, vocab, (n,), generator=g).tolist()
            f.write(json.dumps({"input_ids": ids, "labels": [-100, -100] + ids[2:]}) + "\n")
    print(f"wrote {a.out}: {a.family}, vocab {vocab}, transformers {transformers.__version__}")


def load_hf(model_dir, adapter):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                              attn_implementation="eager")
    if adapter:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter)
    return model.eval()


def peft_adapter(a):
    import peft

    model = load_hf(a.model, None)
    torch.manual_seed(a.seed)
    cfg = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = peft.get_peft_model(model, cfg)
    model.save_pretrained(a.out)
    print(f"wrote {a.out}: PEFT {peft.__version__} adapter, B random (init_lora_weights=False)")


def compare(a):
    from safetensors.torch import load_file

    torch.backends.cuda.matmul.allow_tf32 = False
    dumped = load_file(a.logits)
    ids = dumped["input_ids"].round().long()
    forja_logits = dumped["logits"].double()
    model = load_hf(a.model, a.adapter)
    with torch.no_grad():
        hf = model(input_ids=ids[None]).logits[0].double()
    rel = float((forja_logits - hf).abs().max() / hf.abs().max())
    ok = rel < TOL and forja_logits.shape == hf.shape
    msg = f"max rel diff logits {rel:.2e}"
    if a.eval_json:
        with open(a.eval_json) as f:
            forja_loss = json.load(f)["loss"]
        total, count = 0.0, 0
        with open(a.data) as f, torch.no_grad():
            for line in f:
                ex = json.loads(line)
                x = torch.tensor([ex["input_ids"]])
                labels = torch.tensor(ex["labels"])
                logits = model(input_ids=x).logits[0].double()
                tgt = labels[1:]
                keep = tgt != -100
                lp = torch.log_softmax(logits[:-1], dim=-1)
                total += float(-lp[keep].gather(1, tgt[keep][:, None]).sum())
                count += int(keep.sum())
        hf_loss = total / count
        loss_rel = abs(forja_loss - hf_loss) / abs(hf_loss)
        ok = ok and loss_rel < TOL
        msg += f", eval loss forja {forja_loss:.6f} vs hf {hf_loss:.6f} (rel {loss_rel:.2e})"
    print(f"{'PASS' if ok else 'FAIL'} {a.name}: {msg}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("--family", choices=["qwen3", "llama"], default="qwen3")
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--size", choices=["tiny", "qwen3-0.6b"], default="tiny")
    p = sub.add_parser("peft-adapter")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("--model", required=True)
    c.add_argument("--adapter", default=None)
    c.add_argument("--logits", required=True)
    c.add_argument("--eval-json", default=None)
    c.add_argument("--data", default=None)
    c.add_argument("--name", required=True)
    a = ap.parse_args()
    if a.cmd == "make-model":
        return make_model(a) or 0
    if a.cmd == "peft-adapter":
        return peft_adapter(a) or 0
    return compare(a)


if __name__ == "__main__":
    sys.exit(main())
