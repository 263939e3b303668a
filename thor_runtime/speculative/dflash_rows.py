"""A DFlash drafter's block and window updates as one row-kernel call each (csrc/rowstep_dflash.h).

Why. With its projections on the row kernel (row_linear.py) a propose still ran ~20 projection
calls and ~150 small torch operations around 16 rows: ~2.8 ms a cycle on the planner model's
drafter, a tenth of a plan's decode under ``--spec auto``. The same math in two C calls (the
window's new entries, then the block) drops the dispatch. The projections are the RowLinear
8-bit blocks (q, k, v and gate, up side by side: each output's operations are its own, so a
fused projection gives each output the bits of its own), the attention the target's own task.
Drafts move by float rounding at most, never the committed tokens, which the target decides.

``THOR_DRAFTER_BLOCK=0`` keeps the torch forward around the row kernel's projections (to compare).
"""

from __future__ import annotations

import os

import torch

from thor_runtime.kernels.row_linear import RowLinear
from thor_runtime.kernels.rowstep import MAX_ROWS

ENV = "THOR_DRAFTER_BLOCK"


def fused_weights(drafter) -> list[dict]:
    """Per layer, the float weights of the fused projections, read before row_linear.on_rows
    replaces the layers' nn.Linear modules: q k v, k v (window entries), gate up."""
    out = []
    for lay in drafter.layers:
        a, m = lay.self_attn, lay.mlp
        out.append(
            {
                "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                .detach()
                .float(),
                "kv": torch.cat([a.k_proj.weight, a.v_proj.weight]).detach().float(),
                "gu": torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach().float(),
            }
        )
    return out


class RowDrafter:
    """The C side of one drafter on ``rows`` (rowstep.RowStep). Built by the DFlash proposer
    from the fused weights, after on_rows made its projections RowLinear (fc, o and down are
    shared)."""

    def __init__(self, rows, drafter, fused: list[dict]):
        c = drafter.cfg
        self.rows, self.cfg, self._lib = rows, c, rows._lib
        self._keep: list = []  # every tensor and RowLinear the C side points into
        self._h = self._lib.rowstep_dflash_new(
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.rms_eps,
            drafter.fc._h,
            self._ptr(drafter.hidden_norm.weight),
            self._ptr(drafter.norm.weight),
        )
        if not self._h:
            raise MemoryError("rowstep: no memory for a drafter's layer table")
        self._keep.append(drafter.fc)
        for i, (lay, f) in enumerate(zip(drafter.layers, fused)):
            a, m = lay.self_attn, lay.mlp
            lin = [
                RowLinear(rows, f["qkv"]),
                RowLinear(rows, f["kv"]),
                a.o_proj,
                RowLinear(rows, f["gu"]),
                m.down_proj,
            ]
            self._keep += lin
            self._lib.rowstep_dflash_set_layer(
                self._h,
                i,
                self._ptr(lay.input_layernorm.weight),
                self._ptr(lay.post_attention_layernorm.weight),
                self._ptr(a.q_norm.weight),
                self._ptr(a.k_norm.weight),
                *[x._h for x in lin],
            )
        self.fits = bool(self._lib.rowstep_dflash_fits(rows._h, self._h))
        self._rope = drafter.rope
        self._cos = self._sin = torch.zeros(0, c.head_dim)  # [P, Dh]

    def _ptr(self, t: torch.Tensor) -> int:
        t = t.detach().float().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _table(self, upto: int) -> None:
        """cos/sin rows for positions 0..upto-1 at least (grown by doubling)."""
        if upto > self._cos.shape[0]:
            n = max(upto, 2 * self._cos.shape[0], 256)
            cos, sin = self._rope(torch.arange(n))  # [n, Dh]
            self._cos, self._sin = cos.float().contiguous(), sin.float().contiguous()

    def append(
        self,
        raw: torch.Tensor,
        pos: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
        feats: torch.Tensor,
    ) -> None:
        """raw [n, n_taps*D] taps of the tokens at ``pos`` [n] -> their features into ``feats``
        [W, D] rows ``slots`` [n] and every layer's K/V into those slots of
        ``kv`` [L, 2, Hkv, S, Dh]."""
        raw = raw.detach().float().contiguous()
        pos32, slots32 = pos.to(torch.int32).contiguous(), slots.to(torch.int32).contiguous()
        with self.rows._one:  # the table too: a fork's call may be reading it
            self._table(int(pos.max()) + 1)
            for s in range(0, raw.shape[0], MAX_ROWS):
                e = min(raw.shape[0], s + MAX_ROWS)
                if self._lib.rowstep_dflash_append(
                    self.rows._h,
                    self._h,
                    raw[s].data_ptr(),
                    e - s,
                    pos32[s].data_ptr(),
                    slots32[s].data_ptr(),
                    kv.data_ptr(),
                    kv.shape[3],
                    feats.data_ptr(),
                    self._cos.data_ptr(),
                    self._sin.data_ptr(),
                ):
                    raise RuntimeError(
                        f"rowstep: {e - s} drafter window rows do not fit the kernel"
                    )

    def block(self, h: torch.Tensor, first_pos: int, kv: torch.Tensor, n: int) -> torch.Tensor:
        """h [B, D] (the block's embedded rows) at positions first_pos.. over the window's ``n``
        entries -> [B, D] after the final norm (the block's own K/V go to slots n..n+B-1)."""
        h = h.detach().float().contiguous().clone()
        with self.rows._one:
            self._table(first_pos + h.shape[0])
            if self._lib.rowstep_dflash_block(
                self.rows._h,
                self._h,
                h.data_ptr(),
                h.shape[0],
                first_pos,
                kv.data_ptr(),
                kv.shape[3],
                n,
                self._cos.data_ptr(),
                self._sin.data_ptr(),
            ):
                raise RuntimeError(
                    f"rowstep: a {h.shape[0]}-row drafter block over {n} entries does not fit"
                )
        return h

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.rowstep_dflash_free(self._h)
            self._h = None


def row_drafter(rows, drafter, fused: list[dict]) -> RowDrafter | None:
    """The drafter's C forwards on ``rows``, or None where they do not fit the engine (another head
    layout than the target's) or ``THOR_DRAFTER_BLOCK=0``."""
    if os.environ.get(ENV, "1") == "0":
        return None
    fast = RowDrafter(rows, drafter, fused)
    return fast if fast.fits else None
