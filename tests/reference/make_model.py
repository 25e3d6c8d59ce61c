#!/usr/bin/python3
"""Write a small RANDOM model in the Hugging Face layout (config.json + model.safetensors).

The config carries the same fields a real checkpoint of that family has (formats.md 1.1, 1.7;
values modelled on Qwen3-0.6B, Qwen2.5-0.5B, Llama-3.2-1B and Mistral-7B-v0.3), so forja's
config parser is exercised on realistic input. Tensor names follow formats.md 1.2.

The defaults are deliberately awkward: hidden 48, 3 heads, 1 KV head (GQA n_rep = 3),
head_dim 16, intermediate 80, vocab 97, 2 layers. Norm weights are 1 + 0.1*randn (never the
all-ones init, which would hide a missing or misplaced norm weight), biases non-zero.

Everything comes from one torch.Generator seeded with --seed: same seed, same bytes.

    /usr/bin/python3 tests/reference/make_model.py --family qwen3 --seed 1 --out /tmp/m
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io as st  # noqa: E402
from model import FAMILIES, ModelConfig, expected_weight_shapes  # noqa: E402


def make_config(family: str, hidden=48, heads=3, kv_heads=1, head_dim=16, intermediate=80, vocab=97,
                layers=2, tied=False, rope_theta=None, rms_norm_eps=None, rope_scaling=None,
                attention_bias=False, dtype="F32") -> dict:
    """A config.json dict with the keys a real checkpoint of `family` has (sorted, as
    transformers writes them)."""
    torch_dtype = {"F32": "float32", "BF16": "bfloat16"}[dtype]
    common = {
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "tie_word_embeddings": bool(tied),
        "torch_dtype": torch_dtype,
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": vocab,
    }
    if family == "qwen3":  # Qwen3-0.6B
        c = dict(common, architectures=["Qwen3ForCausalLM"], attention_bias=False, bos_token_id=vocab - 2,
                 eos_token_id=vocab - 1, head_dim=head_dim, max_position_embeddings=40960,
                 max_window_layers=layers, model_type="qwen3", rms_norm_eps=1e-6, rope_scaling=None,
                 rope_theta=1000000, sliding_window=None, use_sliding_window=False)
    elif family == "qwen2":  # Qwen2.5-0.5B: no head_dim key, biases implied by the family
        c = dict(common, architectures=["Qwen2ForCausalLM"], bos_token_id=vocab - 2, eos_token_id=vocab - 1,
                 max_position_embeddings=32768, max_window_layers=layers, model_type="qwen2",
                 rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=32768, use_sliding_window=False)
        if head_dim != hidden // heads:
            c["head_dim"] = head_dim  # only newer transformers honour this for qwen2
    elif family == "llama":  # Llama-3.2-1B
        c = dict(common, architectures=["LlamaForCausalLM"], attention_bias=bool(attention_bias),
                 bos_token_id=vocab - 2, eos_token_id=vocab - 1, head_dim=head_dim,
                 max_position_embeddings=131072, mlp_bias=False, model_type="llama", pretraining_tp=1,
                 rms_norm_eps=1e-5, rope_scaling=None, rope_theta=500000.0)
    elif family == "mistral":  # Mistral-7B-v0.3
        c = dict(common, architectures=["MistralForCausalLM"], bos_token_id=1, eos_token_id=2,
                 head_dim=head_dim, max_position_embeddings=32768, model_type="mistral",
                 rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None)
    else:
        raise ValueError(f"family must be one of {FAMILIES}")
    if rope_theta is not None:
        c["rope_theta"] = rope_theta
    if rms_norm_eps is not None:
        c["rms_norm_eps"] = rms_norm_eps
    if rope_scaling is not None:
        c["rope_scaling"] = rope_scaling
    return dict(sorted(c.items()))


def llama3_scaling(factor=32.0, low=1.0, high=4.0, original=8192) -> dict:
    """The rope_scaling block of Llama-3.2 (factor 32) / 3.1 (factor 8)."""
    return {"factor": float(factor), "high_freq_factor": float(high), "low_freq_factor": float(low),
            "original_max_position_embeddings": int(original), "rope_type": "llama3"}


def make_weights(cfg: ModelConfig, seed: int, write_lm_head_when_tied=False, norm_spread=0.1,
                 bias_std=0.1) -> dict:
    """Random weights scaled so activations and logits stay O(1) (std 1/sqrt(fan_in) for linears
    and the embedding): the non-linear parts then matter, which makes gradient checks meaningful.
    Returned in float32; rounding to BF16 happens on write."""
    g = torch.Generator().manual_seed(int(seed))
    shapes = expected_weight_shapes(cfg)
    w = {}
    # Fixed order -> deterministic. lm_head goes last so that the tied and the untied model of
    # one seed share every other tensor (tests compare them).
    for name in sorted(shapes, key=lambda n: (n == "lm_head.weight", n)):
        shp = shapes[name]
        if name.endswith("norm.weight"):
            t = 1.0 + norm_spread * torch.randn(shp, generator=g, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = bias_std * torch.randn(shp, generator=g, dtype=torch.float64)
        elif name == "model.embed_tokens.weight":
            # std 1/sqrt(H): as a tied LM head this gives O(1) logits (a std-1 embedding gives
            # logits of std sqrt(H) and a saturated softmax with near-zero gradients).
            t = torch.randn(shp, generator=g, dtype=torch.float64) / (shp[1] ** 0.5)
        else:  # [out, in] linear (incl. untied lm_head)
            t = torch.randn(shp, generator=g, dtype=torch.float64) / (shp[1] ** 0.5)
        w[name] = t.float()
    if cfg.tie_word_embeddings and write_lm_head_when_tied:
        w["lm_head.weight"] = w["model.embed_tokens.weight"].clone()  # as Qwen3-0.6B's file does
    return w


def write_model(out_dir: str, config: dict, seed: int, dtype="F32", write_lm_head_when_tied=False) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    cfg = ModelConfig.from_dict(config)
    w = make_weights(cfg, seed, write_lm_head_when_tied)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    st.save_file(w, os.path.join(out_dir, "model.safetensors"), dtype=dtype)
    return w


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--family", choices=FAMILIES, default="qwen3")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["F32", "BF16"], default="F32", help="tensor dtype in model.safetensors")
    ap.add_argument("--tied", action="store_true", help="tie_word_embeddings = true")
    ap.add_argument("--write-lm-head", action="store_true",
                    help="with --tied, also store lm_head.weight (equal to the embedding), as some real files do")
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=80)
    ap.add_argument("--vocab", type=int, default=97)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rope-theta", type=float, default=None, help="override the family's rope_theta")
    ap.add_argument("--rms-norm-eps", type=float, default=None, help="override the family's rms_norm_eps")
    ap.add_argument("--llama3-scaling", action="store_true", help="add a llama3 rope_scaling block")
    ap.add_argument("--rope-factor", type=float, default=32.0)
    ap.add_argument("--rope-low-freq-factor", type=float, default=1.0)
    ap.add_argument("--rope-high-freq-factor", type=float, default=4.0)
    ap.add_argument("--rope-original-max", type=int, default=8192)
    ap.add_argument("--attention-bias", action="store_true", help="llama only: attention_bias = true")
    a = ap.parse_args(argv)
    if a.attention_bias and a.family != "llama":
        ap.error("--attention-bias is a llama option (qwen2 always has q/k/v biases)")
    scaling = None
    if a.llama3_scaling:
        scaling = llama3_scaling(a.rope_factor, a.rope_low_freq_factor, a.rope_high_freq_factor, a.rope_original_max)
    config = make_config(a.family, a.hidden, a.heads, a.kv_heads, a.head_dim, a.intermediate, a.vocab, a.layers,
                         a.tied, a.rope_theta, a.rms_norm_eps, scaling, a.attention_bias, a.dtype)
    w = write_model(a.out, config, a.seed, a.dtype, a.write_lm_head)
    print(f"wrote {a.out}: {a.family}, {len(w)} tensors, {sum(t.numel() for t in w.values())} parameters, {a.dtype}")


if __name__ == "__main__":
    main()
