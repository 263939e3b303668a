"""What the runtime asks of a target model, dense (model.py) or hybrid (hybrid/model.py).

Every caller — the generation loop, the proposers' taps, calibration, the self-test — holds a
target through this interface and nothing else: no test of which class it is. What runs a
dense target's forwards faster is not part of it (runner.py).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Target(Protocol):
    cfg: Any  # ModelConfig or HybridConfig: num_layers (the tap layers 0..n-1), context
    device: torch.device
    dtype: torch.dtype  # activations
    # Its cache holds recurrent state: no prefix reuse (the state cannot be cut back to a
    # shorter start), and a rollback serves one forward (verifies padded, not fixed-shape).
    is_hybrid: bool
    backend: Any  # an attached engine for the dense segments, or None

    def new_cache(self, capacity: int, kv_dtype: str = "fp32", kv_scales=None, **options) -> Any:
        """An empty cache for ``capacity`` positions (a KVCache; hybrids add recurrent state)."""

    def prefill(
        self,
        ids: torch.Tensor,
        cache,
        chunk: int = 0,
        taps: tuple[int, ...] = (),
        tap_rows: int = 0,
    ):
        """ids [T] -> ForwardOut: last-row logits [1, V], taps {layer: [tap_rows, D]}."""

    def verify(self, ids: torch.Tensor, cache, taps: tuple[int, ...] = (), cols=None):
        """ids [T] (anchor + drafts) -> ForwardOut: logits [T, V], taps {layer: [T, D]}; each row
        the bits a 1-row step at its position gives. cols: the token ids whose logits the caller
        reads (None: all); the others may be left at -inf."""

    def forward(
        self,
        ids: torch.Tensor,
        cache,
        taps: tuple[int, ...] = (),
        logits_rows: str | slice = "all",
        exact: bool = False,
    ):
        """ids [T] continue the sequence in ``cache`` -> ForwardOut."""
