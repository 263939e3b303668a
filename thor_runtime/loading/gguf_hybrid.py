"""GGUF Gated-DeltaNet hybrids (llama.cpp's ``qwen35`` / ``qwen3next``) -> HybridConfig + the HF
checkpoint's own tensors, so HybridModel runs a GGUF exactly as it runs the safetensors.

Tensor names are the ``gguf`` package's. llama.cpp's converter rewrites these checkpoints (its
Qwen3NextModel, and Qwen3_5TextModel on top of it); each rewrite is undone here:

* ``A_log`` is stored as ``ssm_a = -exp(A_log)``;
* the norms the model applies as (1 + w) (layer, final, q/k) are stored as ``w + 1``; the GDN
  output norm (``ssm_norm``) is a plain scale and is stored as is;
* ``dt_bias`` is stored as ``ssm_dt.bias``; ``conv1d`` [C, 1, k] is stored squeezed, [C, k];
* Qwen3-Next: ``in_proj_qkvz`` (rows grouped per key head: q, k, v.., z..) is split into
  ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (z); ``in_proj_ba`` is kept whole
  (``ssm_ba``);
* Qwen3.5 with more value than key heads: every value-head axis (v rows of ``attn_qkv`` and of
  the conv, ``attn_gate``, ``ssm_beta``/``ssm_alpha`` rows, ``ssm_a``, ``ssm_dt``, ``ssm_out``
  columns) is reordered from grouped by key head (value head g*r + j) to tiled (j*Hk + g).

Mixture-of-experts blocks (``qwen35moe``; ``qwen3next`` with ``expert_count`` > 0): the converter
stacks the per-expert weights into 3-D ``ffn_{gate,up,down}_exps`` ([E, I, D], [E, I, D],
[E, D, I]; a fused ``gate_up_proj`` is split into its gate and up halves first), and keeps the
router (``ffn_gate_inp``), the shared expert (``ffn_*_shexp``) and its one-row gate
(``ffn_gate_inp_shexp``, [1, D]; quantizing tools may store it as [D]) as they are. The experts
come back in the fused form HybridModel reads (gate_up [E, 2 I, D], gate rows first). A layer
is a MoE layer where the file has any of its router / expert tensors (every layer for
``qwen35moe``), so Qwen3-Next's dense layers (``mlp_only_layers``) keep their dense MLP. The
converter writes no ``norm_topk_prob``; ``expert_weights_norm`` is read where present, else the
router renormalises, as the published checkpoints do (Qwen3.5-MoE's always does).

The gguf package names only expert FFNs for ``qwen3next``, so a dense-MLP Qwen3-Next file (or
layer) uses the ``ffn_gate`` / ``ffn_up`` / ``ffn_down`` names ``qwen35`` has.
Multi-token-prediction blocks that a converter appends after the decoder layers are skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from thor_runtime.errors import ThorError
from thor_runtime.models.hybrid.config import HybridConfig

# llama.cpp architecture -> our arch name (Qwen3.5-MoE has Qwen3.5's layers, as from HF)
HYBRID_GGUF_ARCH = {"qwen35": "qwen3_5", "qwen35moe": "qwen3_5", "qwen3next": "qwen3_next"}
MOE_EVERY_LAYER = ("qwen35moe",)
_MOE_KINDS = (
    "ffn_gate_inp",
    "ffn_gate_exps",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_inp_shexp",
    "ffn_gate_shexp",
    "ffn_up_shexp",
    "ffn_down_shexp",
)


def is_hybrid_arch(arch) -> bool:
    return arch in HYBRID_GGUF_ARCH


def _moe_layers(reader, arch: str, n: int) -> tuple[int, ...]:
    if arch in MOE_EVERY_LAYER:
        return tuple(range(n))
    found = set()
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) >= 3 and parts[0] == "blk" and parts[2] in _MOE_KINDS and int(parts[1]) < n:
            found.add(int(parts[1]))
    return tuple(sorted(found))


def hybrid_gguf_config(reader, path: str | Path, arch: str) -> HybridConfig:
    from thor_runtime.loading.gguf_fields import field_value

    def get(key, default=None):
        v = field_value(reader, f"{arch}.{key}", default)
        if v is None:
            raise ThorError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v

    scaling = field_value(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ThorError(
            f"{path}: rope scaling {scaling!r} is not supported for hybrid targets (default only)"
        )
    # block_count counts the MTP blocks a converter may append after the decoder layers
    n = int(get("block_count")) - int(get("nextn_predict_layers", 0))
    heads, hidden = int(get("attention.head_count")), int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // heads))
    every = int(get("full_attention_interval", 4))
    if every <= 0:
        raise ThorError(f"{path}: {arch}.full_attention_interval must be positive, got {every}")
    # llama.cpp's rule, as HF's default layer_types: every every-th layer is full attention
    types = tuple(
        "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)
    )
    hv, inner = int(get("ssm.time_step_rank")), int(get("ssm.inner_size"))
    if hv <= 0 or inner % hv:
        raise ThorError(
            f"{path}: {arch}.ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {hv}"
        )
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        raise ThorError(f"{path}: GGUF has no token_embd.weight")
    moe, experts = _moe_layers(reader, arch, n), {}
    if moe:
        if int(get("expert_count", 0)) <= 0:
            raise ThorError(
                f"{path}: layer {moe[0]} has mixture-of-experts tensors but {arch}.expert_count "
                f"is {get('expert_count', 0)}"
            )
        experts = {
            "num_experts": int(get("expert_count")),
            "num_experts_per_tok": int(get("expert_used_count")),
            "moe_intermediate_size": int(get("expert_feed_forward_length")),
            "shared_expert_intermediate_size": int(get("expert_shared_feed_forward_length")),
            "norm_topk_prob": arch in MOE_EVERY_LAYER or bool(get("expert_weights_norm", True)),
        }
    # Qwen3.5-MoE has no dense MLP: the shared expert's width stands in, as for its HF config
    dense_i = (
        experts["shared_expert_intermediate_size"]
        if arch in MOE_EVERY_LAYER
        else int(get("feed_forward_length"))
    )
    return HybridConfig(
        arch=HYBRID_GGUF_ARCH[arch],
        vocab_size=int(get("vocab_size", int(emb.shape[-1]))),
        hidden_size=hidden,
        intermediate_size=dense_i,
        num_layers=n,
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=head_dim,
        # stored as f32: its shortest decimal is the checkpoint's value (1e-6, not 9.99999997e-7)
        rms_eps=float(str(np.float32(get("attention.layer_norm_rms_epsilon", 1e-6)))),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        max_position_embeddings=int(get("context_length", 2048)),
        name=str(field_value(reader, "general.name", Path(path).stem)),
        layer_types=types,
        linear_num_key_heads=int(get("ssm.group_count")),
        linear_num_value_heads=hv,
        linear_key_head_dim=int(get("ssm.state_size")),
        linear_value_head_dim=inner // hv,
        linear_conv_kernel=int(get("ssm.conv_kernel")),
        partial_rotary_factor=_rotary_factor(int(get("rope.dimension_count", head_dim)), head_dim),
        moe_layers=moe,
        **experts,
    )


def _rotary_factor(rot: int, head_dim: int) -> float:
    """The fraction whose int(head_dim * f) gives back ``rot`` (the file stores the count)."""
    f = rot / head_dim
    return f if int(head_dim * f) == rot else math.nextafter(f, 1.0)


# ---- tensors --------------------------------------------------------------------------------
SHIFTED = "shifted"  # stored w + 1
NEG_EXP = "neg_exp"  # stored -exp(A_log)
CONV = "conv"  # stored squeezed
ROW = "row"  # [1, D], may be stored as [D]
# fed by ffn_gate_exps then ffn_up_exps (fused in hybrid_gguf_weights)
GATE_UP = "mlp.experts.gate_up_proj"


def tensor_plan(cfg: HybridConfig) -> dict[str, tuple[str, tuple[int, ...], str | None]]:
    """{GGUF name: (HF name, shape as stored rows-first, how it was rewritten)}. Qwen3-Next's
    ``attn_qkv`` / ``attn_gate`` both feed ``in_proj_qkvz``, and the experts' stacked gate / up
    both feed ``gate_up_proj`` (fused again in hybrid_gguf_weights)."""
    import gguf

    T, M = gguf.TENSOR_NAMES, gguf.MODEL_TENSOR
    D, Di, Dh, V = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.vocab_size
    H, Hk = cfg.num_heads, cfg.num_kv_heads
    Hv, Vd, dv = cfg.linear_num_value_heads, cfg.value_dim, cfg.linear_value_head_dim
    plan = {
        T[M.TOKEN_EMBD] + ".weight": ("model.embed_tokens.weight", (V, D), None),
        T[M.OUTPUT_NORM] + ".weight": ("model.norm.weight", (D,), SHIFTED),
    }
    if not cfg.tie_word_embeddings:
        plan[T[M.OUTPUT] + ".weight"] = ("lm_head.weight", (V, D), None)

    def put(i, t, hf, shape, how=None, suffix=".weight"):
        plan[T[t].format(bid=i) + suffix] = (f"model.layers.{i}.{hf}", shape, how)

    for i, kind in enumerate(cfg.layer_types):
        put(i, M.ATTN_NORM, "input_layernorm.weight", (D,), SHIFTED)
        put(i, M.ATTN_POST_NORM, "post_attention_layernorm.weight", (D,), SHIFTED)
        if i in cfg.moe_layers:
            E, Ie, Is = (
                cfg.num_experts,
                cfg.moe_intermediate_size,
                cfg.shared_expert_intermediate_size,
            )
            put(i, M.FFN_GATE_INP, "mlp.gate.weight", (E, D))
            put(i, M.FFN_GATE_EXP, GATE_UP, (E, Ie, D), suffix=".weight")
            put(i, M.FFN_UP_EXP, GATE_UP, (E, Ie, D), suffix=".weight")
            put(i, M.FFN_DOWN_EXP, "mlp.experts.down_proj", (E, D, Ie), suffix=".weight")
            put(i, M.FFN_GATE_INP_SHEXP, "mlp.shared_expert_gate.weight", (1, D), ROW)
            put(i, M.FFN_GATE_SHEXP, "mlp.shared_expert.gate_proj.weight", (Is, D))
            put(i, M.FFN_UP_SHEXP, "mlp.shared_expert.up_proj.weight", (Is, D))
            put(i, M.FFN_DOWN_SHEXP, "mlp.shared_expert.down_proj.weight", (D, Is))
        else:
            put(i, M.FFN_GATE, "mlp.gate_proj.weight", (Di, D))
            put(i, M.FFN_UP, "mlp.up_proj.weight", (Di, D))
            put(i, M.FFN_DOWN, "mlp.down_proj.weight", (D, Di))
        if kind == "full_attention":
            put(
                i, M.ATTN_Q, "self_attn.q_proj.weight", (2 * H * Dh, D)
            )  # query and its gate, per head
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
    """Value heads along ``dim`` from tiled order (j*Hk + g) back to grouped by key head
    (g*r + j)."""
    shape = list(x.shape)
    x = x.reshape(*shape[:dim], per_k, num_k_heads, head_dim, *shape[dim + 1 :])
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
        hi, lo = (
            torch.nextafter(hi, torch.tensor(math.inf)),
            torch.nextafter(lo, torch.tensor(-math.inf)),
        )
        for cand in (hi, lo):
            hit = todo & (forward(cand) == stored)
            out[hit] = cand[hit]
            todo &= ~hit
    return out


def _check(tensors: dict, plan: dict, path) -> None:
    for name, (_, shape, how) in plan.items():
        t = tensors.get(name)
        if t is None:
            raise ThorError(f"{path}: missing tensor {name}")
        if _stored_shape(t) != shape and not (how == ROW and _stored_shape(t) == shape[1:]):
            raise ThorError(
                f"{path}: tensor {name} has shape {list(_stored_shape(t))}, expected {list(shape)}"
            )


def hybrid_gguf_weights(reader, cfg: HybridConfig, path: str | Path) -> dict[str, torch.Tensor]:
    """Dequantized fp32 tensors under their HF names, every converter rewrite undone."""
    tensors = {t.name: t for t in reader.tensors}
    plan = tensor_plan(cfg)
    _check(tensors, plan, path)
    Hk, dv = cfg.linear_num_key_heads, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // Hk
    tiled = cfg.arch == "qwen3_5" and r > 1
    out: dict[str, torch.Tensor] = {}
    halves: dict[str, dict[str, torch.Tensor]] = {}  # in_proj_qkvz's two parts; gate_up_proj's
    for name, (hf, _, how) in plan.items():
        x = _dequantize(tensors[name], path)
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if tiled and kind in ("attn_qkv", "ssm_conv1d"):  # [C, D] / [C, k]: only the v rows
            qk = 2 * cfg.key_dim
            x = torch.cat([x[:qk], untile(x[qk:], 0, Hk, r, dv)])
        elif tiled and kind in ("attn_gate", "ssm_beta", "ssm_alpha", "ssm_a", "ssm_dt"):
            x = untile(x, 0, Hk, r, dv if kind == "attn_gate" else 1)
        elif tiled and kind == "ssm_out":  # [D, Vd]: columns
            x = untile(x, 1, Hk, r, dv)
        if how == SHIFTED:
            x = _preimage(x, lambda w: w + 1.0, x - 1.0)
        elif how == NEG_EXP:
            if bool((x > 0).any()):
                raise ThorError(
                    f"{path}: tensor {name} has positive values; it should hold -exp(A_log)"
                )
            x = _preimage(x, lambda a: -a.exp(), torch.log(-x.double()).float())
        elif how == CONV:
            x = x.unsqueeze(1)  # [C, 1, k] as HF's Conv1d
        elif how == ROW:
            x = x.reshape(1, -1)  # [1, D]
        if hf.endswith(GATE_UP) or (cfg.arch == "qwen3_next" and kind in ("attn_qkv", "attn_gate")):
            halves.setdefault(hf, {})[kind] = x
        else:
            out[hf] = x
    for hf, parts in halves.items():
        if hf.endswith(GATE_UP):  # [E, I, D] each -> [E, 2 I, D]
            out[hf] = torch.cat([parts["ffn_gate_exps"], parts["ffn_up_exps"]], dim=1)
            continue
        qkv, z = parts["attn_qkv"], parts["attn_gate"]  # [C, D], [Vd, D]
        D, Kd = qkv.shape[-1], cfg.key_dim
        q, k, v = (
            t.reshape(Hk, -1, D) for t in qkv.split([Kd, Kd, cfg.value_dim])
        )  # [Hk, rows, D]
        # back to HF's grouping: per key head g, [q_g, k_g, v_g.., z_g..]
        out[hf] = torch.cat([q, k, v, z.reshape(Hk, -1, D)], dim=1).reshape(-1, D)
    return out
