"""The grammar-constraint contract the generation cycle relies on.

An implementation (``agent/grammar.py`` wraps llguidance) tracks the grammar state
after every *committed* token. Within one cycle the runtime calls, in order:

1. ``forced()``      tokens the grammar allows as the only continuation; they ride at
                     the front of the draft and are certain to be accepted.
2. ``valid_prefix``  how many of the drafts the grammar accepts from the current state
                     (drafts are cut there). Must leave the state unchanged.
3. ``allowed_rows``  before the verify: the legal ids of each row [K+1, V], row j by the
                     state after drafts[:j]. When few ids are legal on any row, the verify
                     computes only their logits (``read_ids``); the rows are then masked by
                     them (``masked``), so the recovered / bonus token is legal. A constraint
                     that cannot say them before the logits masks them after instead
                     (``mask_rows``). Both must leave the state unchanged.
4. ``advance(t)``    once per committed token.

With relaxed acceptance on free-text spans (``RelaxedConfig.spans``), the runtime also asks
``relaxed_spans(drafts)`` before accepting: which drafts lie wholly inside text that nothing
downstream reads, where a close runner-up of the target may be kept.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np
import torch

# The verify computes only the logits of the ids some row may commit when they are at most
# this share of the vocabulary: a plan's keys, names and numbers allow a few ids per row, and
# the head (the vocabulary times the hidden size) is a quarter of a small model's weights.
READ_SHARE = 1 / 16


def read_ids(allowed: np.ndarray | None) -> np.ndarray | None:
    """allowed [R, V] bool -> the ids any row may commit [n], ascending, when they are few
    (READ_SHARE); None: every logit is read."""
    if allowed is None:
        return None
    ids = np.flatnonzero(allowed.any(axis=0))
    return ids if len(ids) <= READ_SHARE * allowed.shape[1] else None


def masked(logits: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
    """logits [R, V] with -inf where ``allowed`` [R, V] is False."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # one single-threaded numpy pass; torch's threaded masked_fill stalls on a busy CPU
        return torch.from_numpy(np.where(allowed, logits.detach().numpy(), np.float32(-np.inf)))
    return logits.masked_fill(torch.from_numpy(~allowed).to(logits.device), float("-inf"))


def masked_argmax(logits: torch.Tensor, allowed: np.ndarray, ids: np.ndarray) -> torch.Tensor:
    """masked(logits, allowed).argmax(-1) [R] when every id a row allows is in ``ids``
    (ascending, read_ids'): only those columns are read, and the first of equal maxima is the
    same column either way."""
    cols = torch.from_numpy(ids)
    part = logits.index_select(1, cols.to(logits.device)).cpu().numpy()                       # [R, n]
    best = np.where(allowed[:, ids], part, np.float32(-np.inf)).argmax(1)                    # [R]
    return cols[torch.from_numpy(best)]


class Constraint(ABC):
    def forced(self) -> list[int]:
        """Tokens the grammar allows as the only continuation (none by default)."""
        return []

    def relaxed_spans(self, drafts: list[int]) -> list[bool]:
        """Per draft j: True when, after the committed text and drafts[:j], draft j lies wholly
        inside a span whose wording no consumer of the output reads (it neither opens nor closes
        the span). Must leave the state unchanged. Default: no such span, every draft strict."""
        return [False] * len(drafts)

    @abstractmethod
    def valid_prefix(self, drafts: list[int]) -> int:
        """How many leading drafts the grammar accepts from the committed state."""

    @abstractmethod
    def mask_rows(self, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        """logits [K+1, V] with illegal ids at -inf; row j by the state after drafts[:j]."""

    def allowed_rows(self, drafts: list[int], rows: int, width: int) -> np.ndarray | None:
        """[rows, width] bool, the ids legal on each row (row j by the state after drafts[:j]),
        before the logits; None: not known before them (``mask_rows`` masks then)."""
        return None

    @abstractmethod
    def advance(self, token: int) -> None:
        """Consume one committed token."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """True when the grammar is complete (EOS is legal)."""


class TimedConstraint(Constraint):
    """A generation's constraint whose every call adds its time to ``stats.grammar_s`` (where
    a plan's time goes: the grammar's share)."""

    def __init__(self, inner: Constraint, stats):
        self.inner, self.stats = inner, stats

    def _timed(self, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.stats.grammar_s += time.perf_counter() - t

    def forced(self) -> list[int]:
        return self._timed(self.inner.forced)

    def relaxed_spans(self, drafts: list[int]) -> list[bool]:
        return self._timed(self.inner.relaxed_spans, drafts)

    def valid_prefix(self, drafts: list[int]) -> int:
        return self._timed(self.inner.valid_prefix, drafts)

    def mask_rows(self, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        return self._timed(self.inner.mask_rows, logits, drafts)

    def allowed_rows(self, drafts: list[int], rows: int, width: int) -> np.ndarray | None:
        return self._timed(self.inner.allowed_rows, drafts, rows, width)

    def advance(self, token: int) -> None:
        return self._timed(self.inner.advance, token)

    def is_accepting(self) -> bool:
        return self._timed(self.inner.is_accepting)
