#!/usr/bin/python3
"""Self-test of the PyTorch reference (ctest-able: exit status 0 = pass, 1 = fail).

    /usr/bin/python3 tests/reference/selftest.py [-v] [-k NAME]

Every check compares against something computed a different way (finite differences, a
loop-by-loop re-derivation of formats.md, torch's own AdamW/clip, hand-worked schedule values,
separate runs of packed documents), and every check can fail. Runs in well under 30 s on CPU.
"""

import argparse
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as CMP  # noqa: E402
import make_batch as MB  # noqa: E402
import make_model as MM  # noqa: E402
import model as M  # noqa: E402
import parity_cases as PC  # noqa: E402
import reference_run as RR  # noqa: E402
import safetensors_io as st  # noqa: E402

torch.set_num_threads(1)  # tiny tensors: threading costs more than it saves
VERBOSE = False


def log(*a):
    if VERBOSE:
        print("   ", *a)


def tensors(mb):
    return {k: torch.tensor(v, dtype=torch.long) for k, v in mb.items()}


def tiny(family, seed=1, tied=False, **kw):
    """(BaseModel in fp64, config dict) of the default awkward shape."""
    cfg_d = MM.make_config(family, tied=tied, **kw)
    cfg = M.ModelConfig.from_dict(cfg_d)
    return M.BaseModel(cfg, MM.make_weights(cfg, seed), dtype=torch.float64), cfg_d


def lora_for(model, rank=3, alpha=7.0, targets=M.TARGETS, rslora=False, seed=5):
    l = M.LoRA(model.cfg, rank, alpha, targets, use_rslora=rslora, dtype=torch.float64)
    l.init_random(seed, b_std=0.2)
    return l


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


# ---------------------------------------------------------------------------------------------
# (a) finite differences of the LoRA gradients, every family
# ---------------------------------------------------------------------------------------------


def fd_check(family, pack, rslora, n_mb=1, entries_per_tensor=2, h=1e-3, tol=1e-6, **cfg_kw):
    model, _ = tiny(family, **cfg_kw)
    lora = lora_for(model, rslora=rslora)
    mbs = [tensors(mb) for mb in MB.make_batch(97, n_mb, 2, 9, seed=3, pack=pack)["micro_batches"]]
    n = M.count_num_items([mb["labels"] for mb in mbs])
    loss, _ = M.step_objective(model, lora, mbs, n)
    loss.backward()
    g = torch.Generator().manual_seed(11)
    worst = 0.0
    checked = 0
    for name, p in lora.named_parameters():
        grad = p.grad.reshape(-1)
        if not grad.abs().max() > 0:
            raise AssertionError(f"{family}: gradient of {name} is all zero")
        # Entries whose gradient is not tiny: finite differences can only verify those relatively.
        cand = (grad.abs() > 0.05 * grad.abs().max()).nonzero().reshape(-1)
        pick = cand[torch.randperm(len(cand), generator=g)[:entries_per_tensor]]
        flat = p.data.view(-1)
        for j in pick.tolist():
            def f(delta):
                old = flat[j].item()
                flat[j] = old + delta
                with torch.no_grad():
                    v, _ = M.step_objective(model, lora, mbs, n)
                flat[j] = old
                return v.item()
            # 5-point central stencil: truncation O(h^4) ~ 1e-12, rounding ~ 1e-16 / h.
            fd = (-f(2 * h) + 8 * f(h) - 8 * f(-h) + f(-2 * h)) / (12 * h)
            r = abs(fd - grad[j].item()) / abs(grad[j].item())
            worst = max(worst, r)
            checked += 1
            if r > tol:
                raise AssertionError(f"{family}: {name}[{j}] autograd {grad[j].item():.10e} vs FD {fd:.10e} (rel {r:.2e})")
    log(f"{family} pack={pack} rslora={rslora}: {checked} entries, worst rel err {worst:.2e}")


def test_fd_qwen3():
    fd_check("qwen3", pack=False, rslora=False, tied=True)


def test_fd_qwen2_packed():
    fd_check("qwen2", pack=True, rslora=True, n_mb=2)  # accumulation over 2 micro-batches


def test_fd_llama_llama3_rope_bias():
    fd_check("llama", pack=True, rslora=False, attention_bias=True, rope_theta=10000.0,
             rope_scaling=MM.llama3_scaling(8.0, 1.0, 4.0, 64))


def test_fd_mistral():
    fd_check("mistral", pack=False, rslora=False, entries_per_tensor=1, kv_heads=3)  # = llama layout, no GQA


# ---------------------------------------------------------------------------------------------
# Forward re-derived loop by loop from formats.md (checks GQA indexing, RoPE layout, masks)
# ---------------------------------------------------------------------------------------------


