"""A drafter's shortlist of token ids: its head scores only these (plus the prompt's own).

The DFlash drafter shares the target's lm_head, [V, D] — for a 49k vocabulary and a 15-row
block that product is most of a propose on CPU. A deployment's responses use few distinct
tokens (robot plans: ~1.2k over 61k response tokens), so scoring the most frequent ones,
plus every token of the current prompt (plans copy object and place names from the world),
loses almost no accepted drafts. Correctness never depends on it: the target verifies every
draft, so a token outside the shortlist is merely never proposed.

Stored next to the drafter as ``draft_vocab.json``:
  {"format": "thor-draft-vocab/1", "vocab_size": V, "ids": [...], "coverage": f, "source": {...}}
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from thor_runtime.errors import ThorError
from thor_runtime.fileio import read_json, write_json_atomic

FORMAT = "thor-draft-vocab/1"
FILENAME = "draft_vocab.json"


@dataclass(frozen=True)
class DraftVocab:
    ids: tuple[int, ...]  # most frequent first
    vocab_size: int  # the target vocabulary the ids index
    coverage: float = 1.0  # share of the counted tokens the ids cover
    source: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))
        if not self.ids:
            raise ThorError("draft vocabulary is empty")
        if len(set(self.ids)) != len(self.ids):
            raise ThorError("draft vocabulary has repeated token ids")
        bad = [i for i in self.ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ThorError(
                f"draft vocabulary ids {bad[:4]} are outside the vocabulary of {self.vocab_size}"
            )

    @classmethod
    def from_counts(
        cls, counts: Counter, size: int, vocab_size: int, source: dict | None = None
    ) -> "DraftVocab":
        """The ``size`` most frequent ids of ``counts`` (fewer if fewer were seen)."""
        if size < 1:
            raise ThorError(f"draft vocabulary size must be >= 1, got {size}")
        if not counts:
            raise ThorError("draft vocabulary: no tokens to count")
        ids = [t for t, _ in counts.most_common(size)]
        cov = sum(counts[t] for t in ids) / sum(counts.values())
        return cls(tuple(ids), vocab_size, round(cov, 6), dict(source or {}))

    def with_tokens(self, extra: Iterable[int]) -> torch.Tensor:
        """-> long [n]: the shortlist plus ``extra`` (the prompt), sorted and unique."""
        ids = set(self.ids) | {int(t) for t in extra if 0 <= int(t) < self.vocab_size}
        return torch.tensor(sorted(ids), dtype=torch.long)

    def save(self, drafter_dir: str | Path) -> Path:
        p = Path(drafter_dir) / FILENAME
        write_json_atomic(
            p,
            {
                "format": FORMAT,
                "vocab_size": self.vocab_size,
                "coverage": self.coverage,
                "source": self.source,
                "ids": list(self.ids),
            },
        )
        return p


def load_draft_vocab(drafter_dir: str | Path, vocab_size: int | None = None) -> DraftVocab | None:
    """The shortlist stored with a drafter, or None when it has none (full-vocabulary head)."""
    p = Path(drafter_dir) / FILENAME
    if not p.exists():
        return None
    doc = read_json(p, "draft vocabulary")
    if doc.get("format") != FORMAT:
        raise ThorError(
            f"{p}: not a draft vocabulary (format {doc.get('format')!r}, expected {FORMAT})"
        )
    ids, size = doc.get("ids"), doc.get("vocab_size")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ThorError(f"{p}: 'ids' must be a list of token ids")
    if not isinstance(size, int):
        raise ThorError(f"{p}: 'vocab_size' must be an integer")
    if vocab_size is not None and size != vocab_size:
        raise ThorError(f"{p}: made for a vocabulary of {size} tokens, the target has {vocab_size}")
    try:
        return DraftVocab(
            tuple(ids), size, float(doc.get("coverage", 1.0)), dict(doc.get("source") or {})
        )
    except ThorError as e:
        raise ThorError(f"{p}: {e}") from None


def response_counts(seqs: list[dict]) -> Counter:
    """Token counts over the response part of calibration sequences (``read_shards`` rows)."""
    c: Counter = Counter()
    for s in seqs:
        c.update(s["ids"][s["prompt_len"] :])
    return c
