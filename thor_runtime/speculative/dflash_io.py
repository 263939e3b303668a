"""DFlash drafter checkpoints: our layout and z-lab's published layout.

Our layout (``format: thor-dflash/1``), a directory with
  config.json        every DFlashConfig field + {"format": "thor-dflash/1"}
  model.safetensors  fc.weight [D, n_taps*D], hidden_norm.weight [D], norm.weight [D],
                     layers.N.self_attn.{q,k,v,o}_proj.weight, layers.N.self_attn.{q,k}_norm.weight,
                     layers.N.{input_layernorm,post_attention_layernorm}.weight,
                     layers.N.mlp.{gate,up,down}_proj.weight
  draft_vocab.json   optional: the head's shortlist of token ids (draft_vocab.py)
No embedding or lm_head: the drafter shares the target's.

z-lab layout (their HF drafters for Qwen3 targets): an HF-style config.json with
``dflash_config`` {target_layer_ids, mask_token_id[, block_size]} and Qwen3 fields
(hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
intermediate_size, rms_norm_eps, rope_theta or rope_parameters.rope_theta, block_size),
weights with the same names as ours (optionally sharded via model.safetensors.index.json).

Pickle weights (.bin/.pt/...) are never opened: unpickling runs code.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import PICKLE_SUFFIXES, read_json, write_json_atomic
from thor_runtime.kernels.row_linear import RowLinear
from thor_runtime.loading.hf_weights import read_safetensors
from thor_runtime.models.config import ModelConfig
from thor_runtime.speculative.dflash_model import DFlashConfig, DFlashDrafter
from thor_runtime.speculative.draft_vocab import FILENAME, load_draft_vocab

FORMAT = "thor-dflash/1"
# Tensors a z-lab export may carry that we do not use (the target's own are shared).
_IGNORED = ("embed_tokens.weight", "lm_head.weight", "rotary_emb.inv_freq")


def check_fits(cfg: DFlashConfig, target: ModelConfig, source: str = "dflash drafter") -> None:
    """Refuse a drafter that cannot read this target's taps or share its embedding."""
    if cfg.hidden_size != target.hidden_size:
        raise ThorError(
            f"{source}: hidden size {cfg.hidden_size} does not match the target's "
            f"{target.hidden_size}"
        )
    bad = [t for t in cfg.tap_layers if t >= target.num_layers]
    if bad:
        raise ThorError(
            f"{source}: tap layers {bad} are beyond the target's {target.num_layers} layers"
        )
    if cfg.mask_token_id >= target.vocab_size:
        raise ThorError(
            f"{source}: mask_token_id {cfg.mask_token_id} is outside the target vocabulary "
            f"of {target.vocab_size}"
        )