def naive_inv_freq(cfg):
    """formats.md 1.5 / 1.7 in plain Python floats."""
    d = cfg.head_dim
    inv = [1.0 / cfg.rope_theta ** (2 * j / d) for j in range(d // 2)]
    sc = cfg.rope_scaling
    if sc is None:
        return inv
    f, lf, hf, lo = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"], sc["original_max_position_embeddings"]
    out = []
    for x in inv:
        lam = 2 * math.pi / x
        if lam < lo / hf:
            out.append(x)
        elif lam > lo / lf:
            out.append(x / f)
        else:
            s = (lo / lam - lf) / (hf - lf)
            out.append((1 - s) * x / f + s * x)
    return out


def naive_forward(model, ids, pos, seg, lora):
    """One sequence, explicit loops over heads and positions (fp64 angles)."""
    cfg, w = model.cfg, model.w
    S, nh, nkv, d = len(ids), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv = naive_inv_freq(cfg)

    def norm(v, wt):
        return wt * (v / torch.sqrt((v * v).mean() + cfg.rms_norm_eps))

    def lin(x, i, t):
        name = f"model.layers.{i}.{M.TARGET_MODULE[t]}"
        y = x @ w[name + ".weight"].t()
        if name + ".bias" in w:
            y = y + w[name + ".bias"]
        if lora is not None and (i, t) in lora.A:
            y = y + lora.scale * (x @ lora.A[(i, t)].t() @ lora.B[(i, t)].t())
        return y

    def rope(v, p):  # scalar form of formats.md 1.5
        out = v.clone()
        for j in range(d // 2):
            c, s = math.cos(p * inv[j]), math.sin(p * inv[j])
            out[j] = v[j] * c - v[j + d // 2] * s
            out[j + d // 2] = v[j + d // 2] * c + v[j] * s
        return out

    x = torch.stack([w["model.embed_tokens.weight"][t] for t in ids])
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = torch.stack([norm(x[s], w[p + "input_layernorm.weight"]) for s in range(S)])
        q, k, v = lin(h, i, "q"), lin(h, i, "k"), lin(h, i, "v")
        o = torch.zeros(S, nh * d, dtype=x.dtype)
        for hq in range(nh):
            hk = hq // (nh // nkv)  # GQA: query head -> KV head floor(h / n_rep)
            qs, ks = [], []
            for s in range(S):
                qv, kv = q[s, hq * d:(hq + 1) * d], k[s, hk * d:(hk + 1) * d]
                if cfg.qk_norm:
                    qv, kv = norm(qv, w[p + "self_attn.q_norm.weight"]), norm(kv, w[p + "self_attn.k_norm.weight"])
                qs.append(rope(qv, pos[s]))
                ks.append(rope(kv, pos[s]))
            for s in range(S):
                keys = [t for t in range(s + 1) if seg is None or (seg[t] == seg[s] and seg[t] != 0)]
                if not keys:  # padding query: sees nothing, output row 0
                    continue
                sc = torch.stack([qs[s] @ ks[t] / math.sqrt(d) for t in keys])
                pr = torch.exp(sc - sc.max())
                pr = pr / pr.sum()
                o[s, hq * d:(hq + 1) * d] = sum(pr[n] * v[t, hk * d:(hk + 1) * d] for n, t in enumerate(keys))
        x = x + lin(o, i, "o")
        h = torch.stack([norm(x[s], w[p + "post_attention_layernorm.weight"]) for s in range(S)])
        g, u = lin(h, i, "gate"), lin(h, i, "up")
        x = x + lin(g * torch.sigmoid(g) * u, i, "down")
    x = torch.stack([norm(x[s], w["model.norm.weight"]) for s in range(S)])
    return x @ model.lm_head().t()


def test_forward_matches_loop_derivation():
    cases = [("qwen3", {}), ("qwen3", dict(heads=4, kv_heads=2, head_dim=8)),  # n_rep = 2 with 2 KV heads
             ("qwen2", {}), ("llama", dict(rope_theta=10000.0, attention_bias=True,
                                                          rope_scaling=MM.llama3_scaling(8.0, 1.0, 4.0, 64)))]
    for fam, kw in cases:
        model, _ = tiny(fam, **kw)
        model.rope_angle_dtype = torch.float64  # compare the maths, not fp32 angle rounding
        lora = lora_for(model)
        mb = tensors(MB.make_batch(97, 1, 2, 10, seed=7, pack=True)["micro_batches"][0])
        got = M.forward(model, mb["input_ids"], mb["position_ids"], mb["segment_ids"], lora)
        for b in range(2):
            seg = mb["segment_ids"][b].tolist()
            ref = naive_forward(model, mb["input_ids"][b].tolist(), mb["position_ids"][b].tolist(), seg, lora)
            r = rel(got[b], ref)  # all rows, padding included (attention output 0 there)
            log(f"{fam} row {b}: rel diff vs loop derivation {r:.2e}")
            if r > 1e-12:
                raise AssertionError(f"{fam}: vectorised forward differs from loop derivation (rel {r:.2e})")


def test_rope_inv_freq_and_fp32_angles():
    # llama3: all three bands must occur with these numbers, and each must match the formula.
    cfg = M.ModelConfig.from_dict(MM.make_config("llama", rope_theta=10000.0,
                                                 rope_scaling=MM.llama3_scaling(8.0, 1.0, 4.0, 64)))
    got = M.rope_inv_freq(cfg, torch.float64)
    ref = torch.tensor(naive_inv_freq(cfg), dtype=torch.float64)
    base = torch.tensor([1.0 / 10000.0 ** (2 * j / 16) for j in range(8)], dtype=torch.float64)
    bands = set()
    for j in range(8):
        lam = 2 * math.pi / base[j].item()
        bands.add("high" if lam < 16 else "low" if lam > 64 else "mid")
    if bands != {"high", "low", "mid"}:
        raise AssertionError(f"test set-up does not cover all llama3 bands: {bands}")
    if rel(got, ref) > 1e-14:
        raise AssertionError(f"llama3 inv_freq wrong: {got} vs {ref}")
    # Default angles are fp32 as in transformers: inv_freq equals the fp32 computation exactly.
    cfg0 = M.ModelConfig.from_dict(MM.make_config("qwen3"))
    inv32 = 1.0 / (cfg0.rope_theta ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16))
    if not torch.equal(M.rope_inv_freq(cfg0), inv32):
        raise AssertionError("default inv_freq is not the fp32 transformers computation")


# ---------------------------------------------------------------------------------------------
# (b) AdamW and clipping against torch
# ---------------------------------------------------------------------------------------------


def test_adamw_matches_torch():
    g = torch.Generator().manual_seed(3)
    shapes = [(5, 7), (3,), (4, 2)]
    mine = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
    theirs = [p.clone().requires_grad_(True) for p in mine]
    mine = [p.clone().requires_grad_(True) for p in mine]
    kw = dict(lr=3e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    opt_m = M.AdamW(mine, **kw)
    opt_t = torch.optim.AdamW(theirs, **kw)
    for step in range(6):
        lr = kw["lr"] * (1.0 - step / 10)  # a changing lr, as a schedule would give
        for pg in opt_t.param_groups:
            pg["lr"] = lr
        for a, b in zip(mine, theirs):
            grad = torch.randn(a.shape, generator=g, dtype=torch.float64) * (10.0 ** (step - 3))
            a.grad, b.grad = grad.clone(), grad.clone()
        opt_m.step(lr)
        opt_t.step()
    for a, b in zip(mine, theirs):
        r = rel(a.detach(), b.detach())
        if r > 1e-14:
            raise AssertionError(f"hand AdamW differs from torch.optim.AdamW (rel {r:.2e})")
    # Sanity that the comparison can fail: eps before the bias correction gives different numbers.
    if abs(math.sqrt(1e-8) / math.sqrt(1 - 0.95) + 1e-6 - (math.sqrt(1e-8) + 1e-6) / math.sqrt(1 - 0.95)) == 0:
        raise AssertionError("eps placement test is degenerate")


def test_clip_matches_torch():
    g = torch.Generator().manual_seed(4)
    for max_norm in (0.3, 100.0):
        ps = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in [(4, 3), (6,)]]
        qs = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in [(4, 3), (6,)]]
        for p, q in zip(ps, qs):
            gr = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.grad, q.grad = gr.clone(), gr.clone()
        expect_norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ps))
        n_mine = M.clip_grad_norm(ps, max_norm)
        n_torch = float(torch.nn.utils.clip_grad_norm_(qs, max_norm))
        if abs(n_mine - expect_norm) > 1e-12 * expect_norm or abs(n_mine - n_torch) > 1e-12 * expect_norm:
            raise AssertionError(f"norm {n_mine} vs {expect_norm} / torch {n_torch}")
        for p, q in zip(ps, qs):
            if rel(p.grad, q.grad) > 1e-14:
                raise AssertionError("clipped gradients differ from torch")
        after = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ps))
        want = min(expect_norm, max_norm * expect_norm / (expect_norm + 1e-6))
        if abs(after - want) > 1e-12:
            raise AssertionError(f"clipped norm {after}, want {want}")


