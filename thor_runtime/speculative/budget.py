"""How many proposer drafts to verify in the next cycle.

On a CPU, verifying K + 1 rows costs far more than one step when K is large (16 rows
~2.1x a 1-row step for SmolLM2-135M here), while 2-3 rows cost about one step. A drafter
off its distribution (the planner drafter on free text) would make every cycle pay for 16
rows and commit ~1 token. So the budget keeps a running mean of the drafts the proposer got
accepted per cycle. While it is at least ``threshold``, up to ``low_k + ramp * last`` of the
K drafts are verified, ``last`` being the drafts accepted in the previous cycle: a request
starts with ``low_k`` and reaches all K within two or three cycles of a right proposer, while
a stranger to the text pays for few rows before the pause (a verify row costs ~0.1-0.35 of a
step on CPU kernels). Below it, the proposer is not asked at all, except for ``low_k`` probe drafts
after ``probe_every`` cycles, then after twice, four times ... as many, at most ``max_gap`` apart:
one accepted probe lifts the mean over the threshold again.

Drafts never decide which token is committed, so this changes speed, never output.
The state is a plain (mean, cycles since the mean fell below the threshold) tuple that the
generation loop carries.

This is the budget of the named methods (``--spec ngram|dflash|combined``). ``--spec auto``
runs ``auto.CostBudget`` in its place, which chooses K from the verify cost curve and the
running acceptance per position, with the same probe schedule (``probe_due``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from thor_runtime.errors import ThorError

State = tuple[float, int, int]  # (running mean, paused cycles, drafts accepted last cycle)


@dataclass(frozen=True)
class Cycle:
    """What one cycle cost, for a budget that learns from it (the loop fills it in)."""

    rows: int = 1  # verified rows: anchor + forced + drafts
    forced: int = 0  # grammar-forced tokens among them
    verify_s: float = 0.0
    draft_s: float = 0.0  # the proposer's propose call (0 when it was not asked)
    keep_s: float = 0.0  # the proposer's commit (its window update)
    by_id: float = (
        0.0  # share of the verify's rows that computed only the logits of the ids they allow
    )
    members: int = 1  # sequences whose rows shared the verify's forward (inflight.py)
    cycle_s: float = 0.0  # the whole cycle, from choosing drafts to committing
    committed: int = 0  # tokens it committed


def probe_due(paused: int, every: int, max_gap: int) -> bool:
    """After ``every`` paused cycles (or requests), then 2x, 4x ... as many, at most
    ``max_gap`` apart: whether to try the paused proposer now."""
    if paused <= 0 or paused % every:
        return False
    q = paused // every
    return q & (q - 1) == 0 or paused % max_gap == 0


@dataclass(frozen=True)
class DraftBudget:
    low_k: int = 2  # drafts per probing cycle
    threshold: float = 0.5  # mean accepted proposer drafts per cycle below which drafting pauses
    decay: float = 0.25  # weight of the newest cycle in the running mean
    probe_every: int = 4  # while paused, ask the proposer on one cycle in this many
    # Running mean a request starts with: about six empty cycles pause drafting. Faster
    # (initial 2, decay 0.5) also paused the planner drafter in short runs of misses on plans
    # (accept length 7.13 -> 6.70 on the held-out requests, with the 640-plan drafter); this
    # does not.
    initial: float = 4.0
    ramp: float = 3.0  # drafts verified per draft accepted last cycle, beyond low_k (0 = all K)
    max_gap: int = 32  # longest run of paused cycles between two probes

    def __post_init__(self):
        if self.low_k < 1 or self.probe_every < 1:
            raise ThorError(
                f"draft budget: low_k and probe_every must be >= 1, got {self.low_k}, "
                f"{self.probe_every}"
            )
        if not (self.threshold >= 0 and self.initial >= 0):
            raise ThorError(
                f"draft budget: threshold and initial must be >= 0, got {self.threshold}, "
                f"{self.initial}"
            )
        if self.ramp < 0 or self.max_gap < self.probe_every:
            raise ThorError(
                f"draft budget: ramp must be >= 0 and max_gap >= probe_every, got {self.ramp}, "
                f"{self.max_gap}"
            )
        if not 0 < self.decay <= 1:
            raise ThorError(f"draft budget: decay must be in (0, 1], got {self.decay}")

    def start(self) -> State:
        """A new request starts drafting in full."""
        return float(self.initial), 0, 0

    def cap(self, k: int, state: State, forced: int = 0) -> int:
        """Proposer drafts to verify next (grammar-forced tokens, ``forced`` of them, come on
        top)."""
        mean, below, last = state
        if mean >= self.threshold:
            return k if not self.ramp else min(k, self.low_k + math.ceil(self.ramp * last))
        return min(k, self.low_k) if probe_due(below, self.probe_every, self.max_gap) else 0

    def update(
        self, state: State, drafted: int, accepted: int, cycle: Cycle | None = None
    ) -> State:
        """After a cycle in which the proposer drafted ``drafted`` tokens, ``accepted`` kept
        (``cycle``: its costs, which this budget does not read)."""
        mean, below, last = state
        if drafted:
            mean, last = (1 - self.decay) * mean + self.decay * accepted, accepted
        return mean, (below + 1 if mean < self.threshold else 0), last

    def report(self, state: State) -> dict | None:
        """What the stats show of this budget's choices: nothing beyond ``capped_cycles``."""
        return None
