"""Checkpoint tensors of a hybrid target: expected names and shapes, and one canonical layout.

Names are the HF checkpoint's own. Qwen3.5 stores the GDN input projection as four tensors
(``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``); Qwen3-Next fuses them as
``in_proj_qkvz`` / ``in_proj_ba`` grouped per key head ([q_g, k_g, v_g.., z_g..] for each key
head g). Both are checked under their own names (so an error names the file's tensor), then
turned into the Qwen3.5 form, which is what HybridModel reads. MoE layers' expert tensors
likewise come per expert or fused (moe.py) and are read fused.
"""

from __future__ import annotations

import torch

from thor_runtime.errors import ThorError
from thor_runtime.models.hybrid.config import HybridConfig
from thor_runtime.models.hybrid.moe import fuse_experts, is_fused, moe_shapes, per_expert_prefixes


def normalize_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Multimodal checkpoints keep the language model under ``model.language_model.``; the
    vision tower and the multi-token-prediction head are not used."""
    out = {}
    for k, v in weights.items():
        if k.startswith(("model.visual.", "mtp.", "model.mtp.")):
            continue
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model.") :]
        out[k] = v
    return out


def expected_shapes(
    cfg: HybridConfig, weights: dict[str, torch.Tensor] | None = None
) -> dict[str, tuple[int, ...]]:
    """Every tensor the model reads. ``weights``: the file's tensors, which decide the form
    each MoE layer's experts are expected in (without: the form published checkpoints use)."""
    D, Di, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    H, Hk = cfg.num_heads, cfg.num_kv_heads
    Hv, Kd, Vd, dv = (
        cfg.linear_num_value_heads,
        cfg.key_dim,
        cfg.value_dim,
        cfg.linear_value_head_dim,
    )
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, D)
    per_expert = per_expert_prefixes(weights) if weights is not None and cfg.moe_layers else set()
    for i, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{i}."
        shapes.update(
            {p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,)}
        )
        if i in cfg.moe_layers:
            m = p + "mlp."
            shapes.update(moe_shapes(cfg, m, is_fused(cfg, m, weights, per_expert)))
        else:
            shapes.update(
                {
                    p + "mlp.gate_proj.weight": (Di, D),
                    p + "mlp.up_proj.weight": (Di, D),
                    p + "mlp.down_proj.weight": (D, Di),
                }
            )
        if kind == "full_attention":
            a = p + "self_attn."
            shapes.update(
                {
                    a + "q_proj.weight": (2 * H * Dh, D),  # query and its output gate, per head
                    a + "k_proj.weight": (Hk * Dh, D),
                    a + "v_proj.weight": (Hk * Dh, D),
                    a + "o_proj.weight": (D, H * Dh),
                    a + "q_norm.weight": (Dh,),
                    a + "k_norm.weight": (Dh,),
                }
            )
            continue
        g = p + "linear_attn."
        shapes.update(
            {
                g + "conv1d.weight": (cfg.conv_dim, 1, cfg.linear_conv_kernel),
                g + "A_log": (Hv,),
                g + "dt_bias": (Hv,),
                g + "norm.weight": (dv,),
                g + "out_proj.weight": (D, Vd),
            }
        )
        if cfg.arch == "qwen3_next":
            shapes.update(
                {
                    g + "in_proj_qkvz.weight": (2 * Kd + 2 * Vd, D),
                    g + "in_proj_ba.weight": (2 * Hv, D),
                }
            )
        else:
            shapes.update(
                {
                    g + "in_proj_qkv.weight": (cfg.conv_dim, D),
                    g + "in_proj_z.weight": (Vd, D),
                    g + "in_proj_b.weight": (Hv, D),
                    g + "in_proj_a.weight": (Hv, D),
                }
            )
    return shapes


def check_hybrid_weights(cfg: HybridConfig, weights: dict[str, torch.Tensor], source: str) -> None:
    for name, shape in expected_shapes(cfg, weights).items():
        if name not in weights:
            raise ThorError(f"{source}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ThorError(
                f"{source}: tensor {name} has shape {list(weights[name].shape)}, "
                f"expected {list(shape)}"
            )


def canonical(cfg: HybridConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Qwen3-Next's grouped qkvz/ba -> Qwen3.5's separate qkv, z, b, a (rows reordered, no math);
    per-expert MoE tensors -> the fused ones."""
    out = dict(weights)
    for i in cfg.moe_layers:
        fuse_experts(out, f"model.layers.{i}.mlp.", cfg.num_experts)
    if cfg.arch != "qwen3_next":
        return out
    Hk, dk, dv = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = cfg.linear_num_value_heads // Hk  # value heads per key head
    for i in cfg.gdn_layers:
        g = f"model.layers.{i}.linear_attn."
        w = out.pop(g + "in_proj_qkvz.weight")
        D = w.shape[-1]
        blocks = w.view(Hk, 2 * dk + 2 * r * dv, D)  # [Hk, rows per key head, D]
        q, k, v, z = blocks.split([dk, dk, r * dv, r * dv], dim=1)
        out[g + "in_proj_qkv.weight"] = torch.cat(
            [q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]
        )
        out[g + "in_proj_z.weight"] = z.reshape(-1, D).contiguous()  # value head g*r + j
        b, a = out.pop(g + "in_proj_ba.weight").view(Hk, 2 * r, D).split([r, r], dim=1)
        out[g + "in_proj_b.weight"] = b.reshape(-1, D).contiguous()
        out[g + "in_proj_a.weight"] = a.reshape(-1, D).contiguous()
    return out
