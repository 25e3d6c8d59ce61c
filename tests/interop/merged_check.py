"""Interop check of `forja merge` against transformers + PEFT (run where both are installed,
e.g. the H200 machine; CPU is enough):

    python3 tests/interop/merged_check.py [--forja .dist/forja] [--work /tmp/forja-merge-interop]

Builds a tiny random Qwen3 with transformers (save_pretrained, safetensors) and PEFT adapters with
non-zero B (init_lora_weights=False), runs `forja merge`, loads the output with
AutoModelForCausalLM.from_pretrained and compares, on one batch:
  fp32 base, all 7 projections, r 8:  merged logits vs PeftModel(base, adapter) logits and vs
      peft's merge_and_unload() logits (relative max error, must be < 1e-3), and the merged
      weights vs merge_and_unload's;
  the same merge sharded (--max-shard-size 60KB): loads through the index, same logits;
  bf16 base, rsLoRA on q/v/down, r 4: merged bf16 weights vs merge_and_unload done in fp32 and
      rounded to bf16 (at most 1 bf16 ulp apart), logits vs the PeftModel in fp32 (< 2e-2: the
      merged weights carry bf16 rounding);
  the tokenizer and generation config load from the merged directory.
Prints the numbers and PASS or FAIL (exit status 0 / 1).
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys

import torch


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()


def make_base(out_dir, dtype, seed):
    import transformers

    torch.manual_seed(seed)
    cls_cfg = getattr(transformers, "Qwen3Config", None)
    cls_model = getattr(transformers, "Qwen3ForCausalLM", None)
    if cls_cfg is None:
        raise SystemExit("this transformers has no Qwen3 (needs >= 4.51)")
    cfg = cls_cfg(vocab_size=151, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  max_position_embeddings=128, rope_theta=1e6, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2)
    model = cls_model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))  # not all ones
            else:
                p.copy_(0.05 * torch.randn_like(p))
    model = model.to(dtype)
    model.save_pretrained(out_dir, safe_serialization=True)
    # a small tokenizer so the copied tokenizer files can be loaded back
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 151)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="w2")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(out_dir)
    return model


def make_adapter(base_model, out_dir, r, alpha, targets, rslora, seed):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                     init_lora_weights=False, use_rslora=rslora, task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(base_model).float(), cfg)
    n_b = sum(p.abs().sum().item() for n, p in peft_model.named_parameters() if "lora_B" in n)
    assert n_b > 0, "lora_B is zero: the check would not test anything"
    peft_model.save_pretrained(out_dir, safe_serialization=True)


def load_model(path, dtype):
    from transformers import AutoModelForCausalLM

    # torch_dtype: accepted by every version (newer ones also take `dtype`); .to() makes sure.
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype).to(dtype).eval()


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def peft_models(base_dir, adapter_dir, compute_dtype):
    """(PeftModel over the base, merge_and_unload of it) with the base upcast to compute_dtype."""
    from peft import PeftModel

    unmerged = PeftModel.from_pretrained(load_model(base_dir, compute_dtype), adapter_dir).eval()
    merged = PeftModel.from_pretrained(load_model(base_dir, compute_dtype), adapter_dir)
    merged = merged.merge_and_unload().eval()
    return unmerged, merged


def run_forja(forja, args):
    cmd = [forja, "merge"] + args
    print("$ " + " ".join(cmd))
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout.rstrip())
    if res.returncode != 0:
        print(res.stderr.rstrip())
        raise SystemExit(f"FAIL: forja merge exited {res.returncode}")


def bf16_ulps(a, b):
    """max distance in bf16 steps between two bf16 tensors, and the count of unequal elements."""
    def ordered(t):
        bits = t.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
        return torch.where(bits >= 0x8000, -(bits & 0x7FFF), bits)
    d = (ordered(a) - ordered(b)).abs()
    return int(d.max().item()), int((d != 0).sum().item()), d.numel()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--forja", default=".dist/forja")
    ap.add_argument("--work", default="/tmp/forja-merge-interop")
    args = ap.parse_args()
    forja = os.path.abspath(args.forja)
    import peft
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    shutil.rmtree(args.work, ignore_errors=True)
    w = lambda *p: os.path.join(args.work, *p)  # noqa: E731
    failures = []

    def check(label, value, limit):
        ok = value < limit
        print(f"  {label}: {value:.3g} (limit {limit:g}) {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(label)

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 151, (3, 17), generator=g)
    all7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    # --- fp32, all projections ---
    base = make_base(w("base32"), torch.float32, 1)
    make_adapter(base, w("adapter32"), 8, 16, all7, False, 2)
    run_forja(forja, ["--model", w("base32"), "--adapter", w("adapter32"), "--out", w("merged32")])
    run_forja(forja, ["--model", w("base32"), "--adapter", w("adapter32"), "--out", w("sharded32"),
                      "--max-shard-size", "60KB"])
    print("fp32 base, r 8, alpha 16, all projections:")
    unmerged, peft_merged = peft_models(w("base32"), w("adapter32"), torch.float32)
    ours = load_model(w("merged32"), torch.float32)
    want = logits_of(unmerged, ids)
    base_logits = logits_of(load_model(w("base32"), torch.float32), ids)
    print(f"  adapter changes the logits by {rel_err(want, base_logits):.3g} (relative)")
    if rel_err(want, base_logits) < 1e-2:
        failures.append("the adapter barely changes the logits: the check would not bite")
    check("merged vs PeftModel logits", rel_err(logits_of(ours, ids), want), 1e-3)
    check("merged vs merge_and_unload logits", rel_err(logits_of(ours, ids), logits_of(peft_merged, ids)), 1e-3)
    sd_ours, sd_peft = ours.state_dict(), peft_merged.state_dict()
    worst = max(rel_err(sd_ours[k], sd_peft[k]) for k in sd_peft)
    check("merged vs merge_and_unload weights (max over tensors)", worst, 1e-5)
    if set(sd_ours) != set(sd_peft):
        failures.append(f"state dict keys differ: {sorted(set(sd_ours) ^ set(sd_peft))}")
    index = os.path.join(w("sharded32"), "model.safetensors.index.json")
    shards = len(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else 0
    print(f"  sharded output: {shards} shards")
    if shards < 2:
        failures.append("--max-shard-size 60KB did not shard")
    check("sharded vs single-file logits", rel_err(logits_of(load_model(w("sharded32"), torch.float32), ids),
                                                   logits_of(ours, ids)), 1e-7)

    # --- bf16 base, rsLoRA on a subset ---
    base16 = make_base(w("base16"), torch.bfloat16, 3)
    make_adapter(base16, w("adapter16"), 4, 8, ["q_proj", "v_proj", "down_proj"], True, 4)
    run_forja(forja, ["--model", w("base16"), "--adapter", w("adapter16"), "--out", w("merged16")])
    print("bf16 base, rsLoRA r 4, alpha 8, q/v/down:")
    unmerged16, peft_merged16 = peft_models(w("base16"), w("adapter16"), torch.float32)
    ours16 = load_model(w("merged16"), torch.bfloat16)
    cfg16 = json.load(open(os.path.join(w("merged16"), "config.json")))
    dtype_key = cfg16.get("torch_dtype", cfg16.get("dtype"))
    print(f"  config dtype: {dtype_key}")
    if dtype_key != "bfloat16":
        failures.append("merged bf16 config does not say bfloat16")
    sd16, sdp = ours16.state_dict(), peft_merged16.state_dict()
    worst_ulps, unequal, total = 0, 0, 0
    for k in sdp:
        m, n, t = bf16_ulps(sd16[k], sdp[k].to(torch.bfloat16))
        worst_ulps, unequal, total = max(worst_ulps, m), unequal + n, total + t
    print(f"  merged bf16 weights vs merge_and_unload (fp32, then bf16): max {worst_ulps} ulp, "
          f"{unequal} of {total} elements differ")
    if worst_ulps > 1:
        failures.append("bf16 weights more than 1 ulp from peft's merge")
    check("merged bf16 (run in fp32) vs PeftModel fp32 logits",
          rel_err(logits_of(load_model(w("merged16"), torch.float32), ids), logits_of(unmerged16, ids)), 2e-2)

    # --- tokenizer and generation config travel with the model ---
    from transformers import AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(w("merged32"))
    print(f"  tokenizer from the merged dir: {tok('w5 w7 w9')['input_ids']}")
    if tok("w5 w7 w9")["input_ids"] != [5, 7, 9]:
        failures.append("tokenizer copied wrongly")
    GenerationConfig.from_pretrained(w("merged32"))
    for f in failures:
        print("  failed: " + f)
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
