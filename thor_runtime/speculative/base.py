"""The proposer contract. One proposer per file; the cycle in ``generate.py`` drives it."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Proposer(ABC):
    """Drafts K tokens to follow the anchor (the last committed token, not yet in the KV cache).

    Lifecycle for one sequence: ``start`` after prefill, then per cycle ``propose`` and
    ``commit``. A proposer that needs target hidden states names the layers in
    ``tap_layers``; the runtime then captures them at prefill (the last ``window``
    prompt rows) and at every verify.
    """

    name = "base"
    tap_layers: tuple[int, ...] = ()
    window: int = 0

    def start(self, prompt_ids: list[int], prompt_taps: dict[int, torch.Tensor] | None) -> None:
        pass

    @abstractmethod
    def propose(self, seq: list[int], k: int) -> tuple[list[int], torch.Tensor | None]:
        """seq: every committed token, the anchor last. -> (drafts [<= k], draft probs [n, V] or
        None)."""

    def fork(self) -> "Proposer":
        """A proposer for another sequence at the same time: these settings and weights, state
        of its own. This one keeps none (its drafts read only ``seq``), so it serves both."""
        return self

    def commit(self, n_rows: int, taps: dict[int, torch.Tensor] | None) -> None:
        """The first ``n_rows`` verified rows (anchor + accepted drafts) are now in the KV cache;
        ``taps`` are the verify's tap hidden states, [K+1, D] per layer, in row order."""
        pass
