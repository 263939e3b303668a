"""Recurrent state of the GDN layers with checkpoint slots, and the hybrid target's cache.

``HybridCache`` has the verbs the generation loop already uses on a ``KVCache`` (``length``,
``nbytes``, ``crop``), so speculative decoding on a hybrid is the same loop:

* a forward of T rows in the recurrent form writes the SSM state after row j into slot j,
  and keeps the conv inputs of all T rows (the conv state after row j is a window of them);
* ``crop(n)`` after a partial accept makes slot n - start - 1 current: an index, no copy and
  no forward, whatever K is. The next forward reads that slot (row 0 reads it before any
  slot is written, row j reads slot j - 1), so nothing is ever copied back.

``naive=True`` is the reference path kept for the benchmark and as a test oracle: one slot,
a snapshot of the state before every multi-row forward, and ``crop`` restores the snapshot
and runs the accepted rows through the model again.
"""

from __future__ import annotations

from typing import Callable

import torch

from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.errors import ThorError

# Rows up to which a forward uses the recurrent form with one checkpoint slot per row
# (decode, verify of K + 1 <= this rows); longer forwards (prefill) use the chunked form.
MAX_SLOTS = 64


class RecurrentState:
    """Conv + SSM state of every GDN layer. ``ssm[l]`` [slots, Hv, dk, dv] fp32, ``conv[l]``
    [k - 1 + rows, C] fp32: the conv state before the last forward followed by its rows."""

    def __init__(
        self,
        n_layers: int,
        num_v_heads: int,
        dk: int,
        dv: int,
        conv_dim: int,
        kernel: int,
        device: str | torch.device = "cpu",
        naive: bool = False,
    ):
        self.shape = (num_v_heads, dk, dv)
        self.kernel, self.conv_dim, self.device, self.naive = (
            kernel,
            conv_dim,
            torch.device(device),
            naive,
        )
        self.ssm = [torch.zeros(1, *self.shape, device=self.device) for _ in range(n_layers)]
        self.conv = [torch.zeros(kernel, conv_dim, device=self.device) for _ in range(n_layers)]
        self.cur = 0  # the slot holding the current state
        self.conv_cur = 0  # the current conv state is conv[l][conv_cur + 1 : conv_cur + kernel]

    @property
    def slots(self) -> int:
        return self.ssm[0].shape[0]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.ssm, *self.conv))

    def slot_nbytes(self, slots: int) -> int:
        """Memory of ``slots`` checkpoint slots over all layers (SSM slots + conv rows)."""
        per = self.shape[0] * self.shape[1] * self.shape[2] + self.conv_dim
        return 4 * per * slots * len(self.ssm)

    def reserve(self, rows: int) -> None:
        """Have one slot per row of a ``rows``-row recurrent forward (one in naive mode)."""
        want = 1 if self.naive else rows
        if want > self.slots:
            for i, s in enumerate(self.ssm):
                grown = torch.zeros(want, *self.shape, device=self.device)
                grown[self.cur] = s[self.cur]
                self.ssm[i] = grown

    # ---- per layer, used by the model's GDN segment
    def conv_state(self, layer: int) -> torch.Tensor:
        return self.conv[layer][self.conv_cur + 1 : self.conv_cur + self.kernel]  # [k-1, C]

    def current(self, layer: int) -> torch.Tensor:
        return self.ssm[layer][self.cur]  # [Hv, dk, dv]

    def slot(self, layer: int, row: int) -> torch.Tensor:
        return self.ssm[layer][0 if self.naive else row]

    # ---- after all layers of a forward
    def advanced(self, rows: int, checkpointed: bool) -> None:
        """A forward of ``rows`` rows has written its states: the last row's is current."""
        self.cur = rows - 1 if checkpointed and not self.naive else 0
        self.conv_cur = rows - 1 if checkpointed else 0

    def select(self, row: int) -> None:
        """Make the state after ``row`` of the last forward current (constant time)."""
        self.cur, self.conv_cur = row, row

    def snapshot(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return (
            [s[self.cur].clone() for s in self.ssm],
            [c[self.conv_cur : self.conv_cur + self.kernel].clone() for c in self.conv],
        )

    def restore(self, snap) -> None:
        ssm, conv = snap
        for i, s in enumerate(ssm):
            self.ssm[i][0] = s
            self.conv[i] = conv[i].clone()
        self.cur = self.conv_cur = 0


class HybridCache:
    """KV cache of the full-attention layers + recurrent state of the GDN layers."""

    def __init__(self, kv: KVCache, rec: RecurrentState):
        self.kv, self.rec = kv, rec
        self.length = 0
        self.start = 0  # position of the first row of the last forward
        self.rows = 0  # rows of the last forward
        self.checkpointed = False  # the last forward left one state per row
        self.max_len = kv.max_len
        self._snap = None
        self._ids: torch.Tensor | None = None
        self._replaying = False
        self.reforward: Callable[[torch.Tensor], None] | None = (
            None  # set by the model (naive path)
        )

    @property
    def naive(self) -> bool:
        return self.rec.naive

    def nbytes(self) -> int:
        return self.kv.nbytes() + self.rec.nbytes()

    def begin(self, ids: torch.Tensor, recurrent: bool) -> None:
        """Called by the model before a forward of ``ids`` [T]."""
        T = ids.shape[0]
        if self.naive and T > 1 and self.length > 0 and not self._replaying:
            self._snap, self._ids = self.rec.snapshot(), ids.clone()
        if recurrent:
            self.rec.reserve(T)
        self.start, self.rows, self.checkpointed = self.length, T, recurrent

    def end(self) -> None:
        self.rec.advanced(self.rows, self.checkpointed)
        self.length = self.start + self.rows

    def crop(self, n: int) -> None:
        """Keep the first n positions. Within the last forward's rows this selects a slot."""
        if n < 0:
            raise ValueError("crop length must be >= 0")
        if n >= self.length:
            return
        j = n - self.start - 1  # keep rows 0..j of the last forward
        if self.naive and self._snap is not None and j >= -1:
            self.rec.restore(self._snap)
            self.kv.crop(self.start)
            self.length, ids, self._snap = self.start, self._ids, None
            if j >= 0:
                self._replaying = True
                try:
                    self.reforward(ids[: j + 1])  # the second forward the slots avoid
                finally:
                    self._replaying = False
            return
        if not self.checkpointed or not 0 <= j < self.rows:
            raise ThorError(
                f"cannot roll the recurrent state back to {n} tokens: only the rows of the "
                f"last verify ({self.start + 1}..{self.start + self.rows}) are checkpointed"
            )
        self.rec.select(j)
        self.kv.crop(n)
        self.length = n
