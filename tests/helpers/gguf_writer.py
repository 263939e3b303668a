"""Write a tiny checkpoint as GGUF the way llama.cpp's converter does (names mapped; for
llama the Q/K rows permuted), so the GGUF loader is tested on files we control."""

from __future__ import annotations

import numpy as np
import torch

_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_tiny_gguf(
    path,
    cfg,
    weights: dict[str, torch.Tensor],
    qtype: str = "F32",
    override: dict | None = None,
    arch: str = "llama",
) -> None:
    """qtype: F32 | F16 | a type gguf.quants can quantize (Q8_0, Q5_0, ...) for 2-D weights.
    ``override``: {gguf tensor name: (np.uint8 data, GGMLQuantizationType)} to plant raw tensors
    (e.g. an unsupported type)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_vocab_size(cfg.vocab_size)
    override = override or {}
    for name, t in weights.items():
        a = t.float().numpy()
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            parts = name.split(".")
            g = f"blk.{parts[2]}.{_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"
            if arch == "llama" and parts[-2] == "q_proj":
                a = _permute(a, cfg.num_heads)
            elif arch == "llama" and parts[-2] == "k_proj":
                a = _permute(a, cfg.num_kv_heads)
        if g in override:
            data, qt = override[g]
            w.add_tensor(g, data, raw_shape=data.shape, raw_dtype=qt)
        elif a.ndim == 2 and qtype == "F16":
            w.add_tensor(g, a.astype(np.float16))
        elif a.ndim == 2 and qtype != "F32":  # Q8_0, Q5_0, ...: any type gguf can quantize
            qt = gguf.GGMLQuantizationType[qtype]
            q = gguf.quants.quantize(a, qt)
            w.add_tensor(g, q, raw_shape=q.shape, raw_dtype=qt)
        else:
            w.add_tensor(g, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Where a K-quant super-block (256 weights) keeps its fp16 scale fields (d, and dmin where the
# type has one), as laid out in ggml's block_q*_K structs, and roughly how far a weight can
# exceed d (largest sub-block scale times largest code), so weights stay within ~0.1.
_K_SCALE_OFFSETS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
_K_GAIN = {"Q2_K": 45, "Q3_K": 128, "Q4_K": 1024, "Q5_K": 2048, "Q6_K": 4096}


def random_kquant(rows: int, cols: int, qtype: str, seed: int = 0) -> np.ndarray:
    """Raw K-quant data for a [rows, cols] weight: random codes with small, finite fp16 scales.
    gguf can read these types but not write them, so the blocks are filled directly."""
    import gguf

    qt = gguf.GGMLQuantizationType[qtype]
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block, nbytes), dtype=np.uint8)
    for off in _K_SCALE_OFFSETS[qtype]:
        scale = (rng.uniform(0.3, 1.0, size=(rows, cols // block)) * 0.1 / _K_GAIN[qtype]).astype(
            np.float16
        )
        data[..., off : off + 2] = scale[..., None].view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


# ---- Gated-DeltaNet hybrids (Qwen3.5 / Qwen3-Next) ---------------------------------------------
# What llama.cpp's converter writes for these checkpoints (its Qwen3NextModel and, for Qwen3.5,
# the value-head reorder of _LinearAttentionVReorderBase), restated here so the loader is tested
# against files laid out as a converted checkpoint is, not against its own inverse.
HYBRID_GGUF_ARCH = {
    "qwen3_5_text": "qwen35",
    "qwen3_5_moe_text": "qwen35moe",
    "qwen3_next": "qwen3next",
}
_GGUF_MODEL_ARCH = {"qwen35": "QWEN35", "qwen35moe": "QWEN35MOE", "qwen3next": "QWEN3NEXT"}


def tile_value_heads(
    x: torch.Tensor, dim: int, num_k_heads: int, per_k: int, head_dim: int
) -> torch.Tensor:
    """Value heads along ``dim`` from grouped by key head [G0v0, G0v1, G1v0, ...] to the tiled order
    llama.cpp broadcasts over [G0v0, G1v0, ..., G0v1, G1v1, ...]."""
    shape = list(x.shape)
    x = x.reshape(*shape[:dim], num_k_heads, per_k, head_dim, *shape[dim + 1 :])
    return x.transpose(dim, dim + 1).reshape(shape).contiguous()


def _tile_for_qwen35(name: str, w: torch.Tensor, c: dict) -> torch.Tensor:
    hk, hv, dk, dv = (
        c["linear_num_key_heads"],
        c["linear_num_value_heads"],
        c["linear_key_head_dim"],
        c["linear_value_head_dim"],
    )
    r = hv // hk
    if hk == hv or ".linear_attn." not in name:
        return w
    if ".in_proj_qkv." in name or ".conv1d." in name:
        w = w.squeeze() if ".conv1d." in name else w
        qk = 2 * hk * dk
        return torch.cat([w[:qk], tile_value_heads(w[qk:], 0, hk, r, dv)])
    if ".in_proj_z." in name:
        return tile_value_heads(w, 0, hk, r, dv)
    if ".in_proj_b." in name or ".in_proj_a." in name or name.endswith((".A_log", ".dt_bias")):
        return tile_value_heads(w, 0, hk, r, 1)
    if ".out_proj." in name:
        return tile_value_heads(w, 1, hk, r, dv)
    return w


def _stack_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The converter's expert handling (its Qwen2MoeModel): one tensor per expert is stacked into
    ``mlp.experts.{gate,up,down}_proj.weight`` ([E, I, D], [E, I, D], [E, D, I]); a fused
    ``gate_up_proj`` [E, 2 I, D] is split into its gate rows and its up rows."""
    out, per = {}, {}
    for name, w in weights.items():
        head, sep, tail = name.partition(".mlp.experts.")
        if not sep:
            out[name] = w
        elif tail == "gate_up_proj":
            i = w.shape[-2] // 2
            out[head + ".mlp.experts.gate_proj.weight"] = w[:, :i].contiguous()
            out[head + ".mlp.experts.up_proj.weight"] = w[:, i:].contiguous()
        elif tail == "down_proj":
            out[head + ".mlp.experts.down_proj.weight"] = w
        else:
            e, proj, _ = tail.split(".")
            per.setdefault(f"{head}.mlp.experts.{proj}.weight", {})[int(e)] = w
    for name, ws in per.items():
        out[name] = torch.stack([ws[e] for e in range(len(ws))])
    return out


