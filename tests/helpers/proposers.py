"""Proposers written for the tests."""

from __future__ import annotations

import random


class Steered:
    """Proposes the true continuation with one random position corrupted, so cycles accept every
    n in 0..K (a random proposer almost never hits)."""

    name, tap_layers, window = "steered", (), 0

    def __init__(self, truth, seed):
        self.truth, self.rng = truth, random.Random(seed)

    def start(self, ids, taps):
        pass

    def commit(self, n, taps):
        pass

    def propose(self, seq, k):
        true = list(self.truth[len(seq) : len(seq) + k])
        j = self.rng.randrange(len(true) + 1)
        if j < len(true):
            true[j] = (true[j] + 1) % 300
        return true, None
