"""One shape for every decode forward: exact speculation where kernels are not row-invariant.

On a GPU a 1-row and a 16-row matmul run different kernels, so a verify row and a plain step
would differ in their last bits, and greedy speculation could commit another token than plain
decoding. Here every decode forward — the plain step included — runs exactly ``rows`` rows
(the tokens, then padding) over the first ``S`` keys of one static KV store, ``S`` fixed per
request. A token then meets the same kernels on the same inputs whatever else shares its call:
speculative output equals plain output by construction, with no row-by-row fallback.

Fixed shapes are also what CUDA graphs need. On CUDA each (S, taps) forward is captured once
over static buffers (ids, start position, logits, taps) and replayed; a cycle costs one launch
and one host synchronisation (the accepted count, read by the acceptor). On a GPU ``rows``
rows cost about what one does — decode there is bound by reading the weights, not by math.

Padding rows write K/V past the committed length. That is safe: a position is only read
unmasked by a row at or after it, and any call that covers it writes it first.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import ThorError
from .kv_cache import KVCache, KVScales
from .model import ForwardOut, RopeRows, attend

STEP_ROWS = 16            # rows per decode forward on CUDA: a plain step and verifies of K <= 15
KEY_BUCKET = 256          # S is the request's reach rounded up to a power of two from here


def key_span(reach: int, capacity: int) -> int:
    """The keys every decode forward of one request attends over (masked past each row's
    position): the smallest power-of-two multiple of KEY_BUCKET covering ``reach``, at most
    ``capacity``. Few distinct spans means few captured graphs."""
    s = KEY_BUCKET
    while s < reach:
        s *= 2
    return min(s, capacity)


class FixedShapeDecoder:
    """Decode steps and verifies of one dense TargetModel at a fixed row count, over a KV store
    it owns (one sequence at a time). ``graphs``: capture CUDA graphs (default: on CUDA)."""

    def __init__(self, model, rows: int = STEP_ROWS, max_context: int | None = None, kv_dtype: str = "fp32",
                 kv_scales: KVScales | None = None, graphs: bool | None = None, compile: bool = False):
        if rows < 1:
            raise ThorError(f"fixed-shape decode needs rows >= 1, got {rows}")
        cfg, dev = model.cfg, model.device
        self.model, self.rows = model, rows
        self.capacity = min(max_context or 4096, cfg.max_position_embeddings)
        # Padding rows of the last verify may reach ``rows - 1`` slots past the capacity.
        self.cache = KVCache(cfg, self.capacity + rows, kv_dtype, model.dtype, kv_scales, dev)
        model.ensure_positions(self.capacity + rows)        # RoPE tables: allocated before capture
        self.graphs = dev.type == "cuda" if graphs is None else bool(graphs)
        if self.graphs and dev.type != "cuda":
            raise ThorError("CUDA graphs need the model on a CUDA device")
        self.ids = torch.zeros(rows, dtype=torch.long, device=dev)                    # [R]
        self.start = torch.zeros((), dtype=torch.long, device=dev)                   # first row's position
        self.offsets = torch.arange(rows, device=dev)                                # [R]
        self.key_index = torch.arange(self.cache.max_len, device=dev)                # [S_max]
        self._staged = torch.zeros(rows, dtype=torch.long)                           # host side of ids
        self.span = key_span(rows, self.capacity)
        self.sdpa = dev.type == "cuda"      # attention through SDPA's fused kernel (else matmuls)
        self._captured: dict[tuple, tuple] = {}
        self._pool = None
        # compile: the forward through torch.compile (elementwise work fused into few kernels:
        # at batch 1 a GPU decode step is bound by its kernel count); one compile per shape.
        self._fn = torch.compile(self._forward, dynamic=False) if compile else self._forward

    @property
    def captured(self) -> int:
        return len(self._captured)

    def new_cache(self, reach: int) -> KVCache:
        """The store, emptied, for a request that may reach ``reach`` positions (prompt + new
        tokens); it fixes the key span of every decode forward of the request."""
        if reach > self.capacity:
            raise ThorError(f"a request of {reach} positions exceeds the decoder's context of {self.capacity} "
                            "tokens (raise max_context)")
        self.span = key_span(reach + self.rows, self.capacity)
        self.cache.crop(0)
        return self.cache

    @torch.inference_mode()
    def verify(self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = ()) -> ForwardOut:
        """ids [T] -> logits [T, V]: consecutive calls of ``rows`` rows (T = 1 is a plain step)."""
        if cache is not self.cache:
            raise ThorError("fixed-shape decode runs on its own KV store (use new_cache)")
        parts = [self._call(ids[s:s + self.rows], taps) for s in range(0, ids.shape[0], self.rows)]
        if len(parts) == 1:
            return parts[0]
        return ForwardOut(torch.cat([p.logits for p in parts]),
                          {i: torch.cat([p.taps[i] for p in parts]) for i in taps})

    def _call(self, ids: torch.Tensor, taps: tuple[int, ...]) -> ForwardOut:
        T, start = ids.shape[0], self.cache.length
        if start + T > self.capacity:
            raise ThorError(f"sequence of {start + T} tokens exceeds the decoder's context of {self.capacity}")
        self._staged[:T] = ids
        # rows past T keep earlier ids: padding. A blocking copy: the host buffer is reused next
        # call, and the cycle has synchronised on the acceptor already.
        self.ids.copy_(self._staged)
        self.start.fill_(start)
        logits, tap_out = self._run(self.span, tuple(sorted(taps)))
        self.cache.lengths = [start + T] * len(self.cache.lengths)
        # Views of static buffers: the caller reads them before the next call overwrites them.
        return ForwardOut(logits[:T], {i: t[:T] for i, t in tap_out.items()})

    def _run(self, span: int, taps: tuple[int, ...]):
        # A graph backend (TensorRT, ONNX Runtime) launches its own engines: left uncaptured.
        if not self.graphs or self.model.backend is not None:
            return self._fn(span, taps)
        entry = self._captured.get((span, taps))
        if entry is None:
            entry = self._captured[(span, taps)] = self._capture(span, taps)
        graph, out = entry
        graph.replay()
        return out

    def _capture(self, span: int, taps: tuple[int, ...]):
        """Warm up on a side stream (cuBLAS picks and allocates its workspaces there), then
        record. The warm-up runs on the live inputs, so what it writes to the store is what the
        replay writes."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._fn(span, taps)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._fn(span, taps)
        self._pool = graph.pool()
        return graph, out

    def _forward(self, span: int, taps: tuple[int, ...]):
        """The whole decode forward on the static buffers. -> (logits [R, V] fp32, {layer: [R, D]})."""
        m, c, n_layers = self.model, self.cache, self.model.cfg.num_layers
        seg = m if m.backend is None else m.backend
        R, Hkv, Dh = self.rows, m.cfg.num_kv_heads, m.cfg.head_dim
        g = m.cfg.num_heads // Hkv
        pos = self.offsets + self.start                                              # [R]
        visible = self.key_index[:span][None, :] <= pos[:, None]                     # [R, S]
        if self.sdpa:
            # SDPA's fused kernel with the g query heads of a KV head folded into its rows
            # (row j * R + r is head j of the group, token r): plain multi-head attention
            # with a mask, one kernel where the matmul form takes eight.
            visible = visible.repeat(g, 1)[None, None]                               # [1, 1, gR, S]
        rope = RopeRows(*m.rope_at(pos)) if m.backend is None else pos
        h = seg.embed(self.ids)                                                      # [R, D]
        out_taps = {}
        for i in range(n_layers):
            q, k, v = seg.pre_attn(i, h, rope)                  # q [H, R, Dh], k/v [Hkv, R, Dh]
            c.write(i, k, v, pos)
            K, V = c.read(i, span)                                                   # [Hkv, S, Dh]
            if self.sdpa:
                # 4-D: SDPA's fused kernels take nothing else (3-D falls back to the math form)
                o = F.scaled_dot_product_attention(q.reshape(1, Hkv, g * R, Dh), K[None], V[None],
                                                   attn_mask=visible)
                # reshape, not view: a fused kernel may hand back another memory layout
                o = o.reshape(m.cfg.num_heads, R, Dh)                                # [H, R, Dh]
            else:
                o = attend(q, K, V, visible)                                         # [H, R, Dh]
            h = seg.post_attn(i, h, o.transpose(0, 1).reshape(R, -1))                # [R, D]
            if i in taps:
                out_taps[i] = h
        return seg.head(h), out_taps                                                 # [R, V] fp32


class PaddedVerify:
    """The same one-shape rule for targets that own their cache (hybrid Gated-DeltaNet models,
    eager): every verify is padded to ``rows`` rows with copies of its last token. To the cache
    the padding rows are drafts that were rejected — the cycle's crop selects the checkpoint
    slot of the last real row — and every real row took the kernels of a ``rows``-row call."""

    def __init__(self, model, rows: int = STEP_ROWS):
        self.model, self.rows = model, rows

    def verify(self, ids: torch.Tensor, cache, taps: tuple[int, ...] = ()) -> ForwardOut:
        T = ids.shape[0]
        if T > self.rows:
            raise ThorError(f"a verify of {T} rows on a model with its own cache needs step rows >= {T} "
                            f"(now {self.rows}): its rollback serves one forward")
        padded = torch.cat([ids, ids[-1:].expand(self.rows - T)])                  # [R]
        out = self.model.verify(padded, cache, taps)
        return ForwardOut(out.logits[:T], {i: t[:T] for i, t in out.taps.items()})