def converted_hybrid(hf_dir) -> tuple[str, dict, dict[str, torch.Tensor]]:
    """-> (GGUF arch, HF config, {GGUF name: tensor}) as the converter writes a hybrid, dense or
    MoE."""
    import json

    import gguf
    from safetensors.torch import load_file

    c = json.loads((hf_dir / "config.json").read_text())
    arch = HYBRID_GGUF_ARCH[c["model_type"]]
    names = gguf.get_tensor_name_map(
        getattr(gguf.MODEL_ARCH, _GGUF_MODEL_ARCH[arch]), c["num_hidden_layers"]
    )
    out = {}
    for name, w in _stack_experts(load_file(str(hf_dir / "model.safetensors"))).items():
        w = w.float()
        if arch in ("qwen35", "qwen35moe"):
            w = _tile_for_qwen35(name, w, c)
        if name.endswith(".A_log"):
            w = -torch.exp(w)
        elif name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        elif ".conv1d." in name:
            w = w.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            w = w + 1
        if name.endswith("in_proj_qkvz.weight"):
            hk, dk = c["linear_num_key_heads"], c["linear_key_head_dim"]
            rv = c["linear_num_value_heads"] // hk * c["linear_value_head_dim"]
            q, k, v, z = w.reshape(hk, -1, w.shape[-1]).split([dk, dk, rv, rv], dim=1)
            bid = name.split(".")[2]
            out[f"blk.{bid}.attn_qkv.weight"] = torch.cat(
                [t.reshape(-1, w.shape[-1]) for t in (q, k, v)]
            )
            out[f"blk.{bid}.attn_gate.weight"] = z.reshape(-1, w.shape[-1])
            continue
        g = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if g is None and ".mlp." in name:  # the package lists only expert FFNs for qwen3next
            part = {
                "gate_proj": gguf.MODEL_TENSOR.FFN_GATE,
                "up_proj": gguf.MODEL_TENSOR.FFN_UP,
                "down_proj": gguf.MODEL_TENSOR.FFN_DOWN,
            }[name.split(".")[-2]]
            g = gguf.TENSOR_NAMES[part].format(bid=int(name.split(".")[2])) + ".weight"
        assert g is not None, name
        out[g] = w
    return arch, c, out


