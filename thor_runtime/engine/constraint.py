"""The grammar-constraint contract the generation cycle relies on.

An implementation (``agent/schema/grammar.py`` wraps llguidance) tracks the grammar state
after every *committed* token. Within one cycle the runtime calls, in order:

1. ``forced()``      tokens the grammar allows as the only continuation; they ride at
                     the front of the draft and are certain to be accepted.
2. ``valid_prefix``  how many of the drafts the grammar accepts from the current state
                     (drafts are cut there). Must leave the state unchanged.
3. ``allowed_rows``  before the verify: the legal ids of each row [K+1, V], row j by the
                     state after drafts[:j]. The verify computes only the logits of the ids
                     legal on rows where few are (``read_ids``; a row inside a string, where
                     most are, reads every logit); the rows are then masked by
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
from dataclasses import dataclass

import numpy as np
import torch

# The verify computes only the logits of the ids a row may commit when they are at most this
# share of the vocabulary: a plan's keys, names and numbers allow a few ids per row, and the
# head (the vocabulary times the hidden size) is a quarter of a small model's weights.
READ_SHARE = 1 / 16


@dataclass(frozen=True)
class RowReads:
    """The logits a verify reads when some rows allow most of the vocabulary (inside a plan's
    strings) and the others few ids: the rows in ``wide`` read every logit, the others ``ids``.
    Without it one row inside a string made every row of the verify compute all ~150 k logits
    (a third of a plan's verifies on CPU; docs/performance.md)."""

    ids: np.ndarray  # [n] ascending: every id the narrow rows may commit
    wide: np.ndarray  # [R] bool

    def part(self, start: int, stop: int) -> "RowReads":
        return RowReads(self.ids, self.wide[start:stop])


def read_ids(allowed: np.ndarray | None) -> np.ndarray | RowReads | None:
    """allowed [R, V] bool -> what the verify reads: the ids any row may commit [n], ascending,
    when every row allows few (READ_SHARE); RowReads when only some rows do; None: every logit
    of every row."""
    if allowed is None:
        return None
    limit = READ_SHARE * allowed.shape[1]
    # a row at a time: count_nonzero with an axis takes ~10x as long over [16, 152 k]
    wide = np.array([np.count_nonzero(row) for row in allowed]) > limit  # [R]
    if wide.all():
        return None
    ids = np.flatnonzero(allowed[~wide].any(axis=0) if wide.any() else allowed.any(axis=0))
    if len(ids) > limit:
        return None
    return RowReads(ids, wide) if wide.any() else ids


def reads_part(cols, start: int, stop: int):
    """``cols`` (read_ids') for rows start..stop-1 of the verify."""
    return cols.part(start, stop) if isinstance(cols, RowReads) else cols


def split_reads(cols, rows: int) -> tuple[np.ndarray | None, np.ndarray]:
    """-> (the ids narrow rows read or None, wide [rows] bool: the rows that read every logit)."""
    if cols is None:
        return None, np.ones(rows, bool)
    if isinstance(cols, RowReads):
        return cols.ids, cols.wide
    return np.asarray(cols, np.int64), np.zeros(rows, bool)


def narrow_share(cols, rows: int) -> float:
    """The share of a verify's rows that computed only some logits (the cost curve's mix)."""
    return float(1.0 - split_reads(cols, rows)[1].mean()) if rows else 0.0


def masked(logits: torch.Tensor, allowed: np.ndarray) -> torch.Tensor:
    """logits [R, V] with -inf where ``allowed`` [R, V] is False."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        # one single-threaded numpy pass; torch's threaded masked_fill stalls on a busy CPU
        return torch.from_numpy(np.where(allowed, logits.detach().numpy(), np.float32(-np.inf)))
    return logits.masked_fill(torch.from_numpy(~allowed).to(logits.device), float("-inf"))


def masked_argmax(logits: torch.Tensor, allowed: np.ndarray, reads) -> torch.Tensor:
    """masked(logits, allowed).argmax(-1) [R] when every id a narrow row allows is in the ids
    ``reads`` (read_ids') names: only those columns are read there, and the first of equal
    maxima is the same column either way; a wide row is read whole (every row, reads None)."""
    ids, wide = split_reads(reads, logits.shape[0])
    narrow, rows = np.flatnonzero(~wide), np.flatnonzero(wide)
    if logits.device.type == "cpu":
        # numpy on the tensor's own memory: torch's gathers of this size wake its thread pool,
        # which then spins on the cores the next verify needs
        host = logits.detach().float().numpy()  # [R, V]
        part = host[np.ix_(narrow, ids)] if len(narrow) else None  # [r, n]
        whole = host if len(rows) == len(host) else host[rows]  # [w, V], no copy of all
    else:  # only the columns and rows read cross to the host
        part = (
            logits.index_select(1, torch.from_numpy(ids).to(logits.device))
            .float()
            .cpu()
            .numpy()[narrow]
            if len(narrow)
            else None
        )
        whole = (
            logits[torch.from_numpy(rows).to(logits.device)].float().cpu().numpy()
            if len(rows)
            else None
        )
    best = np.empty(logits.shape[0], np.int64)  # [R]
    if len(narrow):
        best[narrow] = ids[
            np.where(allowed[np.ix_(narrow, ids)], part, np.float32(-np.inf)).argmax(1)
        ]
    if len(rows):
        top = whole.argmax(1)  # [w]
        # an allowed first maximum is the first allowed maximum too: no masked copy of the row
        ok = allowed[rows, top]
        best[rows[ok]] = top[ok]
        if not ok.all():
            best[rows[~ok]] = np.where(allowed[rows[~ok]], whole[~ok], np.float32(-np.inf)).argmax(
                1
            )
    return torch.from_numpy(best)


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
