"""Independent PyTorch reference for forja's training engine (issue 5).

A readable re-implementation of the causal-LM forward pass of Qwen3, Qwen2/2.5, Llama 3.x and
Mistral exactly as docs/formats.md sections 1.3-1.7 describe it, with PEFT-style LoRA
(section 4.1), the transformers causal-LM loss (6.1), AdamW (6.2), global-norm clipping (6.3)
and the lr schedules (6.4). Gradients come from torch autograd, which is the point: the C++
side writes its backward by hand, this side does not, so the two are independent.

It does not import transformers or PEFT (they are not installed); every rule below is written
from formats.md, which cites the upstream source for each.

Precision: the whole model runs in one "compute dtype" (float64 for parity fixtures, or
float32). The places where transformers deliberately changes precision are kept as rules that
reduce to "at least fp32": RMSNorm statistics, softmax and the loss run in
promote(compute, float32) and are cast back, and the RoPE angles are computed in float32 by
default exactly as transformers does (so fp64 runs see the same cos/sin rounding as HF).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import safetensors_io as st

FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
# Canonical LoRA target order; used everywhere (init order, file order, CLI parsing).
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
TARGET_MODULE = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
IGNORE_INDEX = -100


def _stat_dtype(dt: torch.dtype) -> torch.dtype:
    """transformers upcasts to fp32 for norms/softmax/loss; in an fp64 run we keep fp64."""
    return torch.promote_types(dt, torch.float32)


# ---------------------------------------------------------------------------------------------
# Configuration (formats.md 1.1, 1.7)
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Optional[dict]  # normalised: {"rope_type": ..., ...} or None
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3 only
    qkv_bias: bool  # Qwen2: always; Llama/Qwen3: attention_bias
    o_bias: bool  # Llama/Qwen3: attention_bias; Qwen2: never
    mlp_bias: bool  # Llama: mlp_bias
    sliding_window_layers: Dict[int, int] = field(default_factory=dict)  # layer -> window

    @property
    def n_rep(self) -> int:
        return self.num_heads // self.num_kv_heads

    def linear_shape(self, target: str) -> Tuple[int, int]:
        """(out_features, in_features) of the projection a LoRA target wraps."""
        H, I = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {
            "q": (q, H), "k": (kv, H), "v": (kv, H), "o": (H, q),
            "gate": (I, H), "up": (I, H), "down": (H, I),
        }[target]

    @staticmethod
    def from_dict(c: dict) -> "ModelConfig":
        mt = c.get("model_type")
        if mt not in FAMILIES:
            raise ValueError(f"config.json: model_type {mt!r} is not one of {FAMILIES}")

        def req(key):
            if key not in c or c[key] is None:
                raise ValueError(f"config.json: required key {key!r} missing")
            return c[key]

        H = int(req("hidden_size"))
        nh = int(req("num_attention_heads"))
        nkv = c.get("num_key_value_heads")
        if nkv is None:  # class defaults: Mistral 8, the others = num_attention_heads
            nkv = 8 if mt == "mistral" else nh
        nkv = int(nkv)
        if nh % nkv != 0:
            raise ValueError(f"config.json: num_attention_heads {nh} not divisible by num_key_value_heads {nkv}")
        hd = c.get("head_dim")
        if hd is None:
            # Qwen3Config's class default is 128 (formats.md 1.1); the others use H / heads.
            hd = 128 if mt == "qwen3" else H // nh
        hd = int(hd)
        if hd % 2:
            raise ValueError("config.json: head_dim must be even for half-split RoPE")

        # RoPE: accept top-level rope_theta, a rope_scaling dict, or a rope_parameters dict.
        rp = c.get("rope_parameters") or {}
        theta = c.get("rope_theta", rp.get("rope_theta", 10000.0))
        scaling = c.get("rope_scaling")
        if scaling is None and rp:
            scaling = rp
        if scaling is not None:
            scaling = dict(scaling)
            rt = scaling.get("rope_type", scaling.get("type", "default"))
            scaling["rope_type"] = rt
            if rt == "default":
                scaling = None
            elif rt not in ("llama3", "linear"):
                raise ValueError(f"config.json: rope type {rt!r} not supported by the reference")

        # The forward below hard-codes SwiGLU with SiLU and full-width RoPE: refuse anything else
        # rather than silently computing a different model.
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json: hidden_act {act!r} not supported (only 'silu')")
        prf = c.get("partial_rotary_factor", rp.get("partial_rotary_factor", 1.0))
        if prf not in (None, 1, 1.0):
            raise ValueError(f"config.json: partial_rotary_factor {prf} not supported (only 1.0)")

        attn_bias = bool(c.get("attention_bias", False))
        if mt == "qwen2":
            qkv_bias, o_bias = True, False  # hard-coded in Qwen2Attention
        elif mt == "mistral":
            qkv_bias = o_bias = False  # MistralAttention has no biases
        else:
            qkv_bias = o_bias = attn_bias
        mlp_bias = bool(c.get("mlp_bias", False)) if mt == "llama" else False

        # Sliding windows (formats.md 1.1 notes, 1.7 Mistral).
        L = int(req("num_hidden_layers"))
        windows = {}
        if mt in ("qwen2", "qwen3"):
            if c.get("use_sliding_window", False) and c.get("sliding_window") is not None:
                mwl = int(c.get("max_window_layers", L))
                windows = {i: int(c["sliding_window"]) for i in range(L) if i >= mwl}
        elif mt == "mistral" and c.get("sliding_window") is not None:
            windows = {i: int(c["sliding_window"]) for i in range(L)}

        return ModelConfig(
            model_type=mt,
            vocab_size=int(req("vocab_size")),
            hidden_size=H,
            intermediate_size=int(req("intermediate_size")),
            num_layers=L,
            num_heads=nh,
            num_kv_heads=nkv,
            head_dim=hd,
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            qk_norm=(mt == "qwen3"),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            sliding_window_layers=windows,
        )


def expected_weight_shapes(cfg: ModelConfig) -> Dict[str, Tuple[int, ...]]:
    """All tensor names and shapes of the Hugging Face checkpoint (formats.md 1.2, 1.7),
    excluding lm_head.weight when the model is tied."""
    H, V = cfg.hidden_size, cfg.vocab_size
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        for t in TARGETS:
            out_f, in_f = cfg.linear_shape(t)
            shapes[p + TARGET_MODULE[t] + ".weight"] = (out_f, in_f)
        if cfg.qkv_bias:
            for t in ("q", "k", "v"):
                shapes[p + TARGET_MODULE[t] + ".bias"] = (cfg.linear_shape(t)[0],)
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (H,)
        if cfg.mlp_bias:
            for t in ("gate", "up", "down"):
                shapes[p + TARGET_MODULE[t] + ".bias"] = (cfg.linear_shape(t)[0],)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


# ---------------------------------------------------------------------------------------------
# The frozen base model
# ---------------------------------------------------------------------------------------------


class BaseModel:
    """Frozen weights in the compute dtype plus the config. No nn.Module on purpose: the
    forward below is a plain function so every operation is visible in one place."""

    def __init__(self, cfg: ModelConfig, weights: Dict[str, torch.Tensor], dtype=torch.float64,
                 rope_angle_dtype=torch.float32):
        self.cfg = cfg
        self.dtype = dtype
        # transformers computes inv_freq and the angles in fp32 (autocast off); keep that by
        # default so cos/sin carry the same rounding as HF. float64 is available for experiments.
        self.rope_angle_dtype = rope_angle_dtype
        shapes = expected_weight_shapes(cfg)
        w = dict(weights)
        if cfg.tie_word_embeddings and "lm_head.weight" in w:
            # formats.md 1.2: a tied checkpoint may still carry lm_head.weight; it must equal
            # the embedding (we refuse a silent mismatch).
            if not torch.equal(w["lm_head.weight"], w["model.embed_tokens.weight"]):
                raise ValueError("tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight")
            del w["lm_head.weight"]
        # Old checkpoints may carry rotary inv_freq buffers; they are recomputed, not loaded.
        for k in [k for k in w if k.endswith("rotary_emb.inv_freq")]:
            del w[k]
        missing = sorted(set(shapes) - set(w))
        unexpected = sorted(set(w) - set(shapes))
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            raise ValueError(f"checkpoint has unexpected tensors: {unexpected[:8]}")
        for k, shp in shapes.items():
            if tuple(w[k].shape) != tuple(shp):
                raise ValueError(f"tensor {k} has shape {tuple(w[k].shape)}, expected {shp}")
        # Frozen: requires_grad False, upcast (exactly) to the compute dtype.
        self.w = {k: v.to(dtype).detach().requires_grad_(False) for k, v in w.items()}

    def lm_head(self) -> torch.Tensor:
        if self.cfg.tie_word_embeddings:
            return self.w["model.embed_tokens.weight"]
        return self.w["lm_head.weight"]

    @staticmethod
    def load(model_dir: str, dtype=torch.float64, **kw) -> "BaseModel":
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = ModelConfig.from_dict(json.load(f))
        return BaseModel(cfg, load_checkpoint(model_dir), dtype=dtype, **kw)


def load_checkpoint(model_dir: str) -> Dict[str, torch.Tensor]:
    """model.safetensors, or the shards listed in model.safetensors.index.json (formats.md 2.2)."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return st.load_file(single)
    idx_path = os.path.join(model_dir, "model.safetensors.index.json")
    if not os.path.exists(idx_path):
        raise FileNotFoundError(f"{model_dir}: neither model.safetensors nor model.safetensors.index.json")
    with open(idx_path) as f:
        wm = json.load(f)["weight_map"]
    out = {}
    for shard in sorted(set(wm.values())):
        out.update(st.load_file(os.path.join(model_dir, shard)))
    return out


