"""`thor calib kv-scales`: per-layer, per-KV-head FP8 (e4m3) scales for K and V.

Calibration: each train-split prompt is run through the target's forward with an fp32
``KVCache``; ``cache.view(layer)`` is exactly what attention reads (K after k-norm and RoPE),
so its per-head absolute maximum over (positions, head dim) is the range to cover. The
running max over all prompts gives amax [L, Hkv]; scale = amax * margin / 448.

Margin: 1.0 by default. e4m3 keeps ~2 significant digits at every magnitude, so mapping the
observed max onto 448 wastes no precision, and values beyond it (unseen prompts) are clamped
to ±448*scale by the cache rather than overflowing to NaN — a bounded error on rare outliers.
Raise --margin (e.g. 1.25) to leave headroom instead.

Report (held-out prompts): greedy decoding with bf16 KV is the reference; fp8 KV with the
calibrated and with unit scales is compared to it by first-divergence position (mean over
prompts; a prompt that never diverges counts its full length) and token agreement (share of
positions, up to the shorter output, where the tokens are equal).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from thor_runtime.cache import FP8_MAX, KVCache, KVScales, prompt_set_hash
from thor_runtime.engine import Runtime, SamplingParams
from thor_runtime.errors import ThorError

from .prompts import PromptSpec, calib_prompts, render_key, robot_prompts


@dataclass(frozen=True)
class KVCalibConfig:
    n: int = 32  # calibration prompts (train split)
    eval_n: int = 4  # held-out prompts for the agreement report (0 = no report)
    max_tokens: int = 64  # greedy tokens per report prompt
    margin: float = 1.0  # scale = amax * margin / 448
    seed: int = 0
    general_frac: float = 0.1  # share of general instructions in the calibration set

    def __post_init__(self):
        PromptSpec("train", self.n, self.seed, self.general_frac)  # validates the fraction
        if self.n < 1 or self.max_tokens < 1 or self.eval_n < 0:
            raise ThorError("kv-scales: n and max_tokens must be >= 1, eval_n >= 0")
        if not (self.margin > 0 and self.margin < float("inf")):
            raise ThorError(f"kv-scales: margin must be a positive number, got {self.margin}")


@torch.inference_mode()
def kv_amax(
    model, prompt_ids: list[list[int]], progress: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (k_amax, v_amax), each [L, Hkv] fp32: max |K|, |V| per layer and KV head."""
    from tqdm import tqdm

    cfg = model.cfg
    ka = torch.zeros(cfg.num_layers, cfg.num_kv_heads)  # [L, Hkv]
    va = torch.zeros(cfg.num_layers, cfg.num_kv_heads)
    for ids in tqdm(
        prompt_ids, desc="kv amax", unit="prompt", file=sys.stderr, disable=not progress
    ):
        # A hybrid target builds its own cache; its GDN layers hold no K/V (their scale stays 1).
        hybrid = getattr(model, "attn_index", None)
        cache = (
            model.new_cache(len(ids))
            if hybrid is not None
            else KVCache(cfg, len(ids), "fp32", model.dtype, device=model.device)
        )
        model.forward(torch.tensor(ids, dtype=torch.long), cache, logits_rows="none")
        for i in range(cfg.num_layers):
            if hybrid is not None and i not in hybrid:
                continue
            k, v = cache.kv.view(hybrid[i]) if hybrid is not None else cache.view(i)  # [Hkv, T, Dh]
            ka[i] = torch.maximum(ka[i], k.abs().float().amax(dim=(1, 2)).cpu())
            va[i] = torch.maximum(va[i], v.abs().float().amax(dim=(1, 2)).cpu())
    return ka, va


def scales_from_amax(
    ka: torch.Tensor, va: torch.Tensor, margin: float = 1.0, prompt_hash: str = ""
) -> KVScales:
    # A head that never fired (amax 0) would get scale 0 and divide by zero: give it 1.
    def s(a):
        return torch.where(a > 0, a * margin / FP8_MAX, torch.ones_like(a))

    return KVScales(s(ka), s(va), prompt_hash)


