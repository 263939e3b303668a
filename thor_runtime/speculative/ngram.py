"""Prompt-lookup proposer: continue the longest recent n-gram match. No training.

Robot plans repeat the world's names and the schema's keys, so the tail of the
output very often already occurred in the prompt or earlier in the output.
"""

from __future__ import annotations

from dataclasses import dataclass

from thor_runtime.config import NGRAM_SIZES
from thor_runtime.config import SpeculationSettings as _Defaults
from thor_runtime.errors import ThorError
from thor_runtime.speculative.base import Proposer


@dataclass(frozen=True)
class NgramConfig:
    min_n: int = NGRAM_SIZES[0]
    max_n: int = NGRAM_SIZES[1]
    k: int = _Defaults.ngram_k

    def __post_init__(self):
        if not 1 <= self.min_n <= self.max_n:
            raise ThorError(f"ngram: need 1 <= min_n <= max_n, got {self.min_n}..{self.max_n}")
        if self.k < 1:
            raise ThorError(f"ngram: k must be >= 1, got {self.k}")


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, cfg: NgramConfig = NgramConfig()):
        self.cfg = cfg

    def propose(self, seq, k):
        k = min(k, self.cfg.k)
        n_tokens = len(seq)
        for n in range(min(self.cfg.max_n, n_tokens - 1), self.cfg.min_n - 1, -1):
            tail = seq[n_tokens - n :]
            # Most recent earlier occurrence wins: it reflects the current local pattern.
            for s in range(n_tokens - n - 1, -1, -1):
                if seq[s : s + n] == tail:
                    cont = seq[s + n : s + n + k]
                    if cont:
                        return cont, None
        return [], None
