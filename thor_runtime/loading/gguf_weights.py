"""GGUF (llama.cpp) checkpoints -> ModelConfig + HF-named fp32 tensors.

Dequantization is the ``gguf`` package's; what is ours is the name mapping and
undoing llama.cpp's Q/K row permutation (its converter interleaves the two RoPE
halves; our model, like HF, rotates halves). Gated-DeltaNet hybrids have their own
mapping (gguf_hybrid.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from thor_runtime.errors import ThorError
from thor_runtime.loading.gguf_fields import field_value
from thor_runtime.models.config import ModelConfig

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_GGUF_ARCH = {"llama": "llama", "qwen3": "qwen3", "qwen2": "qwen2"}


def open_reader(path: str | Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise ThorError(f"model file not found: {path}") from None
    except Exception as e:  # the reader raises ValueError/struct errors on damaged files
        raise ThorError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def gguf_architecture(path: str | Path) -> str | None:
    """``general.architecture`` read from the header alone: gguf's reader parses every field
    (~3 s for a 49k-token vocabulary), and a warm start needs only this one. None when the
    key is not among the header's scalar and string fields before the first array."""
    import struct

    import gguf
    import numpy as np

    sizes = {int(k): np.dtype(v).itemsize for k, v in gguf.GGUFReader.gguf_scalar_to_np.items()}
    try:
        with open(path, "rb") as f:
            head = f.read(24)
            if len(head) < 24 or head[:4] != b"GGUF":
                return None
            (n_kv,) = struct.unpack("<Q", head[16:24])
            for _ in range(n_kv):
                (n,) = struct.unpack("<Q", f.read(8))
                key = f.read(n).decode("utf-8", "replace")
                (kind,) = struct.unpack("<I", f.read(4))
                if kind == gguf.GGUFValueType.STRING:
                    (n,) = struct.unpack("<Q", f.read(8))
                    value = f.read(n)
                    if key == "general.architecture":
                        return value.decode("utf-8", "replace")
                elif kind in sizes:
                    f.seek(sizes[kind], 1)
                else:  # an array (the vocabulary): read no further
                    return None
    except (OSError, struct.error):
        return None
    return None


def gguf_config(reader, path: str | Path) -> ModelConfig:
    from thor_runtime.loading.gguf_hybrid import (
        HYBRID_GGUF_ARCH,
        hybrid_gguf_config,
        is_hybrid_arch,
    )

    arch = field_value(reader, "general.architecture")
    if is_hybrid_arch(arch):
        return hybrid_gguf_config(reader, path, arch)
    if arch not in _GGUF_ARCH:
        raise ThorError(
            f"{path}: unknown architecture {arch!r} "
            f"(supported: {', '.join([*_GGUF_ARCH, *HYBRID_GGUF_ARCH])})"
        )

    def get(key, default=None, required=True):
        v = field_value(reader, f"{arch}.{key}", default)
        if v is None and required:
            raise ThorError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return v

    n_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // n_heads))
    emb = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if emb is None:
        raise ThorError(f"{path}: GGUF has no token_embd.weight")
    vocab = int(get("vocab_size", int(emb.shape[-1]), required=False))
    scaling = None
    if field_value(reader, f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    return ModelConfig(
        arch=_GGUF_ARCH[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=n_heads,
        num_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0, required=False)),
        rope_scaling=scaling,
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
        max_position_embeddings=int(get("context_length", 2048, required=False)),
        name=str(field_value(reader, "general.name", Path(path).stem)),
    )


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert permutation for q/k rows: [n_head*Dh, D]."""
    rows = w.shape[0]
    # convert did reshape(n_head, 2, Dh/2, D).swapaxes(1, 2); this reverses it.
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str) -> str | None:
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    m = re.fullmatch(r"(\w+)\.weight", name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.weight"
    return None


def gguf_weights(reader, cfg: ModelConfig, path: str | Path) -> dict[str, torch.Tensor]:
    from gguf import GGMLQuantizationType, quants

    from thor_runtime.models.hybrid import is_hybrid_config

    if is_hybrid_config(cfg):
        from thor_runtime.loading.gguf_hybrid import hybrid_gguf_weights

        return hybrid_gguf_weights(reader, cfg, path)
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        hf = _hf_name(t.name)
        if hf is None:
            continue  # e.g. rope_freqs: recomputed from the config
        qtype = GGMLQuantizationType(t.tensor_type)
        try:
            arr = quants.dequantize(t.data, qtype)
        except NotImplementedError:
            raise ThorError(
                f"{path}: tensor {t.name} has unsupported GGUF type {qtype.name}"
            ) from None
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        arr = np.array(arr, dtype=np.float32).reshape(shape)  # own, writable copy
        # llama.cpp permutes q/k only for the llama family; qwen converters keep HF order.
        if cfg.arch == "llama" and hf.endswith("q_proj.weight"):
            arr = _unpermute(arr, cfg.num_heads)
        elif cfg.arch == "llama" and hf.endswith("k_proj.weight"):
            arr = _unpermute(arr, cfg.num_kv_heads)
        out[hf] = torch.from_numpy(np.ascontiguousarray(arr))
    return out
