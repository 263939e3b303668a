"""Training checkpoints for `thor calib distill`: safetensors + JSON, never pickle.

Layout (under OUT/ckpt/):
  state-STEP.safetensors  model.<param> (drafter weights), opt.<param>.exp_avg / .exp_avg_sq / .step
                          (AdamW state), rng.train (uint8: the sampling generator's state)
  ckpt.json               {"format": "thor-distill-ckpt/1", "step", "file", "sha256", "fingerprint",
                           "losses": [[step, loss], ...], "elapsed_s"}

ckpt.json is the commit point: it is replaced atomically (tmp + os.replace) only after its
tensor file is completely written, and it records that file's sha256 — so a crash mid-save
leaves the previous checkpoint valid, and a truncated or swapped tensor file is detected
before anything is loaded. The fingerprint holds every setting that shapes the run (data,
taps, sizes, optimizer and schedule, seed); resuming with a different one is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import sha256_file, write_json_atomic

CKPT_FORMAT = "thor-distill-ckpt/1"


def save_checkpoint(
    ckpt_dir: Path,
    step: int,
    drafter,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    fingerprint: dict,
    losses: list,
    elapsed_s: float,
) -> Path:
    from safetensors.torch import save_file

    ckpt_dir.mkdir(parents=True, exist_ok=True)
    names = {id(p): n for n, p in drafter.named_parameters()}
    tensors = {f"model.{n}": p.detach().contiguous().cpu() for n, p in drafter.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq", "step"):
                if k in st:
                    tensors[f"opt.{names[id(p)]}.{k}"] = (
                        torch.as_tensor(st[k]).detach().contiguous().cpu()
                    )
    tensors["rng.train"] = gen.get_state().contiguous()
    name = f"state-{step:07d}.safetensors"
    tmp = ckpt_dir / (name + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": CKPT_FORMAT})
    os.replace(tmp, ckpt_dir / name)
    doc = {
        "format": CKPT_FORMAT,
        "step": step,
        "file": name,
        "sha256": sha256_file(ckpt_dir / name),
        "fingerprint": fingerprint,
        "losses": losses,
        "elapsed_s": round(elapsed_s, 3),
    }
    write_json_atomic(ckpt_dir / "ckpt.json", doc, indent=None)
    for old in ckpt_dir.glob("state-*.safetensors"):  # keep only the committed one
        if old.name != name:
            old.unlink(missing_ok=True)
    return ckpt_dir / name


def load_checkpoint(
    ckpt_dir: Path, drafter, opt: torch.optim.Optimizer, gen: torch.Generator, fingerprint: dict
) -> dict:
    """Restore weights, optimizer and RNG in place. -> the ckpt.json document."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    jf = ckpt_dir / "ckpt.json"
    if not jf.exists():
        raise ThorError(f"--resume: no checkpoint in {ckpt_dir} (ckpt.json missing)")
    try:
        doc = json.loads(jf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ThorError(f"--resume: {jf} is damaged ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != CKPT_FORMAT:
        raise ThorError(f"--resume: {jf} is not a {CKPT_FORMAT} checkpoint")
    old = doc.get("fingerprint") or {}
    diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
    if diff:
        raise ThorError(
            f"--resume: checkpoint in {ckpt_dir} was made with different settings "
            f"({', '.join(diff)}); rerun with the original arguments or drop --resume"
        )
    f = ckpt_dir / str(doc.get("file", ""))
    if not f.is_file():
        raise ThorError(f"--resume: checkpoint tensor file {f} is missing")
    if sha256_file(f) != doc.get("sha256"):
        raise ThorError(
            f"--resume: checkpoint tensor file {f} is truncated or damaged (sha256 mismatch)"
        )
    try:
        t = load_file(str(f))
    except (SafetensorError, OSError, ValueError) as e:
        raise ThorError(f"--resume: cannot read {f}: {e}") from None

    params = dict(drafter.named_parameters())
    for n, p in params.items():
        k = f"model.{n}"
        if k not in t or tuple(t[k].shape) != tuple(p.shape):
            raise ThorError(
                f"--resume: {f} lacks {k} of shape {list(p.shape)} (different drafter?)"
            )
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(t[f"model.{n}"])
    # Rebuild AdamW state keyed by the live parameter objects.
    for n, p in params.items():
        st = {
            k: t[f"opt.{n}.{k}"].clone()
            for k in ("exp_avg", "exp_avg_sq", "step")
            if f"opt.{n}.{k}" in t
        }
        if st:
            if set(st) != {"exp_avg", "exp_avg_sq", "step"}:
                raise ThorError(f"--resume: {f} has partial optimizer state for {n}")
            opt.state[p] = st
    if "rng.train" not in t:
        raise ThorError(f"--resume: {f} lacks the RNG state")
    gen.set_state(t["rng.train"])
    return doc


# What a starting drafter (`distill --init`) must share with the one being trained; the rest may
# differ: its taps' weight kind, the plan format it learnt, its target's name.
_SHAPE_KEYS = (
    "tap_layers",
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "block_size",
    "window",
    "mask_token_id",
)


def init_hash(path: str) -> str:
    """The starting drafter's weights, in the run's fingerprint: a resume starts from the same."""
    return sha256_file(Path(path) / "model.safetensors")


def init_weights(drafter, path: str) -> None:
    """Start ``drafter`` from the drafter at ``path`` (same shape, else a clear error)."""
    from thor_runtime.speculative import load_drafter

    start = load_drafter(path)
    diff = [k for k in _SHAPE_KEYS if getattr(start.cfg, k) != getattr(drafter.cfg, k)]
    if diff:
        raise ThorError(
            f"distill --init {path}: that drafter differs in "
            + ", ".join(
                f"{k} ({getattr(start.cfg, k)} there, {getattr(drafter.cfg, k)} here)" for k in diff
            )
        )
    drafter.load_state_dict(start.state_dict())
