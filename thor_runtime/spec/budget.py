"""How many proposer drafts to verify in the next cycle.

On a CPU, verifying K + 1 rows costs far more than one step when K is large (16 rows
~2.2x a 1-row step for SmolLM2-135M here), but 2-3 rows cost about the same as one. A
drafter that is off its distribution (the planner drafter on free text) would make every
cycle pay for 16 rows and commit ~1 token. The budget keeps a running mean of the drafts
the proposer got accepted per cycle; while it is below ``threshold`` only ``low_k`` drafts
are verified (nearly free, and they keep measuring the proposer), otherwise all K.

Drafts never decide which token is committed, so this changes speed, never output.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ThorError


@dataclass(frozen=True)
class DraftBudget:
    low_k: int = 2            # drafts per cycle while the proposer is rarely right
    threshold: float = 0.5    # mean accepted proposer drafts per cycle below which low_k applies
    decay: float = 0.25       # weight of the newest cycle in the running mean

    def __post_init__(self):
        if self.low_k < 1:
            raise ThorError(f"draft budget: low_k must be >= 1, got {self.low_k}")
        if not self.threshold >= 0:
            raise ThorError(f"draft budget: threshold must be >= 0, got {self.threshold}")
        if not 0 < self.decay <= 1:
            raise ThorError(f"draft budget: decay must be in (0, 1], got {self.decay}")

    def start(self, k: int) -> float:
        """Initial running mean: optimistic, so a new request starts with all K drafts."""
        return float(k)

    def cap(self, k: int, mean: float) -> int:
        """Proposer drafts to verify next (grammar-forced tokens come on top)."""
        return k if mean >= self.threshold else min(k, self.low_k)

    def update(self, mean: float, accepted: int) -> float:
        return (1 - self.decay) * mean + self.decay * accepted
