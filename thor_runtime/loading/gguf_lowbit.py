"""GGUF -> HF-named weights that keep Q4_0 / Q4_1 projections as int4 codes with the file's
own group scales (no fp32 copy of them is ever made). Everything else (embeddings, norms,
projections in other formats) is dequantized by the ``gguf`` package as in gguf_weights;
the model re-quantizes float projections to int4 where it needs to."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from thor_runtime.errors import ThorError
from thor_runtime.kernels.lowbit import q4_blocks
from thor_runtime.loading.gguf_weights import _hf_name, _unpermute
from thor_runtime.models.config import ModelConfig

_PROJ_SUFFIXES = ("_proj.weight",)
_Q4 = ("Q4_0", "Q4_1")
_FLOAT = ("F32", "F16", "BF16")


def projection_types(reader) -> set[str]:
    """GGML type names of the file's projection tensors (what ``--dtype auto`` decides on)."""
    from gguf import GGMLQuantizationType

    out = set()
    for t in reader.tensors:
        hf = _hf_name(t.name)
        if hf and hf.endswith(_PROJ_SUFFIXES):
            out.add(GGMLQuantizationType(t.tensor_type).name)
    return out


def is_quantized(reader) -> bool:
    return bool(projection_types(reader) - set(_FLOAT))


def gguf_weights_int4(reader, cfg: ModelConfig, path: str | Path) -> dict[str, object]:
    from gguf import GGMLQuantizationType, quants

    out: dict[str, object] = {}
    for t in reader.tensors:
        hf = _hf_name(t.name)
        if hf is None:
            continue
        qtype = GGMLQuantizationType(t.tensor_type)
        shape = tuple(int(x) for x in reversed(t.shape))  # GGUF lists dims fastest-first
        heads = None
        if cfg.arch == "llama" and hf.endswith("q_proj.weight"):
            heads = cfg.num_heads
        elif cfg.arch == "llama" and hf.endswith("k_proj.weight"):
            heads = cfg.num_kv_heads
        if hf.endswith(_PROJ_SUFFIXES) and qtype.name in _Q4:
            codes = q4_blocks(t.data, shape, qtype.name)
            if heads:
                codes = codes.permute_rows(_unpermute(np.arange(shape[0])[:, None], heads)[:, 0])
            out[hf] = codes
            continue
        try:
            arr = quants.dequantize(t.data, qtype)
        except NotImplementedError:
            raise ThorError(
                f"{path}: tensor {t.name} has unsupported GGUF type {qtype.name}"
            ) from None
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if heads:
            arr = _unpermute(arr, heads)
        out[hf] = torch.from_numpy(np.array(arr, copy=True))  # own, writable
    return out