# ---------------------------------------------------------------------------------------------
# LoRA (formats.md 4.1, 4.3)
# ---------------------------------------------------------------------------------------------


def peft_key(layer: int, target: str, which: str) -> str:
    """which in {"A", "B"} -> the PEFT adapter_model.safetensors key (adapter name removed)."""
    return f"base_model.model.model.layers.{layer}.{TARGET_MODULE[target]}.lora_{which}.weight"


class LoRA:
    """Trainable A [r, in] and B [out, r] per (layer, target); everything else frozen."""

    def __init__(self, cfg: ModelConfig, rank: int, alpha: float, targets: Sequence[str],
                 use_rslora: bool = False, dropout: float = 0.0, dtype=torch.float64):
        for t in targets:
            if t not in TARGETS:
                raise ValueError(f"unknown LoRA target {t!r}; use {TARGETS}")
        self.cfg = cfg
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.use_rslora = bool(use_rslora)
        self.dropout = float(dropout)
        self.dtype = dtype
        self.targets = [t for t in TARGETS if t in set(targets)]  # canonical order
        self.A: Dict[Tuple[int, str], torch.Tensor] = {}
        self.B: Dict[Tuple[int, str], torch.Tensor] = {}

    @property
    def scale(self) -> float:
        # PEFT: alpha / r, or alpha / sqrt(r) with rsLoRA.
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def keys(self) -> List[Tuple[int, str]]:
        return [(i, t) for i in range(self.cfg.num_layers) for t in self.targets]

    def parameters(self) -> List[torch.Tensor]:
        """Trainable tensors in a fixed order: for each (layer, target): A then B."""
        ps = []
        for k in self.keys():
            ps += [self.A[k], self.B[k]]
        return ps

    def named_parameters(self) -> List[Tuple[str, torch.Tensor]]:
        out = []
        for (i, t) in self.keys():
            out.append((peft_key(i, t, "A"), self.A[(i, t)]))
            out.append((peft_key(i, t, "B"), self.B[(i, t)]))
        return out

    def _set(self, key, A, B):
        out_f, in_f = self.cfg.linear_shape(key[1])
        if tuple(A.shape) != (self.rank, in_f) or tuple(B.shape) != (out_f, self.rank):
            raise ValueError(f"LoRA {key}: A {tuple(A.shape)} / B {tuple(B.shape)} do not match "
                             f"[r={self.rank}, in={in_f}] / [out={out_f}, r]")
        self.A[key] = A.to(self.dtype).detach().clone().requires_grad_(True)
        self.B[key] = B.to(self.dtype).detach().clone().requires_grad_(True)

    def init_random(self, seed: int, b_std: float = 0.05):
        """A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_(a=sqrt(5)), formats.md 4.1).
        B is NOT zero here (PEFT's B = 0 would make every A gradient exactly zero and hide
        bugs in the A path); it is N(0, b_std^2). Values are rounded to float32 so that the
        adapter saved as F32 is exactly the start the fp64 reference used."""
        g = torch.Generator().manual_seed(int(seed))
        for key in self.keys():
            out_f, in_f = self.cfg.linear_shape(key[1])
            bound = 1.0 / math.sqrt(in_f)
            A = (torch.rand(self.rank, in_f, generator=g, dtype=torch.float64) * 2 - 1) * bound
            B = torch.randn(out_f, self.rank, generator=g, dtype=torch.float64) * b_std
            self._set(key, A.float(), B.float())

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.named_parameters()}

    def grads_state_dict(self) -> Dict[str, torch.Tensor]:
        """Gradients under the same keys as the adapter tensors (zeros if no grad yet)."""
        return {k: (v.grad.detach().clone() if v.grad is not None else torch.zeros_like(v))
                for k, v in self.named_parameters()}

    def adapter_config(self, base_model_name: str = "forja-reference-random") -> dict:
        """A minimal, correct PEFT adapter_config.json (formats.md 4.2)."""
        return {
            "alpha_pattern": {},
            "base_model_name_or_path": base_model_name,
            "bias": "none",
            "fan_in_fan_out": False,
            "inference_mode": True,
            "init_lora_weights": True,
            "lora_alpha": self.alpha if not float(self.alpha).is_integer() else int(self.alpha),
            "lora_dropout": self.dropout,
            "modules_to_save": None,
            "peft_type": "LORA",
            "r": self.rank,
            "rank_pattern": {},
            "target_modules": sorted(TARGET_MODULE[t].split(".")[1] for t in self.targets),
            "task_type": "CAUSAL_LM",
            "use_dora": False,
            "use_rslora": self.use_rslora,
        }

    def save_peft(self, out_dir: str, base_model_name: str = "forja-reference-random"):
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
            json.dump(self.adapter_config(base_model_name), f, indent=2, sort_keys=True)
            f.write("\n")
        st.save_file(self.state_dict(), os.path.join(out_dir, "adapter_model.safetensors"), dtype="F32")

    @staticmethod
    def load_peft(adapter_dir: str, cfg: ModelConfig, dtype=torch.float64) -> "LoRA":
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            ac = json.load(f)
        if ac.get("peft_type") != "LORA":
            raise ValueError(f"{adapter_dir}: peft_type is {ac.get('peft_type')!r}, expected LORA")
        if ac.get("use_dora"):
            raise ValueError(f"{adapter_dir}: DoRA adapters are not supported")
        if ac.get("rank_pattern") or ac.get("alpha_pattern"):
            raise ValueError(f"{adapter_dir}: rank_pattern/alpha_pattern are not supported by the reference")
        tm = ac.get("target_modules")
        if isinstance(tm, str):
            if tm == "all-linear":
                tm = [TARGET_MODULE[t].split(".")[1] for t in TARGETS]
            else:
                raise ValueError(f"{adapter_dir}: regex target_modules are not supported")
        short = {TARGET_MODULE[t].split(".")[1]: t for t in TARGETS}
        bad = [m for m in tm if m not in short]
        if bad:
            raise ValueError(f"{adapter_dir}: unsupported target modules {bad}")
        lora = LoRA(cfg, ac["r"], ac["lora_alpha"], [short[m] for m in tm],
                    use_rslora=ac.get("use_rslora", False), dropout=ac.get("lora_dropout", 0.0), dtype=dtype)
        tensors = st.load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
        expected = set()
        for key in lora.keys():
            ka, kb = peft_key(*key, "A"), peft_key(*key, "B")
            expected |= {ka, kb}
            if ka not in tensors or kb not in tensors:
                raise ValueError(f"{adapter_dir}: missing {ka} or {kb}")
            lora._set(key, tensors[ka], tensors[kb])
        extra = sorted(set(tensors) - expected)
        if extra:
            raise ValueError(f"{adapter_dir}: unexpected tensors {extra[:6]}")
        return lora


