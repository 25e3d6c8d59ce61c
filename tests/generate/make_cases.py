#!/usr/bin/python3
"""Cases for forja's generation and evaluation tests (tests/generate): small random models with a
tiny byte-level BPE tokenizer, a random LoRA adapter with non-zero B, and what the PyTorch
reference (tests/reference/model.py, float64) computes for them:

    OUT/<case>/model/     config.json, model.safetensors, tokenizer.json, tokenizer_config.json
    OUT/<case>/adapter/   PEFT adapter (A and B random)
    OUT/<case>/prompt.json        {"ids": [...]}            an awkward-length token sequence
    OUT/<case>/logits.safetensors "base" and "adapter": fp32 logits [T, V] of the prompt
    OUT/<case>/data.jsonl         {"input_ids", "labels"} examples of several lengths
    OUT/<case>/eval.json          {"base": mean loss, "adapter": mean loss, "loss_tokens": n}

    /usr/bin/python3 tests/generate/make_cases.py --out DIR
"""

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import make_model as MM  # noqa: E402
import model as M  # noqa: E402
import safetensors_io as st  # noqa: E402

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MERGES = [("h", "e"), ("l", "l"), ("Ġ", "t"), ("Ġt", "he"), ("i", "n"), ("o", "r"), ("e", "r"), ("Ġ", "a"),
          ("Ġ", "w"), ("o", "u"), ("he", "ll"), ("hell", "o"), ("Ġ", "s"), ("a", "n"), ("Ġw", "or"), ("l", "d"),
          ("Ġwor", "ld"), ("Ġ", "c"), ("Ġ", "i"), ("Ġi", "s")]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tokenizer(model_dir):
    """A tiny byte-level BPE tokenizer in the Qwen layout; returns its vocabulary size."""
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: b for b in range(256)}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    added = []
    for s in SPECIAL:
        added.append({"id": len(vocab) + len(added), "content": s, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False}, byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in MERGES]},
    }
    with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                   "chat_template": CHATML, "model_max_length": 4096}, f, indent=1)
    return len(vocab) + len(added)


# name -> make_config kwargs
CASES = {
    "qwen3": dict(family="qwen3", hidden=48, heads=4, kv_heads=2, head_dim=16, intermediate=80, layers=2),
    "qwen2-bias": dict(family="qwen2", hidden=40, heads=5, kv_heads=1, head_dim=8, intermediate=72, layers=2),
    "llama-rope": dict(family="llama", hidden=64, heads=2, kv_heads=2, head_dim=32, intermediate=96, layers=3,
                       attention_bias=True, rope_theta=10000.0,
                       rope_scaling=MM.llama3_scaling(8.0, 1.0, 4.0, 16)),
}


def make_case(out, name, kw, seed):
    d = os.path.join(out, name)
    mdir = os.path.join(d, "model")
    os.makedirs(mdir, exist_ok=True)
    vocab = write_tokenizer(mdir)
    cfg_dict = MM.make_config(vocab=vocab, **kw)
    cfg_dict["bos_token_id"] = vocab - 3  # <|endoftext|>
    cfg_dict["eos_token_id"] = vocab - 1  # <|im_end|>
    cfg_dict["max_position_embeddings"] = 512
    MM.write_model(mdir, cfg_dict, seed)
    model = M.BaseModel.load(mdir, dtype=torch.float64)
    lora = M.LoRA(model.cfg, 4, 8.0, list(M.TARGETS))
    lora.init_random(seed + 100, b_std=0.2)
    lora.save_peft(os.path.join(d, "adapter"))

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (37,), generator=g)
    with open(os.path.join(d, "prompt.json"), "w") as f:
        json.dump({"ids": ids.tolist()}, f)
    with torch.no_grad():
        base = M.forward(model, ids[None])[0]
        adapted = M.forward(model, ids[None], lora=lora)[0]
    st.save_file({"base": base.float(), "adapter": adapted.float()}, os.path.join(d, "logits.safetensors"),
                 dtype="F32")

    # Eval data: examples of several lengths, the first few tokens of each masked.
    examples = []
    for n in (5, 23, 2, 40, 17):
        x = torch.randint(0, vocab, (n,), generator=g).tolist()
        labels = [-100] * min(2, n - 1) + x[min(2, n - 1):]
        examples.append((x, labels))
    with open(os.path.join(d, "data.jsonl"), "w") as f:
        for x, labels in examples:
            f.write(json.dumps({"input_ids": x, "labels": labels}) + "\n")
    losses = {}
    count = sum(sum(1 for t in labels[1:] if t != -100) for _, labels in examples)
    with torch.no_grad():
        for key, ad in (("base", None), ("adapter", lora)):
            total = 0.0
            for x, labels in examples:
                logits = M.forward(model, torch.tensor([x]), lora=ad)
                total += float(M.loss_sum(logits, torch.tensor([labels])))
            losses[key] = total / count
    with open(os.path.join(d, "eval.json"), "w") as f:
        json.dump(dict(losses, loss_tokens=count), f)
    print(f"{name}: vocab {vocab}, eval loss {losses}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    for i, (name, kw) in enumerate(CASES.items()):
        make_case(a.out, name, kw, seed=10 + i)


if __name__ == "__main__":
    main()
