"""A drafter's projections on the row kernel's int8 blocks (csrc/rowstep.c ``rowstep_linear``).

Why. A DFlash block is 16 rows through small projections (896 -> 1024 and the like). torch's
matmul at that shape runs at ~40 G multiply-adds/s on one Zen 4 core in bf16, and a propose is
two thirds such matmuls; the row kernel's 8-bit blocks run them on the integer dot products, on
its own thread pool, compute-bound at 16 rows (docs/speculative-decoding.md, the drafter on the row
kernel). The weights become symmetric 8-bit blocks of 32 (absmax / 127) and each activation row
int8 per block, the target's own scheme: drafts move by that rounding, never the committed
tokens, which the target's verify decides.

A dense CPU target whose runner has the row kernel lends it (``row_kernel``); the drafter then
runs in fp32 around the projections. ``THOR_DRAFTER_ROWS=0`` keeps torch's matmuls (to compare).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from thor_runtime.kernels.lowbit_ort import NBitsWeight
from thor_runtime.kernels.rowstep import MAX_ROWS

ENV = "THOR_DRAFTER_ROWS"


def row_kernel(target):
    """The row kernel (rowstep.RowStep) of a CPU target whose runner has one, else None."""
    if os.environ.get(ENV, "1") == "0" or target is None or target.device.type != "cpu":
        return None
    return getattr(getattr(target, "runner", None), "rows", None)


class RowLinear(nn.Module):
    """y [..., N] = x [..., K] W^T (fp32) with W [N, K] as 8-bit blocks on ``rows``' pool and
    scratch (one call at a time with its forwards: its lock)."""

    def __init__(self, rows, weight: torch.Tensor | NBitsWeight):
        super().__init__()
        w = (
            weight
            if isinstance(weight, NBitsWeight)
            else NBitsWeight.from_dense_int8(weight.detach().float())
        )
        if w.bits != 8 or w.corr is not None:
            raise ValueError("RowLinear takes symmetric 8-bit blocks")
        self.out_features, self.in_features = w.shape
        self.rows, self.max_rows = rows, MAX_ROWS
        # w = s q + m with unsigned codes: m = -128 s (rowstep.c)
        blob, s, m = w.blob.contiguous(), w.scale.contiguous(), (-128.0 * w.scale).contiguous()
        self._h = rows._lib.rowstep_proj_new(
            blob.data_ptr(), s.data_ptr(), m.data_ptr(), self.out_features, self.in_features, 8
        )
        # a regrouping build copied them; one that reads them in place needs them kept
        self._arrays = None if rows.group else (blob, s, m)
        if not self._h:
            raise MemoryError("rowstep: no memory for a projection's copy of its weights")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead, K, N = x.shape[:-1], self.in_features, self.out_features
        # numpy, not torch: a torch copy wakes its thread pool beside the kernel's (rowstep.py)
        a = np.ascontiguousarray(x.detach().float().numpy().reshape(-1, K))  # [M, K]
        y = np.empty((a.shape[0], N), np.float32)  # [M, N]
        lib, rows = self.rows._lib, self.rows
        with rows._one:
            for s in range(0, a.shape[0], self.max_rows):
                e = min(a.shape[0], s + self.max_rows)
                if lib.rowstep_linear(
                    rows._h, self._h, a[s:e].ctypes.data, e - s, y[s:e].ctypes.data
                ):
                    raise RuntimeError(
                        f"rowstep: a [{e - s}, {K}] projection does not fit the kernel"
                    )
        return torch.from_numpy(y).view(*lead, N)

    def __del__(self):
        if getattr(self, "_h", None):
            self.rows._lib.rowstep_proj_free(self._h)
            self._h = None


def head_rows(rows, target, ids: torch.Tensor, table: torch.Tensor) -> RowLinear:
    """The head's rows ``ids`` on ``rows``: a gather of the target's own 8-bit head blocks where
    it has them (the bits the target scores with), else those rows of ``table`` [V, D] rounded."""
    w, at = getattr(target, "head_w", None), ids.cpu()
    if isinstance(w, NBitsWeight) and w.bits == 8 and w.corr is None:
        return RowLinear(
            rows, NBitsWeight(w.blob.index_select(0, at), w.scale.index_select(0, at), None, 8)
        )
    return RowLinear(rows, table.index_select(0, at))


def on_rows(drafter, rows) -> None:
    """The drafter's projections (fc and every layer's) on ``rows``, the rest in fp32. Once per
    drafter: one already moved stays as it is."""
    if isinstance(drafter.fc, RowLinear):
        return
    drafter.float()
    drafter.fc = RowLinear(rows, drafter.fc.weight)
    for layer in drafter.layers:
        for mod in (layer.self_attn, layer.mlp):
            for name, child in list(mod.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(mod, name, RowLinear(rows, child.weight))