def write_hybrid_gguf(
    path,
    hf_dir,
    qtype: str = "F32",
    store_dequantized: bool = False,
    edit=None,
    meta: dict | None = None,
    mtp_blocks: int = 0,
) -> None:
    """The tiny hybrid at ``hf_dir`` as a converted GGUF, with its tokenizer. qtype: F32 | F16 | a
    type gguf can quantize, for 2-D and stacked 3-D expert weights except the conv (kept F32, as
    llama.cpp keeps it);
    store_dequantized: write those weights' quantize -> dequantize round trip as F32 instead.
    ``edit(tensors)`` may change the tensor dict before writing; ``meta``: extra {key: int};
    ``mtp_blocks``: multi-token-prediction blocks appended after the decoder layers, as newer
    converters write them (counted in block_count, named by nextn_predict_layers)."""
    import gguf

    arch, c, tensors = converted_hybrid(hf_dir)
    if edit:
        edit(tensors)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-" + arch)
    n, d = c["num_hidden_layers"], c["hidden_size"]
    for b in range(n, n + mtp_blocks):
        tensors[f"blk.{b}.nextn.eh_proj.weight"] = torch.randn(d, 2 * d)
        tensors[f"blk.{b}.attn_norm.weight"] = torch.randn(d)
    w.add_block_count(n + mtp_blocks)
    if mtp_blocks:
        w.add_nextn_predict_layers(mtp_blocks)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    if "intermediate_size" in c:  # Qwen3.5-MoE has no dense MLP
        w.add_feed_forward_length(c["intermediate_size"])
    if c.get("num_experts"):
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
        if arch == "qwen3next" and not c.get("norm_topk_prob", True):
            # the converter writes no norm flag (the published checkpoints renormalise); this
            # tiny model does not, so the file says so under llama.cpp's key for it
            w.add_expert_weights_norm(False)
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    rope = c.get("rope_parameters") or {}
    w.add_rope_freq_base(rope.get("rope_theta", c.get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(int(c["head_dim"] * rope.get("partial_rotary_factor", 0.25)))
    if arch in ("qwen35", "qwen35moe"):
        w.add_rope_dimension_sections(
            [11, 11, 10, 0]
        )  # multimodal RoPE sections; text positions ignore them
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_ssm_group_count(c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_full_attention_interval(c.get("full_attention_interval", 4))
    w.add_vocab_size(c["vocab_size"])
    for k, v in (meta or {}).items():
        w.add_uint32(k.format(arch=arch), v)
    _add_tokenizer(w, hf_dir)
    for name, t in tensors.items():
        a = t.numpy()
        if a.ndim in (2, 3) and qtype != "F32" and "ssm_conv1d" not in name:
            if qtype == "F16":
                a = a.astype(np.float16)
            elif a.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0] == 0:
                # rows not a whole number of blocks stay F32, as the converter falls back
                qt = gguf.GGMLQuantizationType[qtype]
                q = gguf.quants.quantize(a, qt)
                if not store_dequantized:
                    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
                    continue
                a = gguf.quants.dequantize(q, qt).reshape(a.shape)
        w.add_tensor(name, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_tokenizer(w, hf_dir) -> None:
    """The directory's byte-level BPE as GGUF tokenizer fields (added tokens as control tokens)."""
    import json

    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    specials = {a["content"]: a["id"] for a in tj.get("added_tokens", [])}
    vocab.update(specials)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(vocab[cfg["eos_token"]])
    template = hf_dir / "chat_template.jinja"
    w.add_chat_template(template.read_text() if template.is_file() else cfg["chat_template"])