def default_tap_layers(num_target_layers: int, n: int) -> tuple[int, ...]:
    """n layers spread from the second to the third-from-last (shallow + deep features, as
    z-lab picks them); a target too shallow for that spreads over all its layers."""
    L = num_target_layers
    if not 1 <= n <= L:
        raise ThorError(f"cannot pick {n} tap layers from a {L}-layer target")
    lo, hi = (1, L - 3) if L - 3 - 1 >= n - 1 else (0, L - 1)
    if n == 1:
        return ((lo + hi) // 2,)
    return tuple(lo + (i * (hi - lo)) // (n - 1) for i in range(n))


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> Path:
    """Write our layout; files are replaced atomically."""
    from safetensors.torch import save_file

    if any(isinstance(m, RowLinear) for m in drafter.modules()):
        # its projections now live as the row kernel's 8-bit blocks: a checkpoint would lack them
        raise ThorError(
            "dflash: this drafter drafts on the row kernel (a proposer was built from it); "
            "save it before building a proposer, or load it again"
        )
    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, **asdict(drafter.cfg)}
    doc["tap_layers"] = list(drafter.cfg.tap_layers)
    tensors = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    tmp = d / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": FORMAT})
    tmp.replace(d / "model.safetensors")
    write_json_atomic(d / "config.json", doc)
    vocab_file = d / FILENAME
    if drafter.draft_vocab is not None:
        drafter.draft_vocab.save(d)
    elif vocab_file.exists():
        vocab_file.unlink()  # a stale shortlist would belong to the drafter just replaced
    return d


def _ours(doc: dict, p: Path) -> DFlashConfig:
    names = {f.name for f in fields(DFlashConfig)}
    unknown = sorted(set(doc) - names - {"format"})
    if unknown:
        raise ThorError(f"{p}: unknown drafter config keys {unknown}")
    try:
        return DFlashConfig(**{k: v for k, v in doc.items() if k in names})
    except (TypeError, ValueError) as e:
        raise ThorError(f"{p}: bad drafter config ({e})") from None


def _zlab(doc: dict, p: Path) -> DFlashConfig:
    archs = doc.get("architectures") or ["DFlashDraftModel"]
    if any(a != "DFlashDraftModel" for a in archs):
        raise ThorError(
            f"{p}: unsupported drafter architecture {archs} (supported: DFlashDraftModel)"
        )
    if doc.get("attention_bias"):
        raise ThorError(f"{p}: attention_bias drafters are not supported")
    rs = doc.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type", "default")) != "default":
        raise ThorError(f"{p}: rope_scaling {rs} is not supported for drafters")
    dc = doc["dflash_config"]
    if not isinstance(dc, dict):
        raise ThorError(f"{p}: dflash_config must be a JSON object")

    try:
        return _zlab_fields(doc, dc, p)
    except (TypeError, ValueError) as e:
        raise ThorError(f"{p}: bad drafter config ({e})") from None


def _need(d: dict, key: str, p: Path):
    if key not in d:
        raise ThorError(f"{p}: missing key {key!r}")
    return d[key]


def _zlab_fields(doc: dict, dc: dict, p: Path) -> DFlashConfig:
    heads = int(_need(doc, "num_attention_heads", p))
    hidden = int(_need(doc, "hidden_size", p))
    theta = doc.get("rope_theta") or (doc.get("rope_parameters") or {}).get("rope_theta") or 1e6
    return DFlashConfig(
        tap_layers=tuple(_need(dc, "target_layer_ids", p)),
        mask_token_id=int(_need(dc, "mask_token_id", p)),
        hidden_size=hidden,
        num_layers=int(_need(doc, "num_hidden_layers", p)),
        num_heads=heads,
        num_kv_heads=int(doc.get("num_key_value_heads") or heads),
        head_dim=int(doc.get("head_dim") or hidden // heads),
        intermediate_size=int(_need(doc, "intermediate_size", p)),
        block_size=int(dc.get("block_size") or doc.get("block_size") or 16),
        rms_eps=float(doc.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        target_id=str(doc.get("_name_or_path") or p.parent.name),
    )


def load_drafter(
    path: str | Path,
    target_cfg: ModelConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> DFlashDrafter:
    """Load either layout; with ``target_cfg`` also check that the drafter fits the target.
    The result still needs the target's embedding / lm_head (DFlashProposer binds them)."""
    d = Path(path)
    if d.is_file() and d.suffix in PICKLE_SUFFIXES:
        raise ThorError(f"{d}: pickle weights are refused (unpickling runs code); use safetensors")
    if not d.exists():
        raise ThorError(f"drafter not found: {d}")
    if not d.is_dir():
        raise ThorError(f"{d}: expected a drafter directory (config.json + model.safetensors)")
    doc = read_json(d / "config.json", "drafter config")
    if doc.get("format") == FORMAT:
        cfg = _ours(doc, d / "config.json")
    elif "dflash_config" in doc:
        cfg = _zlab(doc, d / "config.json")
        n = doc.get("num_target_layers")
        if target_cfg is not None and n is not None and int(n) != target_cfg.num_layers:
            raise ThorError(
                f"{d}: drafter was trained for a {n}-layer target, this one has "
                f"{target_cfg.num_layers}"
            )
    else:
        raise ThorError(f"{d}/config.json: neither a thor-dflash/1 nor a z-lab DFlash config")
    if target_cfg is not None:
        check_fits(cfg, target_cfg, str(d))

    weights = read_safetensors(d, "drafter weights")
    if weights and all(k.startswith("model.") for k in weights):
        weights = {k[len("model.") :]: v for k, v in weights.items()}
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg)
    expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    for name, shape in expected.items():
        if name not in weights:
            raise ThorError(f"{d}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ThorError(
                f"{d}: tensor {name} has shape {list(weights[name].shape)}, expected {list(shape)}"
            )
    extra = sorted(k for k in weights if k not in expected and not k.endswith(_IGNORED))
    if extra:
        raise ThorError(
            f"{d}: unexpected tensors {extra[:4]} (not a DFlash drafter of this layout?)"
        )
    sd = {k: weights[k].to(device=device, dtype=dtype) for k in expected}
    drafter.load_state_dict(sd, strict=True, assign=True)
    drafter.draft_vocab = load_draft_vocab(
        d, target_cfg.vocab_size if target_cfg is not None else None
    )
    return drafter.eval()