# ---------------------------------------------------------------------------------------------
# (c) schedules: values worked out by hand from formats.md 6.4 / transformers
# ---------------------------------------------------------------------------------------------


def test_schedules():
    W, T = 2, 10
    want = {
        # cosine: warm-up 0, 1/2; p = (s-2)/8; 0.5*(1+cos(pi*p))
        ("cosine", 0): 0.0, ("cosine", 1): 0.5, ("cosine", 2): 1.0,
        ("cosine", 4): 0.5 * (1 + math.sqrt(0.5)), ("cosine", 6): 0.5, ("cosine", 8): 0.5 * (1 - math.sqrt(0.5)),
        ("cosine", 10): 0.0,
        # linear: (T - s) / (T - W)
        ("linear", 0): 0.0, ("linear", 1): 0.5, ("linear", 2): 1.0, ("linear", 6): 0.5, ("linear", 9): 0.125,
        ("linear", 10): 0.0, ("linear", 12): 0.0,
        ("constant", 0): 0.0, ("constant", 1): 0.5, ("constant", 2): 1.0, ("constant", 9): 1.0,
    }
    for (sched, s), v in want.items():
        got = M.lr_multiplier(sched, s, W, T)
        if abs(got - v) > 1e-15:
            raise AssertionError(f"{sched} step {s}: {got} != {v}")
    if M.lr_multiplier("cosine", 0, 0, 5) != 1.0 or M.lr_multiplier("linear", 1, 0, 4) != 0.75:
        raise AssertionError("schedule without warm-up wrong")