def calibrate(model, tok, cfg: KVCalibConfig, progress: bool = False) -> KVScales:
    msgs = calib_prompts(PromptSpec("train", cfg.n, cfg.seed, cfg.general_frac))
    ids = [tok.encode_chat(m) for m in msgs]
    ka, va = kv_amax(model, ids, progress)
    return scales_from_amax(ka, va, cfg.margin, prompt_set_hash([render_key(m) for m in msgs]))


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    """Mean first-divergence position and token agreement of got vs ref (lists per prompt)."""
    first, same, total = [], 0, 0
    for r, g in zip(ref, got):
        n = min(len(r), len(g))
        d = next((j for j in range(n) if r[j] != g[j]), n)
        first.append(d)
        same += sum(1 for j in range(n) if r[j] == g[j])
        total += max(len(r), len(g))
    return {
        "mean_first_divergence": round(sum(first) / max(1, len(first)), 2),
        "token_agreement": round(same / total, 4) if total else 1.0,
        "identical_prompts": sum(1 for r, g in zip(ref, got) if r == g),
    }


def report(model, tok, scales: KVScales, cfg: KVCalibConfig, progress: bool = False) -> dict:
    from tqdm import tqdm

    prompts = [tok.encode_chat(m) for m in robot_prompts("heldout", cfg.eval_n, cfg.seed)]
    params = SamplingParams(max_tokens=cfg.max_tokens)
    runs = {
        "bf16": Runtime(model, tok, kv_dtype="bf16"),
        "fp8_calibrated": Runtime(model, tok, kv_dtype="fp8", kv_scales=scales),
        "fp8_unit": Runtime(model, tok, kv_dtype="fp8", kv_scales=KVScales.unit(model.cfg)),
    }
    outs: dict[str, list[list[int]]] = {k: [] for k in runs}
    finite = True
    for ids in tqdm(
        prompts, desc="kv report", unit="prompt", file=sys.stderr, disable=not progress
    ):
        for name, rt in runs.items():
            outs[name].append(rt.generate(ids, params).token_ids)
        # The calibrated cache must give finite logits on a full prefill (no NaN/inf from fp8).
        cache = runs["fp8_calibrated"].new_cache(len(ids))
        finite &= bool(
            torch.isfinite(model.forward(torch.tensor(ids), cache, logits_rows="last").logits).all()
        )
    return {
        "prompts": len(prompts),
        "split": "heldout",
        "max_tokens": cfg.max_tokens,
        "reference": "bf16 KV",
        "fp8_calibrated": agreement(outs["bf16"], outs["fp8_calibrated"]),
        "fp8_unit": agreement(outs["bf16"], outs["fp8_unit"]),
        "fp8_calibrated_finite": finite,
    }


def with_report(doc: dict, out: Path, make_report) -> dict:
    """``doc`` with its held-out report (``make_report()``), also written beside ``out`` as
    OUT.report.json; ``report_file`` names it (both calibrations summarize this way)."""
    doc["report"] = make_report()
    rp = out.with_name(out.stem + ".report.json")
    rp.write_text(json.dumps(doc, indent=1))
    doc["report_file"] = str(rp)
    return doc


def scales_out_path(out: str | Path, example: str) -> Path:
    """--out of a scales command: a file path (its directory made), never a directory."""
    out = Path(out)
    if out.is_dir():
        raise ThorError(f"--out {out} is a directory; give a file path (e.g. {example})")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def calibrate_and_report(
    loaded, cfg: KVCalibConfig, out: str | Path, progress: bool = True
) -> dict:
    out = scales_out_path(out, "kv_scales.json")
    scales = calibrate(loaded.model, loaded.tokenizer, cfg, progress)
    scales.save(out)
    KVScales.load(out, loaded.cfg)  # what we wrote must read back
    doc = {
        "out": str(out),
        "calibration_prompts": cfg.n,
        "margin": cfg.margin,
        "prompt_set_sha256": scales.prompt_set_sha256,
        "k_scale_range": [round(float(scales.k.min()), 6), round(float(scales.k.max()), 6)],
        "v_scale_range": [round(float(scales.v.min()), 6), round(float(scales.v.max()), 6)],
    }
    if cfg.eval_n:
        with_report(doc, out, lambda: report(loaded.model, loaded.tokenizer, scales, cfg, progress))
    return doc
