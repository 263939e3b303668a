"""The DFlash drafter's block forward as one CUDA graph.

Eager, a propose is dozens of small kernels over a context whose length changes every cycle.
Here the block attends over the whole ring buffer of the window (W slots, the empty ones
masked) so every propose has one shape: the anchor id, its position and the window's fill are
written into static buffers and the recorded graph is replayed. The head stays outside: a
draft vocabulary gives each request its own [V', D] rows.

Drafts need not match the eager forward bit for bit — a draft is only a guess, and the
target's verify decides what is committed — but they come from the same model.
"""

from __future__ import annotations

import torch


class GraphedBlock:
    """Block forward of ``drafter`` over ``ring`` [L, 2, Hkv, W, Dh] (the proposer's window K/V),
    captured at first use. ``graphs=False`` runs the same fixed-shape forward eagerly."""

    def __init__(self, drafter, ring: torch.Tensor, block_size: int, graphs: bool = True):
        dev = ring.device
        self.drafter, self.ring, self.block = drafter, ring, block_size
        self.anchor_id = torch.zeros(1, dtype=torch.long, device=dev)
        self.anchor_pos = torch.zeros((), dtype=torch.long, device=dev)
        self.filled = torch.zeros((), dtype=torch.long, device=dev)  # window entries in use
        self.slots = torch.arange(ring.shape[3], device=dev)  # [W]
        self.rows = torch.arange(block_size, device=dev)  # [Bk]
        self.own = torch.ones(
            block_size, block_size, dtype=torch.bool, device=dev
        )  # block sees itself
        drafter.rope(self.rows)  # inverse freqs on the device
        self.graphs = graphs
        self._graph, self._out = None, None

    @torch.inference_mode()
    def run(self, anchor_id: int, anchor_pos: int, filled: int) -> torch.Tensor:
        """-> normed hidden states [Bk - 1, D] of block rows 1.. (a static buffer under graphs)."""
        self.anchor_id.fill_(anchor_id)
        self.anchor_pos.fill_(anchor_pos)
        self.filled.fill_(filled)
        if not self.graphs:
            return self._forward()
        if self._graph is None:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward()  # warm-up
            torch.cuda.current_stream().wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._out = self._forward()
        self._graph.replay()
        return self._out

    def _forward(self) -> torch.Tensor:
        d, Bk = self.drafter, self.block
        anchor = torch.nn.functional.embedding(self.anchor_id, d.embed_w).to(d.dtype)  # [1, D]
        h = torch.cat([anchor, d.mask_embedding().expand(Bk - 1, -1)])[None]  # [1, Bk, D]
        cos, sin = d.rope((self.anchor_pos + self.rows)[None])  # [1, Bk, Dh]
        ctx = (self.slots < self.filled).expand(Bk, -1)  # [Bk, W]
        mask = torch.cat([ctx, self.own], dim=1)[None, None]  # [1, 1, Bk, W + Bk]
        for i, layer in enumerate(d.layers):
            h = layer(h, self.ring[i, 0][None], self.ring[i, 1][None], cos, sin, mask)
        return d.norm(h[0, 1:])  # [Bk - 1, D]
