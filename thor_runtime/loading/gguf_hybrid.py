"""GGUF Gated-DeltaNet hybrids (llama.cpp's ``qwen35`` / ``qwen3next``) -> HybridConfig + the HF
checkpoint's own tensors, so HybridModel runs a GGUF exactly as it runs the safetensors.

Tensor names are the ``gguf`` package's. llama.cpp's converter rewrites these checkpoints (its
Qwen3NextModel, and Qwen3_5TextModel on top of it); each rewrite is undone here:

* ``A_log`` is stored as ``ssm_a = -exp(A_log)``;
* the norms the model applies as (1 + w) (layer, final, q/k) are stored as ``w + 1``; the GDN
  output norm (``ssm_norm``) is a plain scale and is stored as is;
* ``dt_bias`` is stored as ``ssm_dt.bias``; ``conv1d`` [C, 1, k] is stored squeezed, [C, k];
* Qwen3-Next: ``in_proj_qkvz`` (rows grouped per key head: q, k, v.., z..) is split into
  ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (z); ``in_proj_ba`` is kept whole (``ssm_ba``);
* Qwen3.5 with more value than key heads: every value-head axis (v rows of ``attn_qkv`` and of
  the conv, ``attn_gate``, ``ssm_beta``/``ssm_alpha`` rows, ``ssm_a``, ``ssm_dt``, ``ssm_out``
  columns) is reordered from grouped by key head (value head g*r + j) to tiled (j*Hk + g).

Mixture-of-experts blocks (``qwen35moe``, Qwen3-Next's experts) are refused. The gguf package
names only expert FFNs for ``qwen3next``, so a dense-MLP Qwen3-Next file uses the ``ffn_gate`` /
``ffn_up`` / ``ffn_down`` names ``qwen35`` has. Multi-token-prediction blocks that a converter
appends after the decoder layers are skipped.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..errors import ThorError
from ..hybrid.config import HybridConfig

# llama.cpp architecture -> our arch name
HYBRID_GGUF_ARCH = {"qwen35": "qwen3_5", "qwen3next": "qwen3_next"}
MOE_GGUF_ARCH = ("qwen35moe",)
_MOE_TENSORS = ("ffn_gate_inp", "_exps", "_shexp")  # router, experts, shared expert


def is_hybrid_arch(arch) -> bool:
    return arch in HYBRID_GGUF_ARCH or arch in MOE_GGUF_ARCH


def _refuse_moe(path, what: str):
    raise ThorError(f"{path}: {what}: mixture-of-experts MLP blocks are not supported from GGUF yet "
                    "(dense-MLP Qwen3.5 / Qwen3-Next GGUFs load)")


def hybrid_gguf_config(reader, path: str | Path, arch: str) -> HybridConfig:
    from .gguf_weights import field_value

    if arch in MOE_GGUF_ARCH:
        _refuse_moe(path, f"architecture {arch!r}")

    def get(key, default=None):
        v = field_value(reader, f"{arch}.{key}", default)
        if v is None:
            raise ThorError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v

    if int(get("expert_count", 0)) > 0:
        _refuse_moe(path, f"{arch}.expert_count = {get('expert_count')}")
    scaling = field_value(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ThorError(f"{path}: rope scaling {scaling!r} is not supported for hybrid targets (default only)")
    # block_count counts the MTP blocks a converter may append after the decoder layers
    n = int(get("block_count")) - int(get("nextn_predict_layers", 0))
    heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    every = int(get("full_attention_interval", 4))
    if every <= 0:
        raise ThorError(f"{path}: {arch}.full_attention_interval must be positive, got {every}")
    # llama.cpp's rule, as HF's default layer_types: every every-th layer is full attention
    types = tuple("full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n))
    hv, inner = int(get("ssm.time_step_rank")), int(get("ssm.inner_size"))
    if hv <= 0 or inner % hv:
        raise ThorError(f"{path}: {arch}.ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {hv}")
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        raise ThorError(f"{path}: GGUF has no token_embd.weight")
    return HybridConfig(
        arch=HYBRID_GGUF_ARCH[arch], vocab_size=int(get("vocab_size", int(emb.shape[-1]))), hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")), num_layers=n, num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)), head_dim=head_dim,
        # stored as f32: its shortest decimal is the checkpoint's value (1e-6, not 9.99999997e-7)
        rms_eps=float(str(np.float32(get("attention.layer_norm_rms_epsilon", 1e-6)))),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        max_position_embeddings=int(get("context_length", 2048)),
        name=str(field_value(reader, "general.name", Path(path).stem)),
        layer_types=types, linear_num_key_heads=int(get("ssm.group_count")), linear_num_value_heads=hv,
        linear_key_head_dim=int(get("ssm.state_size")), linear_value_head_dim=inner // hv,
        linear_conv_kernel=int(get("ssm.conv_kernel")),
        partial_rotary_factor=_rotary_factor(int(get("rope.dimension_count", head_dim)), head_dim),
    )


def _rotary_factor(rot: int, head_dim: int) -> float:
    """The fraction whose int(head_dim * f) gives back ``rot`` (the file stores the count)."""
    f = rot / head_dim
    return f if int(head_dim * f) == rot else math.nextafter(f, 1.0)


# ---- tensors --------------------------------------------------------------------------------
SHIFTED = "shifted"   # stored w + 1
NEG_EXP = "neg_exp"   # stored -exp(A_log)
CONV = "conv"         # stored squeezed


def tensor_plan(cfg: HybridConfig) -> dict[str, tuple[str, tuple[int, ...], str | None]]:
    """{GGUF name: (HF name, shape as stored rows-first, how it was rewritten)}. Qwen3-Next's
    ``attn_qkv`` / ``attn_gate`` both feed ``in_proj_qkvz`` (fused again in hybrid_gguf_weights)."""
    import gguf

    T, M = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    D, I, Dh, V = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size
    H, Hk = cfg.num_heads, cfg.num_kv_heads
    Hv, Vd, dv = cfg.linear_num_value_heads, cfg.value_dim, cfg.linear_value_head_dim
    plan = {T[M.TOKEN_EMBD] + ".weight": ("model.embed_tokens.weight", (V, D), None),
            T[M.OUTPUT_NORM] + ".weight": ("model.norm.weight", (D,), SHIFTED)}
    if not cfg.tie_word_embeddings:
        plan[T[M.OUTPUT] + ".weight"] = ("lm_head.weight", (V, D), None)

    def put(i, t, hf, shape, how=None, suffix=".weight"):
        plan[T[t].format(bid=i) + suffix] = (f"model.layers.{i}.{hf}", shape, how)

    for i, kind in enumerate(cfg.layer_types):
        put(i, M.ATTN_NORM, "input_layernorm.weight", (D,), SHIFTED)
        put(i, M.ATTN_POST_NORM, "post_attention_layernorm.weight", (D,), SHIFTED)
        put(i, M.FFN_GATE, "mlp.gate_proj.weight", (I, D))
        put(i, M.FFN_UP, "mlp.up_proj.weight", (I, D))
        put(i, M.FFN_DOWN, "mlp.down_proj.weight", (D, I))
        if kind == "full_attention":
            put(i, M.ATTN_Q, "self_attn.q_proj.weight", (2 * H * Dh, D))   # query and its gate, per head
            put(i, M.ATTN_K, "self_attn.k_proj.weight", (Hk * Dh, D))
            put(i, M.ATTN_V, "self_attn.v_proj.weight", (Hk * Dh, D))
            put(i, M.ATTN_OUT, "self_attn.o_proj.weight", (D, H * Dh))
            put(i, M.ATTN_Q_NORM, "self_attn.q_norm.weight", (Dh,), SHIFTED)
            put(i, M.ATTN_K_NORM, "self_attn.k_norm.weight", (Dh,), SHIFTED)
            continue
        g = "linear_attn."
        put(i, M.SSM_CONV1D, g + "conv1d.weight", (cfg.conv_dim, cfg.linear_conv_kernel), CONV)
        put(i, M.SSM_A, g + "A_log", (Hv,), NEG_EXP, suffix="")
        put(i, M.SSM_DT, g + "dt_bias", (Hv,), suffix=".bias")
        put(i, M.SSM_NORM, g + "norm.weight", (dv,))
        put(i, M.SSM_OUT, g + "out_proj.weight", (D, Vd))
        if cfg.arch == "qwen3_next":
            put(i, M.ATTN_QKV, g + "in_proj_qkvz.weight", (cfg.conv_dim, D))
            put(i, M.ATTN_GATE, g + "in_proj_qkvz.weight", (Vd, D))
            put(i, M.SSM_BETA_ALPHA, g + "in_proj_ba.weight", (2 * Hv, D))
        else:
            put(i, M.ATTN_QKV, g + "in_proj_qkv.weight", (cfg.conv_dim, D))
            put(i, M.ATTN_GATE, g + "in_proj_z.weight", (Vd, D))
            put(i, M.SSM_BETA, g + "in_proj_b.weight", (Hv, D))
            put(i, M.SSM_ALPHA, g + "in_proj_a.weight", (Hv, D))
    return plan


def _stored_shape(t) -> tuple[int, ...]:
    return tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first


def _dequantize(t, path) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType(t.tensor_type)
    try:
        arr = quants.dequantize(t.data, qtype)
    except NotImplementedError:
        raise ThorError(f"{path}: tensor {t.name} has unsupported GGUF type {qtype.name}") from None
    arr = np.array(arr, dtype=np.float32).reshape(_stored_shape(t))  # own, writable copy
    return torch.from_numpy(arr)


def untile(x: torch.Tensor, dim: int, num_k_heads: int, per_k: int, head_dim: int) -> torch.Tensor:
    """Value heads along ``dim`` from tiled order (j*Hk + g) back to grouped by key head (g*r + j)."""
    shape = list(x.shape)
    x = x.reshape(*shape[:dim], per_k, num_k_heads, head_dim, *shape[dim + 1:])
    return x.transpose(dim, dim + 1).reshape(shape).contiguous()


def _preimage(stored: torch.Tensor, forward, guess: torch.Tensor, steps: int = 4) -> torch.Tensor:
    """The fp32 value, per element, whose ``forward`` (what HybridModel computes from the HF tensor)
    gives back ``stored`` bit for bit, searched within ``steps`` ulps of ``guess``; the guess where
    none does. Where the file's value was computed from an fp32 weight by the same formula there is
    one, and the GGUF then runs bit for bit as the safetensors do."""
    out, todo = guess.clone(), forward(guess) != stored
    lo = hi = guess
    for _ in range(steps):
        if not bool(todo.any()):
            break
        hi, lo = torch.nextafter(hi, torch.tensor(math.inf)), torch.nextafter(lo, torch.tensor(-math.inf))
        for cand in (hi, lo):
            hit = todo & (forward(cand) == stored)
            out[hit] = cand[hit]
            todo &= ~hit
    return out


def _check(tensors: dict, plan: dict, path) -> None:
    for name, (_, shape, _) in plan.items():
        t = tensors.get(name)
        if t is None:
            raise ThorError(f"{path}: missing tensor {name}")
        if _stored_shape(t) != shape:
            raise ThorError(f"{path}: tensor {name} has shape {list(_stored_shape(t))}, expected {list(shape)}")


def hybrid_gguf_weights(reader, cfg: HybridConfig, path: str | Path) -> dict[str, torch.Tensor]:
    """Dequantized fp32 tensors under their HF names, every converter rewrite undone."""
    tensors = {t.name: t for t in reader.tensors}
    moe = next((n for n in tensors if any(m in n for m in _MOE_TENSORS)), None)
    if moe is not None:
        _refuse_moe(path, f"tensor {moe}")
    plan = tensor_plan(cfg)
    _check(tensors, plan, path)
    Hk, dv = cfg.linear_num_key_heads, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // Hk
    tiled = cfg.arch == "qwen3_5" and r > 1
    out: dict[str, torch.Tensor] = {}
    halves: dict[str, dict[str, torch.Tensor]] = {}   # Qwen3-Next: the two parts of in_proj_qkvz
    for name, (hf, _, how) in plan.items():
        x = _dequantize(tensors[name], path)
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if tiled and kind in ("attn_qkv", "ssm_conv1d"):        # [C, D] / [C, k]: only the v rows
            qk = 2 * cfg.key_dim
            x = torch.cat([x[:qk], untile(x[qk:], 0, Hk, r, dv)])
        elif tiled and kind in ("attn_gate", "ssm_beta", "ssm_alpha", "ssm_a", "ssm_dt"):
            x = untile(x, 0, Hk, r, dv if kind == "attn_gate" else 1)
        elif tiled and kind == "ssm_out":                         # [D, Vd]: columns
            x = untile(x, 1, Hk, r, dv)
        if how == SHIFTED:
            x = _preimage(x, lambda w: w + 1.0, x - 1.0)
        elif how == NEG_EXP:
            if bool((x > 0).any()):
                raise ThorError(f"{path}: tensor {name} has positive values; it should hold -exp(A_log)")
            x = _preimage(x, lambda a: -a.exp(), torch.log(-x.double()).float())
        elif how == CONV:
            x = x.unsqueeze(1)                                    # [C, 1, k] as HF's Conv1d
        if cfg.arch == "qwen3_next" and kind in ("attn_qkv", "attn_gate"):
            halves.setdefault(hf, {})[kind] = x
        else:
            out[hf] = x
    for hf, parts in halves.items():
        qkv, z = parts["attn_qkv"], parts["attn_gate"]                      # [C, D], [Vd, D]
        D, Kd = qkv.shape[-1], cfg.key_dim
        q, k, v = (t.reshape(Hk, -1, D) for t in qkv.split([Kd, Kd, cfg.value_dim]))  # [Hk, rows, D]
        # back to HF's grouping: per key head g, [q_g, k_g, v_g.., z_g..]
        out[hf] = torch.cat([q, k, v, z.reshape(Hk, -1, D)], dim=1).reshape(-1, D)
    return out
