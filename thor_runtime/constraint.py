"""The grammar-constraint contract the generation cycle relies on.

An implementation (``agent/grammar.py`` wraps llguidance) tracks the grammar state
after every *committed* token. Within one cycle the runtime calls, in order:

1. ``forced()``      tokens the grammar allows as the only continuation; they ride at
                     the front of the draft and are certain to be accepted.
2. ``valid_prefix``  how many of the drafts the grammar accepts from the current state
                     (drafts are cut there). Must leave the state unchanged.
3. ``mask_rows``     logits [K+1, V] with illegal tokens set to -inf, row j masked by the
                     state after drafts[:j]; so the recovered / bonus token is legal.
                     Must leave the state unchanged.
4. ``advance(t)``    once per committed token.

With relaxed acceptance on free-text spans (``RelaxedConfig.spans``), the runtime also asks
``relaxed_spans(drafts)`` before accepting: which drafts lie wholly inside text that nothing
downstream reads, where a close runner-up of the target may be kept.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch


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

    def advance(self, token: int) -> None:
        return self._timed(self.inner.advance, token)

    def is_accepting(self) -> bool:
        return self._timed(self.inner.is_accepting)
