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

With ``slots`` > 1 the decoder serves that many sequences at once (in-flight batching,
inflight.py): each holds a slot of one SlotStore, and every forward runs ``slots`` x ``rows``
rows over every slot's keys, whichever slots have work. The shape then never depends on who
else is decoding: a sequence's rows meet the same kernels alone and beside three others, so
what it commits does not depend on its batch-mates, by the same construction. Its key span is
the whole context (a span that followed the longest member would move with the others).
A slot with no work this round writes its padding past the context, where nothing reads.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from thor_runtime.cache.kv_cache import KVCache, KVScales, SlotStore
from thor_runtime.errors import ThorError
from thor_runtime.models.dense import ForwardOut, RopeRows, attend

STEP_ROWS = 16  # rows per decode forward on CUDA: a plain step and verifies of K <= 15
KEY_BUCKET = 256  # S is the request's reach rounded up to a power of two from here


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
    it owns: ``slots`` sequences at a time (1: one request after another, its key span per
    request). ``graphs``: capture CUDA graphs (default: on CUDA)."""

    def __init__(
        self,
        model,
        rows: int = STEP_ROWS,
        max_context: int | None = None,
        kv_dtype: str = "fp32",
        kv_scales: KVScales | None = None,
        graphs: bool | None = None,
        compile: bool = False,
        slots: int = 1,
    ):
        if rows < 1 or slots < 1:
            raise ThorError(
                f"fixed-shape decode needs rows >= 1 and slots >= 1, got {rows} and {slots}"
            )
        cfg, dev = model.cfg, model.device
        self.model, self.rows, self.slots = model, rows, slots
        self.capacity = min(max_context or 4096, cfg.max_position_embeddings)
        # Padding rows of the last verify (and an idle slot's rows) may reach ``rows - 1`` slots
        # past the capacity.
        self.store = SlotStore(
            cfg, self.capacity + rows, slots, kv_dtype, model.dtype, kv_scales, dev
        )
        self.cache = self.store.caches[0]
        self._slot_of = {id(c): b for b, c in enumerate(self.store.caches)}
        self._free = list(range(slots))
        self._lock = threading.Lock()
        model.ensure_positions(self.capacity + rows)  # RoPE tables: allocated before capture
        self.graphs = dev.type == "cuda" if graphs is None else bool(graphs)
        if self.graphs and dev.type != "cuda":
            raise ThorError("CUDA graphs need the model on a CUDA device")
        self.ids = torch.zeros(slots, rows, dtype=torch.long, device=dev)  # [B, R]
        self.start = torch.zeros(
            slots, dtype=torch.long, device=dev
        )  # each slot's first row's position
        self.offsets = torch.arange(rows, device=dev)  # [R]
        self.key_index = torch.arange(self.cache.max_len, device=dev)  # [S_max]
        self._staged = torch.zeros(slots, rows, dtype=torch.long)  # host side of ids
        self._starts = torch.zeros(slots, dtype=torch.long)  # host side of start
        self.span = key_span(rows, self.capacity) if slots == 1 else self.capacity
        self.sdpa = dev.type == "cuda"  # attention through SDPA's fused kernel (else matmuls)
        self._captured: dict[tuple, tuple] = {}
        self._pool = None
        # compile: the forward through torch.compile (elementwise work fused into few kernels:
        # at batch 1 a GPU decode step is bound by its kernel count); one compile per shape.
        self._fn = torch.compile(self._forward, dynamic=False) if compile else self._forward

    @property
    def captured(self) -> int:
        return len(self._captured)

    def new_cache(self, reach: int) -> KVCache:
        """A slot's store, emptied, for a request that may reach ``reach`` positions (prompt + new
        tokens). One slot: the same store every time, and ``reach`` fixes the key span of the
        request's decode forwards. Several: a free slot, held until ``release``."""
        if reach > self.capacity:
            raise ThorError(
                f"a request of {reach} positions exceeds the decoder's context of {self.capacity} "
                "tokens (raise max_context)"
            )
        if self.slots == 1:
            self.span = key_span(reach + self.rows, self.capacity)
            b = 0
        else:
            with self._lock:
                if not self._free:
                    raise ThorError(
                        f"all {self.slots} decode slots are in use (one per request generating)"
                    )
                b = self._free.pop(0)
        cache = self.store.caches[b]
        cache.crop(0)
        return cache

    def release(self, cache) -> None:
        """Give a request's slot back (several slots; one slot is never held)."""
        b = self._slot_of.get(id(cache))
        if self.slots > 1 and b is not None:
            with self._lock:
                if b not in self._free:
                    self._free.append(b)

    @torch.inference_mode()
    def verify(
        self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = (), cols=None
    ) -> ForwardOut:
        """ids [T] -> logits [T, V]: consecutive calls of ``rows`` rows (T = 1 is a plain step);
        every id's logit (``cols`` is not used: the graphs have one shape)."""
        return self.verify_many([SimpleNamespace(ids=ids, cache=cache, taps=tuple(taps))])[0]

    @torch.inference_mode()
    def verify_many(self, calls) -> list[ForwardOut]:
        """One verify per call (``ids`` [T], ``cache``, ``taps``: batch_verify.VerifyCall, each on
        its own slot), all in the same forwards: what each gets is what it gets alone. -> one
        ForwardOut per call."""
        slots = []
        for c in calls:
            b = self._slot_of.get(id(c.cache))
            if b is None:
                raise ThorError("fixed-shape decode runs on its own KV store (use new_cache)")
            slots.append(b)
        if len(set(slots)) < len(slots):
            raise ThorError("two verifies of one slot in one forward")
        taps = tuple(sorted({i for c in calls for i in c.taps}))
        parts: list[list[ForwardOut]] = [[] for _ in calls]
        longest = max(c.ids.shape[0] for c in calls)
        # a replay overwrites the static outputs: what a pass hands out outlives it only as a copy
        keep = (lambda t: t.clone()) if longest > self.rows else (lambda t: t)
        for s in range(0, longest, self.rows):
            live = [
                (j, b, c.ids[s : s + self.rows])
                for j, (b, c) in enumerate(zip(slots, calls))
                if c.ids.shape[0] > s
            ]
            # a slot with no rows here writes its padding past the context, never read
            self._starts.fill_(self.capacity)
            for j, b, ids in live:
                start = calls[j].cache.length
                if start + ids.shape[0] > self.capacity:
                    raise ThorError(
                        f"sequence of {start + ids.shape[0]} tokens exceeds the decoder's context "
                        f"of {self.capacity}"
                    )
                # rows past T keep earlier ids: padding
                self._staged[b, : ids.shape[0]] = ids
                self._starts[b] = start
            # blocking copies: the host buffers are reused next call, and the cycle has
            # synchronised on the acceptor already
            self.ids.copy_(self._staged)
            self.start.copy_(self._starts)
            logits, tap_out = self._run(self.span, taps)  # [B * R, V], {layer: [B * R, D]}
            for j, b, ids in live:
                c, T, r0 = calls[j].cache, ids.shape[0], b * self.rows
                c.lengths = [int(self._starts[b]) + T] * len(c.lengths)
                # views of static buffers: the caller reads them before the next call overwrites
                # them
                parts[j].append(
                    ForwardOut(
                        keep(logits[r0 : r0 + T]),
                        {i: keep(tap_out[i][r0 : r0 + T]) for i in calls[j].taps},
                    )
                )
        return [
            p[0]
            if len(p) == 1
            else ForwardOut(
                torch.cat([x.logits for x in p]),
                {i: torch.cat([x.taps[i] for x in p]) for i in c.taps},
            )
            for p, c in zip(parts, calls)
        ]

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
        replay writes. Other threads (the batch's other sequences) may use the GPU meanwhile:
        only this thread's calls must be capture-safe."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._fn(span, taps)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            out = self._fn(span, taps)
        self._pool = graph.pool()
        return graph, out

    def _forward(self, span: int, taps: tuple[int, ...]):
        """The whole decode forward on the static buffers, every slot's rows at once.
        -> (logits [B * R, V] fp32, {layer: [B * R, D]})."""
        m, n_layers = self.model, self.model.cfg.num_layers
        seg = m if m.backend is None else m.backend
        B, R, H, Hkv, Dh = (
            self.slots,
            self.rows,
            m.cfg.num_heads,
            m.cfg.num_kv_heads,
            m.cfg.head_dim,
        )
        g = H // Hkv
        pos = self.offsets[None, :] + self.start[:, None]  # [B, R]
        visible = self.key_index[:span][None, None, :] <= pos[:, :, None]  # [B, R, S]
        if self.sdpa:
            # SDPA's fused kernel with the g query heads of a KV head folded into its rows
            # (row j * R + r is head j of the group, token r): plain multi-head attention
            # with a mask, one kernel where the matmul form takes eight.
            visible = visible.repeat(1, g, 1)[:, None]  # [B, 1, gR, S]
        flat = pos.reshape(-1)  # [B * R]
        rope = RopeRows(*m.rope_at(flat)) if m.backend is None else flat
        h = seg.embed(self.ids.reshape(-1))  # [B * R, D]
        out_taps = {}
        for i in range(n_layers):
            q, k, v = seg.pre_attn(i, h, rope)  # q [H, BR, Dh], k/v [Hkv, BR, Dh]
            self.store.write(i, k, v, pos)
            K, V = self.store.read(i, span)  # [B, Hkv, S, Dh]
            q = q.reshape(H, B, R, Dh).transpose(0, 1)  # [B, H, R, Dh]
            if self.sdpa:
                # 4-D: SDPA's fused kernels take nothing else (3-D falls back to the math form)
                o = F.scaled_dot_product_attention(
                    q.reshape(B, Hkv, g * R, Dh), K, V, attn_mask=visible
                )
                # reshape, not view: a fused kernel may hand back another memory layout
                o = o.reshape(B, H, R, Dh)
            else:
                o = torch.stack(
                    [attend(q[b], K[b], V[b], visible[b]) for b in range(B)]
                )  # [B, H, R, Dh]
            h = seg.post_attn(i, h, o.permute(0, 2, 1, 3).reshape(B * R, -1))  # [B * R, D]
            if i in taps:
                out_taps[i] = h
        return seg.head(h), out_taps  # [B * R, V] fp32


class PaddedVerify:
    """The same one-shape rule for targets that own their cache (hybrid Gated-DeltaNet models,
    eager): every verify is padded to ``rows`` rows with copies of its last token. To the cache
    the padding rows are drafts that were rejected — the cycle's crop selects the checkpoint
    slot of the last real row — and every real row took the kernels of a ``rows``-row call."""

    def __init__(self, model, rows: int = STEP_ROWS):
        self.model, self.rows = model, rows

    def verify(self, ids: torch.Tensor, cache, taps: tuple[int, ...] = (), cols=None) -> ForwardOut:
        T = ids.shape[0]
        if T > self.rows:
            raise ThorError(
                f"a verify of {T} rows on a model with its own cache needs step rows >= {T} "
                f"(now {self.rows}): its rollback serves one forward"
            )
        padded = torch.cat([ids, ids[-1:].expand(self.rows - T)])  # [R]
        out = self.model.verify(padded, cache, taps)
        return ForwardOut(out.logits[:T], {i: t[:T] for i, t in out.taps.items()})
