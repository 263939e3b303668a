"""Combined proposer (``--spec combined``; ``hybrid`` is its earlier name): the DFlash drafter,
with prompt lookup taking over where it is unsure. (Not the hybrid models of
thor_runtime/models/hybrid/.)

Why: on held-out planner requests the shipped drafter misses most where the target copies
text out of the prompt — the task sentence into "task", object and place names into the
effects ("... placed at the scale"). A 2-layer drafter copies poorly; prompt lookup copies
exactly but knows nothing else. So each cycle both propose, and the chain with the larger
expected number of accepted tokens is verified (one chain: no tree, no extra rows):

    DFlash:  sum_i prod_{j<=i} c_j   with c_j the drafter's own probability of draft j
    lookup:  sum_i rho^i             over its continuation, rho = ``lookup_rate``

rho is a prior per-token acceptance rate for lookup drafts. On 8 held-out planner requests,
replaying both proposers (with the earlier 640-plan drafter) against the target's plans
gave accept lengths of 7.1 (DFlash), 3.0 (lookup) and 9.0 (this, rho 0.8; 0.7 gave 8.4,
0.9 gave 8.8, and always taking the better of the two, an oracle, 9.1). On 8 other
held-out requests, kept to check that choice: 6.9, 3.0 and 8.6. With the shipped drafter,
`thor calib eval-drafter --constrained` measures 9.46 (DFlash) against 10.75 (this).

The choice only decides which tokens are verified, never which are committed, so greedy
output is unchanged. With sampling, DFlash drafts come with their q; lookup drafts are
deterministic (q one-hot, ``None``), which speculative sampling handles exactly; the
choice depends on the drafter's own draws only, never on the target's acceptance draws.
"""

from __future__ import annotations

from thor_runtime.config import SpeculationSettings as _Defaults
from thor_runtime.errors import ThorError
from thor_runtime.speculative.base import Proposer
from thor_runtime.speculative.dflash import DFlashProposer
from thor_runtime.speculative.ngram import NgramConfig, NgramProposer


class CombinedProposer(Proposer):
    name = "combined"

    def __init__(
        self,
        dflash: DFlashProposer,
        lookup: NgramProposer,
        lookup_rate: float = _Defaults.lookup_rate,
    ):
        if not 0 < lookup_rate < 1:
            raise ThorError(f"combined: lookup rate must be in (0, 1), got {lookup_rate}")
        self.dflash, self.lookup, self.rate = dflash, lookup, float(lookup_rate)
        self.tap_layers, self.window = dflash.tap_layers, dflash.window
        self.lookup_cycles = 0  # cycles whose verified draft came from lookup (stats, tests)

    def fork(self) -> "CombinedProposer":
        return CombinedProposer(self.dflash.fork(), self.lookup.fork(), self.rate)

    def start(self, prompt_ids, prompt_taps):
        self.lookup_cycles = 0
        self.dflash.start(prompt_ids, prompt_taps)

    @classmethod
    def around(
        cls,
        dflash: DFlashProposer,
        lookup_rate: float = _Defaults.lookup_rate,
        min_n: int = NgramConfig.min_n,
        max_n: int = NgramConfig.max_n,
    ) -> "CombinedProposer":
        """The combination for a DFlash proposer: lookup drafts as many tokens as a DFlash block."""
        return cls(
            dflash, NgramProposer(NgramConfig(min_n, max_n, dflash.block_size - 1)), lookup_rate
        )

    def _expect_lookup(self, n: int) -> float:
        return sum(self.rate ** (i + 1) for i in range(n))

    def propose(self, seq, k):
        drafts, q, conf = self.dflash.propose_scored(seq, k)
        expect_d = float(conf.cumprod(0).sum()) if len(conf) else 0.0
        if expect_d >= self._expect_lookup(min(k, self.lookup.cfg.k)):
            return drafts, q  # no lookup draft could win: skip its scan of the sequence
        cont, _ = self.lookup.propose(seq, k)
        if self._expect_lookup(len(cont)) > expect_d:
            self.lookup_cycles += 1
            return list(cont), None
        return drafts, q

    def commit(self, n_rows, taps):
        # The window takes every committed token whichever chain proposed it.
        self.dflash.commit(n_rows, taps)