# ---------------------------------------------------------------------------------------------
# Loss conventions (6.1)
# ---------------------------------------------------------------------------------------------


def test_loss_num_items_and_accumulation():
    model, _ = tiny("qwen3")
    lora = lora_for(model)
    b = MB.make_batch(97, 1, 2, 9, seed=2)["micro_batches"][0]
    full = tensors(b)
    # Off-by-one: a real label at position 0 counts for "unshifted" but is no loss term.
    lab = full["labels"].clone()
    lab[:, 0] = 5
    if M.count_num_items([lab], "unshifted") != M.count_num_items([lab], "shifted") + 2:
        raise AssertionError("num_items shifted/unshifted off-by-one not as documented")
    if M.count_num_items([full["labels"]]) != int((full["labels"][:, 1:] != -100).sum()):
        raise AssertionError("shifted count wrong")
    # The loss equals the token mean over the whole step, computed here with explicit log-softmax.
    logits = M.forward(model, full["input_ids"], lora=lora)
    terms = []
    for r in range(2):
        for t in range(8):
            y = int(full["labels"][r, t + 1])
            if y != -100:
                terms.append(-torch.log_softmax(logits[r, t], -1)[y])
    mean = torch.stack(terms).mean()
    n = M.count_num_items([full["labels"]])
    one, _ = M.step_objective(model, lora, [full], n)
    if abs(one.item() - mean.item()) > 1e-13:
        raise AssertionError(f"loss {one.item()} != explicit token mean {mean.item()}")
    # Splitting the rows into two micro-batches changes neither loss nor gradients (sum / N_total).
    one.backward()
    g1 = [p.grad.clone() for p in lora.parameters()]
    for p in lora.parameters():
        p.grad = None
    halves = [{k: v[r:r + 1] for k, v in full.items()} for r in range(2)]
    two, _ = M.step_objective(model, lora, halves, n)
    two.backward()
    g2 = [p.grad for p in lora.parameters()]
    if abs(one.item() - two.item()) > 1e-13 or max(rel(a, b) for a, b in zip(g2, g1)) > 1e-12:
        raise AssertionError("accumulation over micro-batches is not the token mean over the step")
    # And it is NOT the mean of per-micro-batch means when the counts differ (the check can bite).
    per = [M.loss_sum(M.forward(model, h["input_ids"], lora=lora), h["labels"]) /
           M.count_num_items([h["labels"]]) for h in halves]
    if [M.count_num_items([h["labels"]]) for h in halves][0] != [M.count_num_items([h["labels"]]) for h in halves][1]:
        if abs(float(sum(per) / 2) - one.item()) < 1e-9:
            raise AssertionError("mean of means coincides with token mean; test data too regular")


# ---------------------------------------------------------------------------------------------
# (d) packing
# ---------------------------------------------------------------------------------------------


def test_packing_equals_separate_documents():
    for fam in ("qwen3", "llama"):
        model, _ = tiny(fam)
        lora = lora_for(model)
        rng = np.random.RandomState(9)
        d1, d2 = rng.randint(0, 97, 5).tolist(), rng.randint(0, 97, 6).tolist()
        l1 = [-100, -100] + d1[2:]
        l2 = [-100] + d2[1:]
        pad = 2
        ids = torch.tensor([d1 + d2 + [96] * pad])
        lab = torch.tensor([l1 + l2 + [-100] * pad])
        pos = torch.tensor([list(range(5)) + list(range(6)) + [0, 1]])
        seg = torch.tensor([[1] * 5 + [2] * 6 + [0] * pad])
        M.validate_micro_batch({"input_ids": ids, "labels": lab, "segment_ids": seg, "position_ids": pos}, 97)
        packed = M.forward(model, ids, pos, seg, lora)
        tl_packed = M.token_losses(packed, lab)[0]
        sep1 = M.forward(model, torch.tensor([d1]), lora=lora)
        sep2 = M.forward(model, torch.tensor([d2]), lora=lora)
        r = max(rel(packed[0, :5], sep1[0]), rel(packed[0, 5:11], sep2[0]))
        tl1 = M.token_losses(sep1, torch.tensor([l1]))[0]
        tl2 = M.token_losses(sep2, torch.tensor([l2]))[0]
        # packed targets: positions 0..3 are doc 1, 4 is the boundary (label -100), 5..9 doc 2
        rl = max(rel(tl_packed[:4], tl1), rel(tl_packed[5:10], tl2))
        log(f"{fam}: packed vs separate logits rel {r:.2e}, per-token loss rel {rl:.2e}")
        if r > 1e-12 or rl > 1e-12 or tl_packed[4] != 0 or tl_packed[10:].abs().sum() != 0:
            raise AssertionError(f"{fam}: packing does not reproduce separate documents ({r:.2e}, {rl:.2e})")
        # Without segment_ids (position ids only) doc 2 sees doc 1: must differ, or the test is blind.
        leaky = M.forward(model, ids, pos, None, lora)
        if rel(leaky[0, 5:11], sep2[0]) < 1e-6:
            raise AssertionError("segment mask has no effect; the packing test cannot fail")
    # A counted target across a boundary is rejected.
    bad = {"input_ids": ids, "labels": torch.tensor([l1 + [d2[0]] + l2[1:] + [-100] * pad]), "segment_ids": seg}
    try:
        M.validate_micro_batch(bad, 97)
    except ValueError:
        pass
    else:
        raise AssertionError("cross-segment target was not rejected")


