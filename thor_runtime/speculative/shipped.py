"""Shipped DFlash drafters: found per target, and checked against the planner's request format.

Every directory under ``thor_runtime/drafters/`` with a ``config.json`` is a shipped drafter.
A target uses the one trained for it: the config's ``target_id`` is the target's name, its
``hidden_size`` the target's, and its ``target_weights`` the target's weight kind (or "",
unrecorded). Only config.json is read to choose, so a target without a drafter, or one whose
drafter ``auto`` declines, never loads drafter weights.

Staleness: a drafter's config records ``plan_format``, the fingerprint of the planner request
format its training plans were written in (agent/planner/plan_format.py). When the planner's prompt
or schema changes, a drafter trained on the old format drafts a document that is gone and its
acceptance collapses without any error. The runtime cannot compute today's fingerprint (the
planner lives above it), so a caller that plans hands it in; ``None`` means the caller does not
plan (free text), and then no drafter is stale. A stale drafter still runs when asked for by
method (``--spec dflash|combined``); ``--spec auto`` declines it and plans with prompt lookup.
Either way one line on stderr says so at load, and the Speculation's ``note`` (the stats'
``spec_note``) says why.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from thor_runtime.errors import ThorError

DRAFTERS_DIR = Path(__file__).resolve().parent.parent / "drafters"
# The methods that run a DFlash drafter (``auto`` only when one fits and is current).
DRAFTER_METHODS = ("dflash", "combined", "auto")
RETRAIN = (
    "regenerate its data and distill it again on today's planner: "
    "`thor calib gen-data --constrained`, then `thor calib distill`"
)


def weights_kind(model) -> str:
    """How the target holds its weights: its quantization ("int4", "int8") or its dtype."""
    quant = getattr(model, "quant", None)
    if quant:
        return quant
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
        str(getattr(model, "dtype", "")).removeprefix("torch."), ""
    )


@dataclass(frozen=True)
class ShippedDrafter:
    path: Path
    target_id: str
    hidden_size: int | None
    target_weights: str  # "" = unrecorded: taken for any weight kind
    plan_format: str  # "" = unrecorded

    @property
    def name(self) -> str:
        return self.path.name

    def fits(self, model) -> bool:
        """Trained for this target: same model id and hidden size, and taps from the same weight
        kind (a drafter distilled on fp32 taps commits about half as many tokens per cycle on
        int4 weights, where its forwards then cost more than they save)."""
        return (
            self.target_id == model.cfg.name
            and self.hidden_size == model.cfg.hidden_size
            and self.target_weights in ("", weights_kind(model))
        )

    def describe(self) -> str:
        return f"{self.name} (for {self.target_id!r}, {self.target_weights or 'any'} weights)"


def read_shipped(path: str | Path) -> ShippedDrafter:
    """The choosing fields of one drafter directory's config.json."""
    d = Path(path)
    try:
        doc = json.loads((d / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ThorError(f"{d}/config.json: unreadable drafter config ({e})") from None
    if not isinstance(doc, dict):
        raise ThorError(f"{d}/config.json: a drafter config must be a JSON object")
    fmt = doc.get("plan_format", "")
    return ShippedDrafter(
        d,
        str(doc.get("target_id", "")),
        doc.get("hidden_size"),
        str(doc.get("target_weights", "")),
        fmt if isinstance(fmt, str) else "",
    )


def shipped_drafters(root: str | Path | None = None) -> tuple[ShippedDrafter, ...]:
    """Every drafter under ``root`` (default: the shipped ones), by directory name. One whose
    config cannot be read is left out: it cannot be matched to a target (the shipped-drafter
    tests read each directory themselves and name it)."""
    root = DRAFTERS_DIR if root is None else Path(root)
    if not root.is_dir():
        return ()
    out = []
    for d in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        try:
            out.append(read_shipped(d))
        except ThorError:
            continue
    return tuple(out)


def drafter_for(model, root: str | Path | None = None) -> ShippedDrafter | None:
    """The shipped drafter trained for this target, or None. Where several fit, one recorded for
    exactly this weight kind comes before one that records none."""
    fits = [d for d in shipped_drafters(root) if d.fits(model)]
    fits.sort(key=lambda d: (d.target_weights == "", d.name))
    return fits[0] if fits else None


def require_drafter_for(model, root: str | Path | None = None) -> ShippedDrafter:
    found = drafter_for(model, root)
    if found is None:
        have = ", ".join(d.describe() for d in shipped_drafters(root)) or "none"
        raise ThorError(
            f"no shipped DFlash drafter for the target {model.cfg.name!r} "
            f"({weights_kind(model) or '?'} weights, hidden size {model.cfg.hidden_size}); "
            f"shipped: {have}. Pass --drafter DIR "
            "(train one with `thor calib distill`), or use --spec ngram or auto"
        )
    return found


def format_stale(recorded: str, current: str | None) -> str | None:
    """Why a drafter stamped with ``recorded`` is stale for the planner format ``current``; None
    if it is current or ``current`` is unknown (the caller does not plan)."""
    if current is None or recorded == current:
        return None
    if not recorded:
        return "it records no plan format (distilled before formats were fingerprinted)"
    return f"it was distilled on plan format {recorded[:19]}, the planner now writes {current[:19]}"


def recorded_format(path: str | Path) -> str | None:
    """The plan format a drafter directory's config records ("" none); None when the config
    cannot be read, so that loading it reports the real problem."""
    try:
        doc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    fmt = doc.get("plan_format", "") if isinstance(doc, dict) else None
    return fmt if isinstance(fmt, str) else None


# Warnings already printed: evaluation and benchmarks build a Speculation per prompt, and the
# same stale drafter should be reported once per process, not once per build.
_warned: set[str] = set()


def warn(line: str) -> None:
    """One line on stderr, in the CLI's ``thor: error:`` form, once per process."""
    if line not in _warned:
        _warned.add(line)
        print(f"thor: warning: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class DrafterPick:
    drafter: str | None = None  # the directory to load, where the method's options named none
    use: bool = True  # False: ``auto`` plans with prompt lookup (no drafter fits, or it is stale)
    note: str = ""  # why, for the stats ("" when there is nothing to say)


def pick_drafter(
    method: str, given: str | None, in_memory, model, plan_format: str | None
) -> DrafterPick:
    """Which drafter a DFlash-based method runs and whether its plan format still holds.

    given: the --drafter directory, if any; in_memory: a DFlashDrafter passed ready-made (taken
    before ``given``, which then only names it); plan_format: today's planner fingerprint, or
    None when the caller does not plan."""
    if method not in DRAFTER_METHODS:
        return DrafterPick()
    path, hint = None, RETRAIN
    if in_memory is not None:
        label, recorded = given or "in memory", in_memory.cfg.plan_format
    elif given:
        label, recorded = given, recorded_format(given)
        if recorded is None:  # unreadable: loading it says what is wrong
            return DrafterPick()
    else:
        found = drafter_for(model) if method == "auto" else require_drafter_for(model)
        if found is None:  # the ordinary case of a target without one: nothing declined
            return DrafterPick(use=False)
        path, label, recorded = str(found.path), found.name, found.plan_format
        hint = f"retrain it as {found.path / 'README.md'} describes"
    reason = format_stale(recorded, plan_format)
    if reason is None:
        return DrafterPick(path)
    stale = f"DFlash drafter {label} is stale for the planner: {reason}"
    if method == "auto":
        warn(f"{stale}; --spec auto plans with prompt lookup instead ({hint})")
        return DrafterPick(
            use=False, note=f"auto declined DFlash drafter {label}: {reason}; prompt lookup instead"
        )
    warn(f"{stale}; running it as asked (--spec {method}), expect few accepted drafts ({hint})")
    return DrafterPick(path, note=stale)
