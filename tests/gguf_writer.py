"""Write a tiny checkpoint as GGUF the way llama.cpp's converter does (names mapped; for
llama the Q/K rows permuted), so the GGUF loader is tested on files we control."""
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
    """qtype: F32 | F16 | a type gguf.quants can quantize (Q8_0, Q5_0, ...) for 2-D weights. ``override``: {gguf tensor name: (np.uint8 data,
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
_K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
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
        scale = (rng.uniform(0.3, 1.0, size=(rows, cols // block)) * 0.1 / _K_GAIN[qtype]).astype(np.float16)
        data[..., off:off + 2] = scale[..., None].view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)