# ---------------------------------------------------------------------------------------------
# (e) tied vs untied
# ---------------------------------------------------------------------------------------------


def test_tied_untied():
    cfg_t = M.ModelConfig.from_dict(MM.make_config("qwen3", tied=True))
    cfg_u = M.ModelConfig.from_dict(MM.make_config("qwen3", tied=False))
    w_u = MM.make_weights(cfg_u, 1)
    w_t = {k: v for k, v in w_u.items() if k != "lm_head.weight"}
    ids = torch.tensor([[1, 5, 9, 33, 2, 96]])
    tied = M.forward(M.BaseModel(cfg_t, w_t), ids)
    # Tied == untied whose lm_head is a copy of the embedding.
    same = M.forward(M.BaseModel(cfg_u, dict(w_t, **{"lm_head.weight": w_t["model.embed_tokens.weight"].clone()})), ids)
    if rel(tied, same) > 0:
        raise AssertionError("tied model does not use the embedding as LM head")
    # Untied with its own lm_head differs.
    if rel(M.forward(M.BaseModel(cfg_u, w_u), ids), tied) < 1e-3:
        raise AssertionError("untied model ignores lm_head.weight")
    # A tied file may carry an equal lm_head (accepted) but not a different one; untied needs it.
    M.BaseModel(cfg_t, dict(w_t, **{"lm_head.weight": w_t["model.embed_tokens.weight"].clone()}))
    for cfg, w, why in [(cfg_t, w_u, "tied with a different lm_head"), (cfg_u, w_t, "untied without lm_head")]:
        try:
            M.BaseModel(cfg, w)
        except ValueError:
            continue
        raise AssertionError(f"{why} was accepted")
    # Through files: make_model --tied --write-lm-head round-trips.
    with tempfile.TemporaryDirectory() as d:
        MM.main(["--out", d, "--family", "qwen3", "--tied", "--write-lm-head", "--seed", "1"])
        if "lm_head.weight" not in st.load_dtypes(os.path.join(d, "model.safetensors")):
            raise AssertionError("--write-lm-head did not write lm_head.weight")
        m = M.BaseModel.load(d)
        if not m.cfg.tie_word_embeddings or rel(M.forward(m, ids), tied) > 0:
            raise AssertionError("tied model loaded from files differs")


# ---------------------------------------------------------------------------------------------
# (f) features that must change the output
# ---------------------------------------------------------------------------------------------


def test_features_are_used():
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])

    def changed(model, key, delta):
        base = M.forward(model, ids)
        model.w[key] = model.w[key] + delta
        out = M.forward(model, ids)
        model.w[key] = model.w[key] - delta
        return rel(out, base)

    q2, _ = tiny("qwen2")
    for key in ("model.layers.0.self_attn.q_proj.bias", "model.layers.1.self_attn.k_proj.bias",
                "model.layers.0.self_attn.v_proj.bias"):
        if changed(q2, key, 0.5) < 1e-6:
            raise AssertionError(f"qwen2: {key} has no effect")
    if "model.layers.0.self_attn.o_proj.bias" in q2.w:
        raise AssertionError("qwen2 must have no o_proj bias")
    q3, _ = tiny("qwen3")
    for key in ("model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
                "model.layers.0.input_layernorm.weight", "model.norm.weight"):
        if changed(q3, key, 0.3 * torch.linspace(-1, 1, q3.w[key].numel(), dtype=torch.float64)) < 1e-6:
            raise AssertionError(f"qwen3: {key} has no effect")
    # llama3 rope scaling: same weights with and without the rope_scaling block.
    sc = MM.llama3_scaling(8.0, 1.0, 4.0, 64)
    cfg_a = M.ModelConfig.from_dict(MM.make_config("llama", rope_theta=10000.0, rope_scaling=sc))
    cfg_b = M.ModelConfig.from_dict(MM.make_config("llama", rope_theta=10000.0))
    w = MM.make_weights(cfg_a, 2)
    r = rel(M.forward(M.BaseModel(cfg_a, w), ids), M.forward(M.BaseModel(cfg_b, w), ids))
    if r < 1e-4:
        raise AssertionError(f"llama3 rope scaling has no effect ({r:.2e})")
    # rope_theta matters; the newer rope_parameters spelling is understood the same way.
    cfg_c = dict(MM.make_config("llama"))
    theta = cfg_c.pop("rope_theta")
    cfg_c.pop("rope_scaling")
    cfg_c["rope_parameters"] = dict(sc, rope_theta=theta)
    pc = M.ModelConfig.from_dict(cfg_c)
    if pc.rope_theta != theta or pc.rope_scaling["rope_type"] != "llama3":
        raise AssertionError("rope_parameters not parsed")
    # llama attention_bias adds q/k/v/o biases.
    lb = M.ModelConfig.from_dict(MM.make_config("llama", attention_bias=True))
    if not (lb.qkv_bias and lb.o_bias):
        raise AssertionError("llama attention_bias not honoured")


