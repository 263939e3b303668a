"""HF checkpoint directories: config.json + safetensors (single or sharded).

Pickle-based weights (.bin, .pt, .pth, .ckpt) are refused and never opened:
unpickling runs arbitrary code.
"""

from __future__ import annotations

from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import PICKLE_SUFFIXES, read_json
from thor_runtime.models.config import ModelConfig

_HF_ARCH = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Qwen2ForCausalLM": "qwen2"}


def hf_config(d: Path) -> ModelConfig:
    c = read_json(d / "config.json", "model config")
    archs = c.get("architectures") or []
    from thor_runtime.models.hybrid.config import HF_HYBRID_ARCH, hybrid_config_from_hf

    hybrid = next((a for a in archs if a in HF_HYBRID_ARCH), None)
    if hybrid is not None:
        return hybrid_config_from_hf(
            c, hybrid, f"{d}/config.json", str(c.get("_name_or_path") or d.name)
        )
    arch = next((_HF_ARCH[a] for a in archs if a in _HF_ARCH), None)
    if arch is None:
        raise ThorError(
            f"{d}/config.json: unknown architecture {archs or c.get('model_type')!r} "
            f"(supported: {', '.join([*_HF_ARCH, *HF_HYBRID_ARCH])})"
        )
    try:
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        return ModelConfig(
            arch=arch,
            vocab_size=int(c["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            rms_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(
                c.get("rope_theta") or (c.get("rope_parameters") or {}).get("rope_theta", 10000.0)
            ),
            rope_scaling=c.get("rope_scaling"),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            name=str(c.get("_name_or_path") or d.name),
        )
    except KeyError as e:
        raise ThorError(f"{d}/config.json lacks required key {e.args[0]!r}") from None


def refuse_pickle(d: Path) -> None:
    pickled = sorted(p.name for p in d.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled and not list(d.glob("*.safetensors")):
        raise ThorError(
            f"{d}: only pickle weights found ({', '.join(pickled)}); they are refused because "
            "unpickling runs code. Convert them to safetensors."
        )


def _weight_map(index: Path, what: str) -> dict[str, str]:
    """The index's tensor name -> shard file name."""
    wm = read_json(index, "safetensors index").get("weight_map")
    if not isinstance(wm, dict) or not wm or not all(isinstance(v, str) for v in wm.values()):
        raise ThorError(f"{index}: {what} index has no weight_map of tensor name -> shard file")
    return wm


def read_safetensors(d: Path, what: str = "weights") -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors: the shards an index names (sharded), else every
    *.safetensors file. Tensors keep their stored dtype. Pickle-only directories are refused, and
    so is an index naming a shard that is missing or a tensor its shard does not hold."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    refuse_pickle(d)
    index = d / "model.safetensors.index.json"
    weight_map = _weight_map(index, what) if index.exists() else None
    if weight_map is not None:
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in d.glob("*.safetensors"))
    if not files:
        raise ThorError(f"{d}: no *.safetensors {what} found")
    out: dict[str, torch.Tensor] = {}
    for name in files:
        p = d / name
        if not p.exists():
            raise ThorError(f"{d}: {what} shard {name} named in the index is missing")
        try:
            tensors = load_file(str(p))
        except (SafetensorError, OSError, ValueError) as e:
            raise ThorError(
                f"{p}: cannot read safetensors file (truncated or damaged?): {e}"
            ) from None
        if weight_map is not None:
            absent = sorted(t for t, f in weight_map.items() if f == name and t not in tensors)
            if absent:
                more = f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""
                raise ThorError(
                    f"{p}: tensor {absent[0]!r}{more}, named in the index for this shard, "
                    f"is not in it"
                )
        out.update(tensors)
    return out


def hf_weights(d: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in read_safetensors(d).items()}
