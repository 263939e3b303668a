"""Write a tiny llama checkpoint as GGUF the way llama.cpp's converter does (Q/K rows
permuted, names mapped), so the GGUF loader is tested on files we control."""
from __future__ import annotations

import numpy as np
import torch

_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, cfg, weights: dict[str, torch.Tensor], qtype: str = "F32",
                    override: dict | None = None, arch: str = "llama") -> None:
    """qtype: F32 | F16 | Q8_0 for 2-D weights. ``override``: {gguf tensor name: (np.uint8 data,
    GGMLQuantizationType)} to plant raw tensors (e.g. an unsupported type)."""
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
            g = f"blk.{parts[2]}.{_NAMES['.'.join(parts[3:-1])]}.weight"
            if parts[-2] == "q_proj":
                a = _permute(a, cfg.num_heads)
            elif parts[-2] == "k_proj":
                a = _permute(a, cfg.num_kv_heads)
        if g in override:
            data, qt = override[g]
            w.add_tensor(g, data, raw_shape=data.shape, raw_dtype=qt)
        elif a.ndim == 2 and qtype == "F16":
            w.add_tensor(g, a.astype(np.float16))
        elif a.ndim == 2 and qtype == "Q8_0":
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(g, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(g, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