def test_config_parsing():
    base = MM.make_config("qwen3")
    c = M.ModelConfig.from_dict(base)
    if (c.head_dim, c.num_kv_heads, c.rope_theta, c.rms_norm_eps, c.qk_norm) != (16, 1, 1e6, 1e-6, True):
        raise AssertionError(f"qwen3 config parsed wrongly: {c}")
    q2 = M.ModelConfig.from_dict(MM.make_config("qwen2"))
    if "head_dim" in MM.make_config("qwen2") or q2.head_dim != 16 or not q2.qkv_bias or q2.o_bias:
        raise AssertionError("qwen2: head_dim must default to H/heads, q/k/v biased, o not")
    nokv = dict(base)
    del nokv["num_key_value_heads"]
    if M.ModelConfig.from_dict(nokv).num_kv_heads != 3:
        raise AssertionError("missing num_key_value_heads must default to num_attention_heads")
    for bad in (dict(base, hidden_act="gelu"), dict(base, model_type="gpt2"), dict(base, partial_rotary_factor=0.5),
                dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0}), dict(base, num_key_value_heads=2)):
        try:
            M.ModelConfig.from_dict(bad)
        except ValueError:
            continue
        raise AssertionError(f"unsupported config accepted: {[k for k in bad if bad[k] != base.get(k)]}")
    # An active sliding window that would bite is refused, not silently ignored.
    sw = M.ModelConfig.from_dict(dict(MM.make_config("mistral"), sliding_window=4))
    m = M.BaseModel(sw, MM.make_weights(sw, 1))
    try:
        M.forward(m, torch.tensor([[1, 2, 3, 4, 5, 6]]))
    except NotImplementedError:
        pass
    else:
        raise AssertionError("sliding window shorter than the sequence accepted")


def test_lora_scale_and_targets():
    model, _ = tiny("llama")
    ids = torch.tensor([[7, 8, 9, 10, 11]])
    base = M.forward(model, ids)
    for t in M.TARGETS:  # each target alone moves the output
        l = lora_for(model, targets=[t])
        if rel(M.forward(model, ids, lora=l), base) < 1e-6:
            raise AssertionError(f"LoRA on {t} has no effect")
    l = lora_for(model, rank=4, alpha=8.0)
    lr = lora_for(model, rank=4, alpha=8.0, rslora=True)
    if l.scale != 2.0 or lr.scale != 4.0:
        raise AssertionError("LoRA scale must be alpha/r = 2, rsLoRA alpha/sqrt(r) = 4")
    # Base weights frozen, only A/B trainable.
    if any(v.requires_grad for v in model.w.values()) or not all(p.requires_grad for p in l.parameters()):
        raise AssertionError("requires_grad flags wrong")
    # Dropout: identity at p = 0; at p > 0 deterministic for a given generator and different from p = 0.
    l.dropout = 0.5
    a = M.forward(model, ids, lora=l, drop_gen=torch.Generator().manual_seed(1))
    b = M.forward(model, ids, lora=l, drop_gen=torch.Generator().manual_seed(1))
    l.dropout = 0.0
    if not torch.equal(a, b) or rel(a, M.forward(model, ids, lora=l)) < 1e-9:
        raise AssertionError("LoRA dropout not deterministic or not applied")


def test_hash_dropout_masks():
    # forja's masks (src/ops/dropout.h, src/kernels/dropout.comp): splitmix64 known answer, the
    # torch int64 hash against plain Python integers, keep rate, one mask per (layer, target).
    if M.dropout_mix64(0) != 0xE220A8397B1DCDAF:
        raise AssertionError("dropout_mix64 is not splitmix64")

    def mix32(v):
        v ^= v >> 16
        v = (v * 0x7FEB352D) & 0xFFFFFFFF
        v ^= v >> 15
        v = (v * 0x846CA68B) & 0xFFFFFFFF
        return v ^ (v >> 16)

    key = M.dropout_key(M.dropout_stream(7, 3, 1), 2, "down")
    keep = M.dropout_keep(key, 23, 101, 0.37)
    th = math.floor(0.37 * 2 ** 32)
    for r in range(23):
        for c in range(101):
            if bool(keep[r, c]) != (mix32(mix32(mix32(c ^ (key >> 32)) ^ r) ^ (key & 0xFFFFFFFF)) >= th):
                raise AssertionError(f"dropout_keep differs from the integer hash at ({r}, {c})")
    big = M.dropout_keep(key, 400, 500, 0.1).double().mean().item()
    if abs(big - 0.9) > 5 * math.sqrt(0.09 / 200000):
        raise AssertionError(f"keep rate {big} is not 0.9")
    s = M.dropout_stream(1, 0, 0)
    if M.dropout_key(s, 0, "q") == M.dropout_key(s, 0, "k") or s == M.dropout_stream(1, 0, 1):
        raise AssertionError("dropout keys collide")
    # In a forward: HashDropout(None) is no dropout, a stream is deterministic and applied.
    model, _ = tiny("qwen3")
    ids = torch.tensor([[7, 8, 9, 10, 11]])
    l = lora_for(model)
    plain = M.forward(model, ids, lora=l)
    l.dropout = 0.5
    a = M.forward(model, ids, lora=l, drop_gen=M.HashDropout(s))
    b = M.forward(model, ids, lora=l, drop_gen=M.HashDropout(s))
    off = M.forward(model, ids, lora=l, drop_gen=M.HashDropout(None))
    if not torch.equal(a, b) or not torch.equal(off, plain) or rel(a, plain) < 1e-9:
        raise AssertionError("hash dropout not deterministic, not applied, or applied with stream None")


# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------


def test_safetensors():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, generator=g)
    # BF16 conversion = torch's round-to-nearest-even, including exact ties and specials.
    probe = torch.cat([x.reshape(-1), torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, float("inf"), -0.0, 1e-40])])
    mine = torch.from_numpy(st.bf16_bits_to_f32(st.f32_to_bf16_bits(probe.numpy())))
    if not torch.equal(mine, probe.to(torch.bfloat16).float()):
        raise AssertionError("bf16 rounding differs from torch")
    with tempfile.TemporaryDirectory() as d:
        for dt in ("F32", "BF16", "F16"):
            p = os.path.join(d, f"t_{dt}.safetensors")
            st.save_file({"b.w": x, "a": torch.arange(4, dtype=torch.float32), "s": torch.tensor(2.5)}, p, dtype=dt)
            with open(p, "rb") as f:
                raw = f.read()
            n = int.from_bytes(raw[:8], "little")
            hdr = json.loads(raw[8:8 + n])
            if n % 8 or hdr["__metadata__"] != {"format": "pt"} or hdr["b.w"]["dtype"] != dt:
                raise AssertionError(f"{dt}: bad header {hdr}")
            back = st.load_file(p)
            want = {"F32": x, "BF16": x.to(torch.bfloat16).float(), "F16": x.half()}[dt]
            if not torch.equal(back["b.w"], want) or back["s"].shape != () or back["s"].item() != 2.5:
                raise AssertionError(f"{dt}: round trip failed")
        # The ST-RS example bytes: one F32 tensor attn.0 [1,2,3], header length 64 (hand-built).
        h = b'{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}'
        h += b" " * (64 - len(h))
        p = os.path.join(d, "strs.safetensors")
        with open(p, "wb") as f:
            f.write((64).to_bytes(8, "little") + h + np.arange(6, dtype="<f4").tobytes())
        if not torch.equal(st.load_file(p)["attn.0"], torch.arange(6.0).reshape(1, 2, 3)):
            raise AssertionError("reader failed on the ST-RS example")
        # A gap between tensors must be rejected.
        with open(p, "wb") as f:
            h2 = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
            h2 += b" " * ((-len(h2)) % 8)
            f.write(len(h2).to_bytes(8, "little") + h2 + bytes(8))
        try:
            st.load_file(p)
        except st.SafetensorsError:
            pass
        else:
            raise AssertionError("gap before the first tensor accepted")


# ---------------------------------------------------------------------------------------------
# End to end through the CLI code path
# ---------------------------------------------------------------------------------------------