# ---------------------------------------------------------------------------------------------
# Building blocks (formats.md 1.4-1.6)
# ---------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Statistics in (at least) fp32, cast the normalised value back to the input dtype FIRST,
    then multiply by the weight (formats.md 1.4: the multiply runs in the weight's dtype)."""
    in_dtype = x.dtype
    xs = x.to(_stat_dtype(in_dtype))
    var = xs.pow(2).mean(dim=-1, keepdim=True)
    y = xs * torch.rsqrt(var + eps)
    return weight * y.to(in_dtype)


def rope_inv_freq(cfg: ModelConfig, dtype=torch.float32) -> torch.Tensor:
    """inv_freq[j] = 1 / theta^(2j/dim), the exponent as an int64 arange cast to the angle
    dtype and divided by dim (T-RoPE default), then llama3 / linear scaling (formats.md 1.7)."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))
    sc = cfg.rope_scaling
    if sc is None:
        return inv
    if sc["rope_type"] == "linear":
        return inv / float(sc["factor"])
    # llama3: keep high frequencies, divide low ones by factor, blend the middle band.
    f = float(sc["factor"])
    lf = float(sc["low_freq_factor"])
    hf = float(sc["high_freq_factor"])
    lo = float(sc["original_max_position_embeddings"])
    low_wavelen = lo / lf
    high_wavelen = lo / hf
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wavelen, inv / f, inv)
    smooth = (lo / wavelen - lf) / (hf - lf)
    smoothed = (1 - smooth) * inv_l / f + smooth * inv_l
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, inv_l)


def rope_cos_sin(cfg: ModelConfig, position_ids: torch.Tensor, angle_dtype, out_dtype):
    """cos/sin of shape [B, S, head_dim] (emb = concat(freqs, freqs)); attention_scaling is
    1.0 for the default, linear and llama3 types."""
    inv = rope_inv_freq(cfg, angle_dtype)
    freqs = position_ids.to(angle_dtype)[..., None] * inv  # [B, S, dim/2], same as HF's K=1 matmul
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(out_dtype), emb.sin().to(out_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Half-split layout: element j pairs with j + d/2 (not with j + 1)."""
    d2 = x.shape[-1] // 2
    return torch.cat([-x[..., d2:], x[..., :d2]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, heads, S, d]; cos/sin: [B, S, d]."""
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + rotate_half(x) * sin


def attention_mask(B: int, S: int, segment_ids: Optional[torch.Tensor], window: Optional[int]) -> torch.Tensor:
    """Boolean [B, 1, S, S] 'may attend' mask.

    - causal by sequence index (key index <= query index);
    - with segment_ids (packing): only keys of the same segment, and never segment 0
      (padding). A padding query therefore sees nothing; forward() makes its attention
      output exactly 0 (the convention of forja's C++ op reference, src/ops/ref/attention_ref.h);
    - sliding windows are only checked, not implemented: they must not bite.
    """
    i = torch.arange(S)
    allowed = (i[None, :] <= i[:, None]).expand(B, S, S).clone()
    if window is not None and S > window:
        raise NotImplementedError(f"sequence length {S} exceeds the sliding window {window}; "
                                  "the reference does not implement sliding-window attention")
    if segment_ids is not None:
        seg = segment_ids
        same = seg[:, :, None] == seg[:, None, :]
        allowed &= same & (seg[:, None, :] != 0)
    return allowed[:, None]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, nkv, S, d] -> [B, nkv*n_rep, S, d] with query head h reading KV head h // n_rep."""
    if n_rep == 1:
        return x
    B, nkv, S, d = x.shape
    return x[:, :, None].expand(B, nkv, n_rep, S, d).reshape(B, nkv * n_rep, S, d)


# ---------------------------------------------------------------------------------------------
# forja's counter-based LoRA dropout masks (src/ops/dropout.h, src/kernels/dropout.comp),
# re-implemented here so that a parity run can apply exactly forja's masks.
# ---------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


def dropout_mix64(z: int) -> int:
    """splitmix64's output function of z + golden gamma (Python ints, mod 2^64)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def dropout_stream(seed: int, step: int, micro_batch: int) -> int:
    return dropout_mix64(dropout_mix64(dropout_mix64(seed & _M64) ^ step) ^ micro_batch)


def dropout_key(stream: int, layer: int, target: str) -> int:
    return dropout_mix64(stream ^ dropout_mix64(layer * 8 + TARGETS.index(target)))


def _mul32(v: torch.Tensor, c: int) -> torch.Tensor:
    """v * c mod 2^32 for int64 v in [0, 2^32): split c in 16-bit halves so no product overflows."""
    return (v * (c & 0xFFFF) + (((v * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(v: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' lowbias32 on int64 tensors holding uint32 values."""
    v = v ^ (v >> 16)
    v = _mul32(v, 0x7FEB352D)
    v = v ^ (v >> 15)
    v = _mul32(v, 0x846CA68B)
    return v ^ (v >> 16)


def dropout_keep(key: int, rows: int, cols: int, p: float) -> torch.Tensor:
    """bool [rows, cols]: keep(row, col) = mix(mix(mix(col ^ key_hi) ^ row) ^ key_lo) >= floor(p 2^32)."""
    lo, hi = key & _M32, key >> 32
    row = torch.arange(rows, dtype=torch.int64)[:, None]
    col = torch.arange(cols, dtype=torch.int64)[None, :]
    h = _mix32(_mix32(_mix32(col ^ hi) ^ row) ^ lo)
    return h >= math.floor(p * 4294967296.0)


class HashDropout:
    """Pass as `drop_gen` to apply forja's masks for one micro-batch: stream =
    dropout_stream(seed, step, micro_batch); None = no dropout (forja's forward-only runs)."""

    def __init__(self, stream: Optional[int]):
        self.stream = stream


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------


def linear(x, model: BaseModel, layer: int, target: str, lora: Optional[LoRA], drop_gen):
    """y = x W^T (+ b) + scale * (dropout(x) A^T) B^T (formats.md 4.1)."""
    name = f"model.layers.{layer}.{TARGET_MODULE[target]}"
    y = x @ model.w[name + ".weight"].t()
    b = model.w.get(name + ".bias")
    if b is not None:
        y = y + b
    if lora is not None and (layer, target) in lora.A:
        A, B = lora.A[(layer, target)], lora.B[(layer, target)]
        xd = x.to(A.dtype)
        if lora.dropout > 0 and isinstance(drop_gen, HashDropout):
            # forja's masks: rows are the micro-batch's tokens (b * S + s), columns the features
            if drop_gen.stream is not None:
                rows = xd.numel() // xd.shape[-1]
                keep = dropout_keep(dropout_key(drop_gen.stream, layer, target), rows, xd.shape[-1], lora.dropout)
                xd = xd * keep.view(xd.shape).to(xd.dtype) / (1.0 - lora.dropout)
        elif lora.dropout > 0:
            # nn.Dropout semantics: zero with prob p, scale the rest by 1/(1-p). Needs its own
            # generator so runs are reproducible.
            keep = torch.rand(xd.shape, generator=drop_gen, dtype=torch.float64) >= lora.dropout
            xd = xd * keep.to(xd.dtype) / (1.0 - lora.dropout)
        y = y + (lora.scale * ((xd @ A.t()) @ B.t())).to(y.dtype)
    return y


def forward(model: BaseModel, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None,
            segment_ids: Optional[torch.Tensor] = None, lora: Optional[LoRA] = None,
            drop_gen: Optional[torch.Generator] = None) -> torch.Tensor:
    """Logits [B, S, V] in the compute dtype (formats.md 1.3)."""
    cfg, w, dt = model.cfg, model.w, model.dtype
    B, S = input_ids.shape
    nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if position_ids is None:
        position_ids = torch.arange(S).expand(B, S)
    if lora is not None and lora.dropout > 0 and drop_gen is None:
        drop_gen = torch.Generator().manual_seed(0)

    x = w["model.embed_tokens.weight"][input_ids]  # no sqrt(H) scaling
    cos, sin = rope_cos_sin(cfg, position_ids, model.rope_angle_dtype, dt)
    masks = {}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        win = cfg.sliding_window_layers.get(i)
        if win not in masks:
            masks[win] = attention_mask(B, S, segment_ids, win)
        mask = masks[win]
        row_any = mask.any(dim=-1, keepdim=True)  # [B, 1, S, 1]

        # --- attention block ---
        r = x
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        q = linear(h, model, i, "q", lora, drop_gen).view(B, S, nh, d)
        k = linear(h, model, i, "k", lora, drop_gen).view(B, S, nkv, d)
        v = linear(h, model, i, "v", lora, drop_gen).view(B, S, nkv, d)
        if cfg.qk_norm:  # Qwen3: per head over d, one shared [d] weight, BEFORE RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, S, d]
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k, v = repeat_kv(k, cfg.n_rep), repeat_kv(v, cfg.n_rep)
        scores = (q @ k.transpose(-1, -2)) * (d ** -0.5)
        scores = scores.masked_fill(~mask, float("-inf"))
        # Rows that see no key (padding queries): give softmax a finite row, then zero it, so
        # the output is 0 and no NaN reaches the gradients.
        scores = scores.masked_fill(~row_any, 0.0)
        probs = torch.softmax(scores.to(_stat_dtype(dt)), dim=-1).to(dt)  # softmax in >= fp32
        probs = probs * row_any.to(dt)
        o = (probs @ v).transpose(1, 2).reshape(B, S, nh * d)
        x = r + linear(o, model, i, "o", lora, drop_gen)

        # --- MLP block (SwiGLU) ---
        r = x
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        g = linear(h, model, i, "gate", lora, drop_gen)
        u = linear(h, model, i, "up", lora, drop_gen)
        x = r + linear(F.silu(g) * u, model, i, "down", lora, drop_gen)

    x = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    return x @ model.lm_head().t()


# ---------------------------------------------------------------------------------------------
# Loss (formats.md 6.1)
# ---------------------------------------------------------------------------------------------

NUM_ITEMS_SHIFTED = "shifted"  # count labels[:, 1:] != -100: the number of terms in the sum (default)
NUM_ITEMS_UNSHIFTED = "unshifted"  # count labels != -100, as transformers' Trainer does


def count_num_items(labels_list: Sequence[torch.Tensor], mode: str = NUM_ITEMS_SHIFTED) -> int:
    """num_items over ALL micro-batches of one optimizer step.

    transformers' Trainer counts the UNSHIFTED labels, so a sequence whose position 0 carries
    a real label is counted one more time than it contributes a term (that label has no
    logit predicting it). forja defines num_items as the count of SHIFTED targets, which is
    exactly the number of cross-entropy terms; the two agree whenever labels[:, 0] == -100
    (always true for SFT, where position 0 is a prompt token)."""
    if mode == NUM_ITEMS_SHIFTED:
        return int(sum((lab[:, 1:] != IGNORE_INDEX).sum().item() for lab in labels_list))
    if mode == NUM_ITEMS_UNSHIFTED:
        return int(sum((lab != IGNORE_INDEX).sum().item() for lab in labels_list))
    raise ValueError(f"num_items mode must be {NUM_ITEMS_SHIFTED!r} or {NUM_ITEMS_UNSHIFTED!r}")


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position cross-entropy [B, S-1] (0 where ignored): logit t scored against label t+1.
    Logits are upcast to (at least) fp32 as transformers does."""
    lg = logits[:, :-1].to(_stat_dtype(logits.dtype))
    tg = labels[:, 1:]
    V = lg.shape[-1]
    ce = F.cross_entropy(lg.reshape(-1, V), tg.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none")
    return ce.view(tg.shape)


def loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropy terms of one micro-batch (divide by num_items outside)."""
    return token_losses(logits, labels).sum()


def validate_micro_batch(mb: dict, vocab_size: int) -> None:
    """Reject inputs whose meaning would be ambiguous. In particular, with packing the loss is
    purely label-based (formats.md 6.1), so a counted target must not cross a segment boundary
    or sit on padding: the data builder must put -100 there (as HF's flattening collator
    does for the first token of each packed document)."""
    ids, lab = mb["input_ids"], mb["labels"]
    if ids.dim() != 2 or ids.shape != lab.shape:
        raise ValueError(f"input_ids {tuple(ids.shape)} and labels {tuple(lab.shape)} must be equal [B, S]")
    if ids.shape[1] < 2:
        raise ValueError("sequence length must be at least 2")
    if (ids < 0).any() or (ids >= vocab_size).any():
        raise ValueError("input_ids out of range of the vocabulary")
    if ((lab != IGNORE_INDEX) & ((lab < 0) | (lab >= vocab_size))).any():
        raise ValueError("labels must be -100 or a valid token id")
    for key in ("position_ids", "segment_ids"):
        if mb.get(key) is not None and mb[key].shape != ids.shape:
            raise ValueError(f"{key} must have the shape of input_ids")
    seg = mb.get("segment_ids")
    if seg is not None:
        if (seg < 0).any():
            raise ValueError("segment_ids must be >= 0 (0 = padding)")
        tgt = lab[:, 1:] != IGNORE_INDEX
        bad = tgt & ((seg[:, 1:] == 0) | (seg[:, 1:] != seg[:, :-1]))
        if bad.any():
            b, t = [int(v) for v in bad.nonzero()[0]]
            raise ValueError(f"label at [{b}, {t + 1}] is counted but its target crosses a segment "
                             "boundary or lies on padding; set it to -100")


def step_objective(model: BaseModel, lora: Optional[LoRA], micro_batches: Sequence[dict],
                   num_items: int, drop_gen=None) -> Tuple[torch.Tensor, List[float]]:
    """sum over micro-batches of (sum of CE terms) / num_items, the token mean over the whole
    optimizer step (not a mean of per-micro-batch means). Returns (loss tensor, per-mb values)."""
    if num_items <= 0:
        raise ValueError("num_items is 0: no label in this optimizer step is != -100")
    total = None
    parts = []
    for mb in micro_batches:
        logits = forward(model, mb["input_ids"], mb.get("position_ids"), mb.get("segment_ids"), lora, drop_gen)
        l = loss_sum(logits, mb["labels"]) / num_items
        parts.append(float(l.detach()))
        total = l if total is None else total + l
    return total, parts


# ---------------------------------------------------------------------------------------------
# Optimiser, clipping, schedules (formats.md 6.2-6.4)
# ---------------------------------------------------------------------------------------------


class AdamW:
    """AdamW written out by hand, in the order of torch/optim/adamw.py (single-tensor path):
    decoupled decay first, moments, bias corrections, eps AFTER the bias correction of sqrt(v)."""

    def __init__(self, params: List[torch.Tensor], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self.params = list(params)
        self.lr = float(lr)
        self.b1, self.b2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)
        self.wd = float(weight_decay)
        self.t = 0
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self, lr: Optional[float] = None):
        lr = self.lr if lr is None else float(lr)
        self.t += 1
        bc1 = 1 - self.b1 ** self.t
        bc2 = 1 - self.b2 ** self.t
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad
            p.mul_(1 - lr * self.wd)
            m.mul_(self.b1).add_(g, alpha=1 - self.b1)
            v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
            denom = (v.sqrt() / math.sqrt(bc2)).add_(self.eps)
            p.addcdiv_(m, denom, value=-(lr / bc1))


@torch.no_grad()
def clip_grad_norm(params: List[torch.Tensor], max_norm: Optional[float]) -> float:
    """Global L2 norm over all gradients; scale by min(1, max_norm / (norm + 1e-6)).
    Returns the UNCLIPPED norm. max_norm None or <= 0 means: measure only."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, 2) for g in grads]), 2)
    if max_norm is not None and max_norm > 0:
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return float(total)


SCHEDULES = ("constant", "linear", "cosine")


def lr_multiplier(schedule: str, step: int, warmup: int, total: int, num_cycles: float = 0.5) -> float:
    """Multiplier on the base lr at optimizer step `step` (0-based: the first optimizer step
    uses step 0, so with warmup > 0 the first update has lr 0), as transformers'
    get_{constant,linear,cosine}_schedule_with_warmup."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, float(total - step) / float(max(1, total - warmup)))
    if schedule == "cosine":
        p = float(step - warmup) / float(max(1, total - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * p)))
    raise ValueError(f"unknown schedule {schedule!r}; use {SCHEDULES}")
