"""Speculative decoding: proposers (one per file), acceptance policies, and a registry.

``build_speculation(SpecOptions, model)`` is the one place a ``Speculation`` — the proposer,
its K, the draft budget and relaxed acceptance, as one frozen value — is assembled; the
generation loop, the planner, calibration and the benchmarks all take it ready-made.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from thor_runtime.config import NGRAM_SIZES, SPEC_METHODS
from thor_runtime.config import SpeculationSettings as _Defaults
from thor_runtime.errors import ThorError
from thor_runtime.speculative.budget import DraftBudget

# drafter discovery and staleness (weights_kind and DRAFTERS_DIR are part of this package's API)
from thor_runtime.speculative.shipped import (
    DRAFTERS_DIR,
    drafter_for,
    pick_drafter,
    require_drafter_for,
)
from thor_runtime.speculative.shipped import weights_kind as weights_kind

if TYPE_CHECKING:  # torch-free at import, so `thor --help` stays fast
    from thor_runtime.speculative.accept import RelaxedConfig
    from thor_runtime.speculative.auto import AutoPolicy
    from thor_runtime.speculative.base import Proposer

# Earlier spellings, still accepted, and the method each names: "hybrid" was the drafter plus
# prompt lookup until the word came to mean the Gated-DeltaNet models (thor_runtime/models/hybrid/).
SPEC_ALIASES = {"hybrid": "combined"}
# The drafter shipped for the embedded default target. Targets find theirs by their config
# (shipped.py: ``drafter_for``); this name stays for the tests and tools that mean this one.
DEFAULT_DRAFTER = DRAFTERS_DIR / "smollm2-135m-dflash"


@dataclass(frozen=True)
class SpecOptions:
    method: str = "none"
    drafter: str | None = (
        None  # DFlash checkpoint dir; None = the shipped one trained for the target
    )
    block_size: int | None = None  # DFlash block B (K = B - 1); None = the drafter's own
    window: int = _Defaults.window  # DFlash per-token context window W
    seed_window: bool = _Defaults.seed_window  # fill the window from the prompt tail at prefill
    ngram_k: int = _Defaults.ngram_k
    ngram_min: int = NGRAM_SIZES[0]
    ngram_max: int = NGRAM_SIZES[1]
    fixed_k: bool = _Defaults.fixed_k  # verify all K drafts every cycle (no draft budget)
    lookup_rate: float = (
        _Defaults.lookup_rate
    )  # combined: prior per-token acceptance of a lookup draft

    def __post_init__(self):
        if self.method not in SPEC_METHODS:
            raise ThorError(
                f"unknown --spec {self.method!r}; choose one of {', '.join(SPEC_METHODS)}"
            )
        object.__setattr__(self, "method", SPEC_ALIASES.get(self.method, self.method))
        if self.block_size is not None and self.block_size < 2:
            raise ThorError(f"block size must be >= 2, got {self.block_size}")
        if self.window < 1:
            raise ThorError(f"window must be >= 1, got {self.window}")
        if not 0 < self.lookup_rate < 1:
            raise ThorError(f"lookup rate must be in (0, 1), got {self.lookup_rate}")


@dataclass(frozen=True)
class Speculation:
    """How one sequence speculates. ``PLAIN`` (no proposer, K = 0) is plain decoding.

    The proposer holds per-sequence state (its window), reset by ``start`` at each prefill:
    one Speculation serves one sequence at a time.
    """

    proposer: Proposer | None = None
    k: int = 0  # drafts per cycle at most
    budget: DraftBudget | None = None  # how many of them to verify; None = always k
    relaxed: RelaxedConfig | None = (
        None  # relaxed acceptance: thinking span, free-text spans (greedy)
    )
    # What an unconstrained request (free text) runs instead, if not this: ``auto`` pairs the
    # planner-trained drafter (constrained plans) with prompt lookup for free text, where the
    # drafter is off its distribution and would only cost its forwards until the budget pauses
    # it; and lookup on plans with a stricter lookup on free text under --fixed-k.
    free_text: "Speculation | None" = None
    # Why the proposer is not what the options asked for, or what is wrong with it (``auto``
    # declined a stale drafter; a stale one ran as asked): the stats' ``spec_note``.
    note: str = ""
    # ``auto``: chooses the proposer and its K per request from the verify cost curve and the
    # acceptance seen so far (auto.py); the Runtime resolves it, with its curve, per request.
    auto: "AutoPolicy | None" = None

    def __post_init__(self):
        if self.k < 0:
            raise ThorError(f"speculation: K must be >= 0, got {self.k}")
        if self.proposer is None and self.k:
            raise ThorError("speculation: K > 0 needs a proposer")

    @property
    def name(self) -> str:
        """The proposer that runs (``auto`` resolved), or ``none``."""
        return self.proposer.name if self.proposer is not None else "none"


PLAIN = Speculation()


def _ngram(opts: SpecOptions, model, drafter=None):
    from thor_runtime.speculative.ngram import NgramConfig, NgramProposer

    p = NgramProposer(NgramConfig(opts.ngram_min, opts.ngram_max, opts.ngram_k))
    return p, opts.ngram_k


def _dflash(opts: SpecOptions, model, drafter=None):
    from thor_runtime.speculative.dflash import DFlashProposer
    from thor_runtime.speculative.dflash_io import load_drafter

    if drafter is None:
        path = Path(opts.drafter) if opts.drafter else require_drafter_for(model).path
        if not path.exists():
            raise ThorError(
                f"DFlash drafter not found: {path} (pass --drafter DIR, or train one with "
                "`thor calib distill`)"
            )
        drafter = load_drafter(path, model.cfg)
    block = opts.block_size or drafter.cfg.block_size
    p = DFlashProposer(
        drafter, model, window=opts.window, seed_window=opts.seed_window, block_size=block
    )
    return p, block - 1


def _combined(opts: SpecOptions, model, drafter=None):
    """DFlash, with prompt lookup taking the cycles where the drafter is unsure (combined.py)."""
    from thor_runtime.speculative.combined import CombinedProposer

    dflash, k = _dflash(opts, model, drafter)
    return CombinedProposer.around(dflash, opts.lookup_rate, opts.ngram_min, opts.ngram_max), k


def shipped_drafter_fits(model) -> bool:
    """A shipped drafter was trained for this target and its weight kind (shipped.py)."""
    return drafter_for(model) is not None


_BUILDERS = {
    "none": lambda opts, model, drafter=None: (None, 0),
    "ngram": _ngram,
    "dflash": _dflash,
    "combined": _combined,
    # auto runs the combined proposer: pick_drafter (shipped.py) has already routed it to
    # prompt lookup where no current drafter fits the target
    "auto": _combined,
}


def build_speculation(
    opts: SpecOptions,
    model,
    relaxed: RelaxedConfig | None = None,
    drafter=None,
    plan_format: str | None = None,
) -> Speculation:
    """The one constructor of a Speculation from user-facing options.

    drafter: a DFlash drafter already in memory (one just distilled, evaluated before it is
    saved), taken instead of loading ``opts.drafter``; only the DFlash-based methods use it.
    plan_format: the planner's request-format fingerprint today (agent.planner.plan_format), handed
    in by a caller that plans; a drafter recorded on another format is stale: auto declines it,
    dflash and combined run it, both say so on stderr (shipped.py). None: no check."""
    pick = pick_drafter(opts.method, opts.drafter, drafter, model, plan_format)
    if pick.drafter is not None:
        opts = replace(opts, drafter=pick.drafter)
    proposer, k = _BUILDERS[opts.method if pick.use else "ngram"](opts, model, drafter)
    budget = None if opts.fixed_k or proposer is None else DraftBudget()
    free = None
    if opts.method == "auto" and proposer is not None:
        # Free text under auto: prompt lookup as `--spec ngram` runs it, where the cost policy
        # verifies a match's drafts only while their acceptance per position pays for the rows
        # (chat on the row kernel: 1.01x ngram, against 0.93x with matches of 3+ tokens). Under
        # --fixed-k, with no cost policy, only matches of 3+ tokens: two-token matches ("of
        # the") rarely continue the same way, and their failed verifies cost 3-5% of plain
        # decode on chat prompts (int4, step graph, measured).
        strict = replace(opts, ngram_min=max(opts.ngram_min, 3), ngram_max=max(opts.ngram_max, 3))
        lookup, lk = _ngram(strict if opts.fixed_k else opts, model)
        free = Speculation(lookup, lk, None if opts.fixed_k else DraftBudget(), relaxed)
    spec = Speculation(proposer, k, budget, relaxed, free, pick.note)
    if opts.method == "auto" and not opts.fixed_k:
        from thor_runtime.speculative.auto import with_cost_policy

        spec = with_cost_policy(spec, opts)  # the choice per request, from the cost curve (auto.py)
    return spec


# ---- the names other packages import from here, loaded on first use ----
_LAZY = [
    "Arm",
    "auto_state_of",
    "load_auto_state",
    "restore_auto_state",
    "save_auto_state",
    "DEFAULT_TIE_TOL",
    "DFlashConfig",
    "DFlashDrafter",
    "DFlashProposer",
    "DRAFTER_METHODS",
    "DraftVocab",
    "RelaxedConfig",
    "block_attention_mask",
    "default_tap_layers",
    "first_divergence",
    "format_stale",
    "judge",
    "load_drafter",
    "machine_key",
    "measure",
    "read_shipped",
    "require_drafter_for",
    "response_counts",
    "save_drafter",
    "summarize",
    "timed_verifies",
    "verify_calls",
]


def __getattr__(name: str):
    # static imports, one branch per module, so the layering test sees every edge
    if name in ("RelaxedConfig",):
        from thor_runtime.speculative import accept as module
    elif name in ("Arm",):
        from thor_runtime.speculative import auto as module
    elif name in ("auto_state_of", "load_auto_state", "restore_auto_state", "save_auto_state"):
        from thor_runtime.speculative import auto_state as module

        name = {
            "auto_state_of": "state",
            "load_auto_state": "load",
            "restore_auto_state": "restore",
            "save_auto_state": "save",
        }[name]
    elif name in ("machine_key", "measure", "timed_verifies", "verify_calls"):
        from thor_runtime.speculative import cost as module
    elif name in ("DFlashProposer",):
        from thor_runtime.speculative import dflash as module
    elif name in ("default_tap_layers", "load_drafter", "save_drafter"):
        from thor_runtime.speculative import dflash_io as module
    elif name in ("DFlashConfig", "DFlashDrafter", "block_attention_mask"):
        from thor_runtime.speculative import dflash_model as module
    elif name in ("DraftVocab", "response_counts"):
        from thor_runtime.speculative import draft_vocab as module
    elif name in ("DEFAULT_TIE_TOL", "first_divergence", "judge", "summarize"):
        from thor_runtime.speculative import lossless as module
    elif name in ("DRAFTER_METHODS", "format_stale", "read_shipped", "require_drafter_for"):
        from thor_runtime.speculative import shipped as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