def test_reference_run_end_to_end():
    with tempfile.TemporaryDirectory() as d:
        mdir, bpath = os.path.join(d, "model"), os.path.join(d, "batch.json")
        MM.main(["--out", mdir, "--family", "qwen2", "--seed", "4", "--dtype", "BF16"])
        with open(bpath, "w") as f:
            json.dump(MB.make_batch(97, 3, 2, 10, seed=1, pack=True), f)
        out1, out2 = os.path.join(d, "o1"), os.path.join(d, "o2")
        common = ["--model", mdir, "--batch", bpath, "--steps", "4", "--lr", "5e-3", "--schedule", "cosine",
                  "--warmup", "1", "--grad-accum", "2", "--lora-rank", "4", "--targets", "q,v,down",
                  "--max-grad-norm", "0.5", "--weight-decay", "0.01"]
        if RR.main(common + ["--out", out1]) != 0:
            raise AssertionError("reference_run failed")
        adapter = os.path.join(out1, "initial_adapter")
        if RR.main(["--model", mdir, "--batch", bpath, "--steps", "4", "--lr", "5e-3", "--schedule", "cosine",
                    "--warmup", "1", "--grad-accum", "2", "--max-grad-norm", "0.5", "--weight-decay", "0.01",
                    "--adapter", adapter, "--out", out2]) != 0:
            raise AssertionError("reference_run from the written adapter failed")

        def j(o, n):
            with open(os.path.join(o, n)) as f:
                return json.load(f)

        s0, losses, norms = j(out1, "step0_loss.json"), j(out1, "losses.json"), j(out1, "grad_norms.json")
        if len(losses["losses"]) != 4 or len(norms["grad_norms"]) != 4 or losses["losses"][0] != s0["loss"]:
            raise AssertionError("losses.json / grad_norms.json inconsistent")
        if losses["lr"][0] != 0.0 or losses["micro_batches"][:2] != [[0, 1], [2, 0]]:
            raise AssertionError(f"schedule/micro-batch cycling wrong: {losses['lr']} {losses['micro_batches']}")
        ad = st.load_file(os.path.join(adapter, "adapter_model.safetensors"))
        gr = st.load_file(os.path.join(out1, "step0_grads.safetensors"))
        if set(ad) != set(gr) or len(ad) != 2 * 3 * 2 or any(ad[k].shape != gr[k].shape for k in ad):
            raise AssertionError("step0_grads keys/shapes differ from the adapter")
        if set(st.load_dtypes(os.path.join(out1, "step0_grads.safetensors")).values()) != {"F32"}:
            raise AssertionError("grads not F32")
        if any(float(v.abs().max()) == 0 for v in gr.values()):
            raise AssertionError("an all-zero LoRA gradient at step 0")
        # Starting from the written adapter reproduces the run exactly (the C++ side relies on it).
        if j(out2, "losses.json")["losses"] != losses["losses"]:
            raise AssertionError("run from initial_adapter does not reproduce the losses")
        gr2 = st.load_file(os.path.join(out2, "step0_grads.safetensors"))
        if any(not torch.equal(gr[k], gr2[k]) for k in gr):
            raise AssertionError("run from initial_adapter does not reproduce the gradients")
        # Logits file matches an in-process forward of micro-batch 0.
        model = M.BaseModel.load(mdir)
        lora = M.LoRA.load_peft(adapter, model.cfg)
        mb = tensors(MB.make_batch(97, 3, 2, 10, seed=1, pack=True)["micro_batches"][0])
        lg = M.forward(model, mb["input_ids"], mb["position_ids"], mb["segment_ids"], lora).float()
        if not torch.equal(st.load_file(os.path.join(out1, "logits.safetensors"))["logits"], lg):
            raise AssertionError("logits.safetensors differs from an in-process forward")
        # Contradicting flags with an adapter are refused (the error message is expected).
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = RR.main(["--model", mdir, "--batch", bpath, "--adapter", adapter, "--lora-rank", "8",
                          "--steps", "0", "--out", os.path.join(d, "o3")])
        if rc == 0 or "contradict" not in err.getvalue():
            raise AssertionError("--lora-rank contradicting the adapter was accepted")
        log(f"losses {losses['losses']}, norms {norms['grad_norms']}")


def test_parity_cases_generator():
    with tempfile.TemporaryDirectory() as d:
        if PC.main(["--out", d, "--cases", "mistral-subset,qwen3-gqa-bf16", "--steps", "2"]) != 0:
            raise AssertionError("parity_cases.py failed")
        for case in ("mistral-subset", "qwen3-gqa-bf16"):
            with open(os.path.join(d, case, "case.json")) as f:
                c = json.load(f)
            with open(os.path.join(d, case, "ref", "run.json")) as f:
                run = json.load(f)
            if run["steps"] != 2 or "--model" not in c["reference_run"]:
                raise AssertionError(f"{case}: case.json/run.json inconsistent")
        with open(os.path.join(d, "mistral-subset", "ref", "run.json")) as f:
            if json.load(f)["targets"] != ["q", "v", "down"]:
                raise AssertionError("mistral-subset targets not applied")
        # compare.py: identical files pass; a gradient off by 1e-3 relative and a shifted loss fail.
        ref = os.path.join(d, "mistral-subset", "ref")
        g_ref, l_ref = os.path.join(ref, "step0_grads.safetensors"), os.path.join(ref, "losses.json")
        if CMP.main(["--grads", g_ref, g_ref, "--losses", l_ref, l_ref]) != 0:
            raise AssertionError("compare.py rejects identical outputs")
        g = st.load_file(g_ref)
        k = sorted(g)[0]
        g[k] = g[k] + 1e-3 * g[k].abs().max()
        g_bad = os.path.join(d, "bad.safetensors")
        st.save_file(g, g_bad)
        l_bad = os.path.join(d, "bad.json")
        with open(l_ref) as f:
            losses = json.load(f)["losses"]
        with open(l_bad, "w") as f:
            json.dump([losses[0], losses[1] * (1 + 2e-4)], f)
        if CMP.main(["--grads", g_ref, g_bad]) == 0 or CMP.main(["--losses", l_ref, l_bad]) == 0:
            raise AssertionError("compare.py accepts outputs outside tolerance")


# ---------------------------------------------------------------------------------------------


def main():
    global VERBOSE
    ap = argparse.ArgumentParser()
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    a = ap.parse_args()
    VERBOSE = a.verbose
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f) and a.k in n]
    failed = 0
    t_all = time.time()
    for name, fn in tests:
        t = time.time()
        try:
            # The scripts' own progress lines are noise here unless -v.
            with contextlib.redirect_stdout(sys.stdout if VERBOSE else io.StringIO()):
                fn()
            print(f"PASS {name} ({time.time() - t:.2f} s)")
        except Exception:  # noqa: BLE001 - report every failure, keep going
            failed += 1
            print(f"FAIL {name} ({time.time() - t:.2f} s)")
            traceback.print_exc()
    print(f"{len(tests) - failed}/{len(tests)} passed in {time.time() - t_all:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
