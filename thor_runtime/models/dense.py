"""Reference target model in torch, split into named segments.

embed -> per layer [pre_attn -> attention -> post_attn] -> head

``pre_attn`` and ``post_attn`` are dense, shape-stable work that a backend (ONNX
Runtime, TensorRT) can replace; ``attention`` stays in torch because it owns the KV
cache. Weights use HF names (``model.layers.N.self_attn.q_proj.weight`` ...) so both
loaders feed the same constructor; q/k/v and gate/up are fused here for fewer kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from thor_runtime.cache.kv_cache import KVCache
from thor_runtime.engine.constraint import reads_part

# The math, the weights' forms and the exactness tools live apart (attention.py,
# projections.py, exactness.py); importers of the model module find them here too.
from thor_runtime.engine.exactness import (
    EXACT_ROWS,
    RowLoop,
    make_rows_exact,
)  # noqa: F401

# re-exported: importers of this module find these names here too
from thor_runtime.engine.exactness import (
    RowWise as RowWise,
)
from thor_runtime.engine.exactness import (
    backend_for_verify as backend_for_verify,
)
from thor_runtime.engine.exactness import (
    rows_invariant as rows_invariant,
)
from thor_runtime.errors import ThorError
from thor_runtime.kernels.lowbit import GROUP, Int4Weight
from thor_runtime.kernels.lowbit_kernels import int4_projection, pick_int4_kernel
from thor_runtime.kernels.projections import (
    DENSE_MAX_ROWS as DENSE_MAX_ROWS,
)
from thor_runtime.kernels.projections import (
    INT8_MAX_ROWS as INT8_MAX_ROWS,
)
from thor_runtime.kernels.projections import (
    Int8Weight,
    PackedWeight,
    linear,
)  # noqa: F401
from thor_runtime.models.attention import apply_rope, attend, rms_norm, rope_inv_freq
from thor_runtime.models.config import WEIGHT_LAYOUTS, ModelConfig

# A prepared head (an Int8Weight from the weight cache) under this key of the weights dict.
PREPARED_HEAD = "thor.head_w"
Weight = torch.Tensor | Int8Weight | PackedWeight | RowLoop | Int4Weight


def int8_head(lm_head: torch.Tensor, int4_kernel: str | None):
    """The quantized models' output projection: 8-bit blocks on MatMulNBits next to its int4
    projections (a Q8_0 table keeps its own codes), else torch's per-channel int8."""
    if int4_kernel == "ort" and lm_head.shape[1] % GROUP == 0:
        from thor_runtime.kernels.lowbit_ort import NBitsWeight

        return NBitsWeight.from_dense_int8(lm_head)
    return Int8Weight(lm_head, keep_dense=False)


@dataclass
class Layer:
    attn_norm: torch.Tensor  # [D]
    wqkv: Weight  # [(H + 2 Hkv) Dh, D]
    wo: Weight  # [D, H Dh]
    mlp_norm: torch.Tensor  # [D]
    w_gate_up: Weight  # [2 I, D]
    w_down: Weight  # [D, I]
    q_norm: torch.Tensor | None = None  # [Dh] (qwen3)
    k_norm: torch.Tensor | None = None  # [Dh]
    bqkv: torch.Tensor | None = None  # [(H + 2 Hkv) Dh] (qwen2)


@dataclass(frozen=True)
class RopeRows:
    """cos, sin [..., 1, T, Dh] of one forward's positions, passed to the layers' ``pre_attn`` in
    place of the positions so they gather them once (on a GPU each gather is a kernel)."""

    cos: torch.Tensor
    sin: torch.Tensor


@dataclass
class ForwardOut:
    logits: torch.Tensor | None  # [R, V] fp32 for the requested rows
    taps: dict[int, torch.Tensor] = field(
        default_factory=dict
    )  # layer -> [T, D] (output of that layer)


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    D, Di, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    H, Hk = cfg.num_heads, cfg.num_kv_heads
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, D)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (D,),
                p + "post_attention_layernorm.weight": (D,),
                p + "self_attn.q_proj.weight": (H * Dh, D),
                p + "self_attn.k_proj.weight": (Hk * Dh, D),
                p + "self_attn.v_proj.weight": (Hk * Dh, D),
                p + "self_attn.o_proj.weight": (D, H * Dh),
                p + "mlp.gate_proj.weight": (Di, D),
                p + "mlp.up_proj.weight": (Di, D),
                p + "mlp.down_proj.weight": (D, Di),
            }
        )
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (Dh,)
            shapes[p + "self_attn.k_norm.weight"] = (Dh,)
        if cfg.qkv_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (H * Dh,),
                    p + "self_attn.k_proj.bias": (Hk * Dh,),
                    p + "self_attn.v_proj.bias": (Hk * Dh,),
                }
            )
    return shapes


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], source: str) -> None:
    for name, shape in _expected_shapes(cfg).items():
        if name not in weights:
            raise ThorError(f"{source}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ThorError(
                f"{source}: tensor {name} has shape {list(weights[name].shape)}, "
                f"expected {list(shape)}"
            )


def residual_mlp(
    h: torch.Tensor, o: torch.Tensor, w_out, mlp_norm: torch.Tensor, w_gate_up, w_down, eps: float
) -> torch.Tensor:
    """Everything after a mixer: out projection + residual, then SwiGLU MLP + residual.
    h [..., T, D] residual stream, o [..., T, *] mixer output -> next h."""
    h = h + linear(o, w_out)
    x = rms_norm(h, mlp_norm, eps)
    gate, up = linear(x, w_gate_up).chunk(2, dim=-1)  # [..., T, I] each
    return h + linear(F.silu(gate) * up, w_down)


def resolve_layout(
    dtype: torch.dtype,
    device: torch.device,
    quant: str | None,
    layout: str,
    quants: tuple[str, ...] = ("int8", "int4"),
):
    """-> (compute dtype, concrete layout) for a model's weights; refuses what cannot be held."""
    if quant is not None and quant not in quants:
        raise ThorError(f"unknown weight quantization {quant!r} (supported: {', '.join(quants)})")
    if layout not in WEIGHT_LAYOUTS:
        raise ThorError(
            f"unknown weight layout {layout!r}; choose one of {', '.join(WEIGHT_LAYOUTS)}"
        )
    if quant:
        dtype = torch.bfloat16
    can_pack = not quant and PackedWeight.available(dtype, device)
    if layout in ("packed", "dual") and not can_pack:
        raise ThorError(
            f"weight layout {layout!r} needs a CPU torch with oneDNN and fp32/bf16 weights "
            f"(got {dtype} on {device}{', int8' if quant else ''})"
        )
    if layout == "auto":
        # packed: one row-invariant kernel for every row count (exact verifies), and bf16 has
        # no fast MKL GEMV anyway
        layout = "packed" if can_pack else "dense"
    return dtype, layout


class TargetModel:
    """Batch-1 decoder. Every forward takes the next T token ids of one sequence.

    ``quant="int8"``: projection weights (and the head) as Int8Weight, activations bf16.
    ``layout``: how the other projection weights are held, see WEIGHT_LAYOUTS.
    A ``target.Target``: the math only; what runs it faster is the runner's (runner.py)."""

    is_hybrid = False  # its cache is K/V alone: prefixes reusable, any verify width

    def __init__(
        self,
        cfg: ModelConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        source: str = "weights",
        device: str | torch.device = "cpu",
        quant: str | None = None,
        layout: str = "auto",
        row_verdicts: dict[str, bool] | None = None,
        int4_kernel: str = "auto",
    ):
        check_weights(cfg, weights, source)
        self.source = source  # the checkpoint's path: what a stored prefix is keyed by
        self.cfg, self.device, self.quant = cfg, torch.device(device), quant
        self.dtype, self.layout = dtype, _ = resolve_layout(dtype, self.device, quant, layout)
        self.int4_kernel = pick_int4_kernel(int4_kernel) if quant == "int4" else None
        table_dtype = dtype
        if self.int4_kernel == "ort":
            # MatMulNBits takes fp32 activations, and on CPUs without bf16 arithmetic fp32
            # elementwise work is the faster one; the embedding table stays bf16 (half the
            # memory; only the gathered rows are widened).
            self.dtype = dtype = torch.float32
            table_dtype = torch.bfloat16

        def held(t: torch.Tensor):
            if self.layout == "dense":
                return t
            return PackedWeight(t, dense=t if self.layout == "dual" else None)

        def w(name):
            return weights[name].to(device=self.device, dtype=dtype).contiguous()

        def norm(name):  # norm weights stay fp32: tiny, and the statistics are fp32 anyway
            return weights[name].to(device=self.device, dtype=torch.float32).contiguous()

        def proj(*names):
            if quant == "int4":  # weight-only int4, group scales (thor_runtime/kernels/lowbit.py)
                return int4_projection([weights[n] for n in names], self.int4_kernel)
            t = torch.cat([weights[n].to(self.device) for n in names]).contiguous()
            return Int8Weight(t) if quant else held(t.to(dtype))

        def table(name):
            return weights[name].to(device=self.device, dtype=table_dtype).contiguous()

        self.embed_w = table("model.embed_tokens.weight")  # [V, D]
        self.lm_head = self.embed_w if cfg.tie_word_embeddings else table("lm_head.weight")
        # The drafter shares lm_head as a plain tensor; the target's own head may be int8 or
        # packed (the dense tensor stays anyway: embedding lookups and the drafter read it).
        self.head_w = weights.get(PREPARED_HEAD) or (
            int8_head(self.lm_head, self.int4_kernel) if quant else held(self.lm_head)
        )
        self.final_norm = norm("model.norm.weight")
        self.layers: list[Layer] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                Layer(
                    attn_norm=norm(p + "input_layernorm.weight"),
                    wqkv=proj(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                    wo=proj(p + "self_attn.o_proj.weight"),
                    mlp_norm=norm(p + "post_attention_layernorm.weight"),
                    w_gate_up=proj(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    w_down=proj(p + "mlp.down_proj.weight"),
                    q_norm=norm(p + "self_attn.q_norm.weight") if cfg.qk_norm else None,
                    k_norm=norm(p + "self_attn.k_norm.weight") if cfg.qk_norm else None,
                    bqkv=torch.cat([w(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
                    if cfg.qkv_bias
                    else None,
                )
            )
        self.inv_freq = rope_inv_freq(cfg).to(self.device)  # [Dh/2]
        self._rope_len = 0
        self._ensure_rope(
            min(cfg.max_position_embeddings, 4096)
        )  # (the step graph's probe reads it)
        t0 = time.perf_counter()
        self.row_verdicts = {} if row_verdicts is None else row_verdicts
        # Off the CPU, verifies are exact by running every decode forward at one shape
        # (fixed_shape.py), not by row-invariant kernels.
        self.row_loops = (
            make_rows_exact(self, ("wqkv", "wo", "w_gate_up", "w_down"), self.row_verdicts)
            if self.device.type == "cpu"
            else []
        )
        self.probe_s = time.perf_counter() - t0  # the runner adds its kernels' probes
        # What runs the dense segments in ``forward`` (engines.Backend: ONNX Runtime, TensorRT);
        # None = the torch methods below. Attention stays here: it owns the KV cache.
        self.backend = None
        self.backend_exact = None  # what ``verify`` runs the backend's segments through
        # What runs a forward once embedded: the kernel runner the loader attaches (runner.py),
        # which tries its registry in order. A bare model runs the layer path below.
        self.runner = None

    @property
    def decode_kernel(self) -> str:
        """What runs decode steps and verifies on an fp32 cache (reports, /health)."""
        return self.runner.decode_kernel if self.runner is not None else self.int4_kernel or "torch"

    @property
    def kernel_build(self) -> str:
        """The compiled row kernel's build (source, flags, compiler, CPU), "" when none runs:
        what a measured cost depends on beyond the kernel's name."""
        rows = getattr(self.runner, "rows", None)
        return rows.build if rows is not None else ""

    @property
    def prefill_kernel(self) -> str:
        """What runs prompt rows on an fp32 cache (reports, /health)."""
        return (
            self.runner.prefill_kernel if self.runner is not None else self.int4_kernel or "torch"
        )

    def new_cache(
        self, capacity: int, kv_dtype: str = "fp32", kv_scales=None, **options
    ) -> KVCache:
        """An empty KV cache for ``capacity`` positions. options: a hybrid cache's (naive
        rollback, hybrid/model.py); a KV cache has none, so a runtime passes its own alike."""
        return KVCache(self.cfg, capacity, kv_dtype, self.dtype, kv_scales, self.device)

    # ---- rope table (grown on demand; positions beyond the config are refused upstream)
    def ensure_positions(self, n: int) -> None:
        self._ensure_rope(n)

    def _ensure_rope(self, n: int) -> None:
        if n <= self._rope_len:
            return
        t = torch.arange(n, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, self.inv_freq)  # [S, Dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, Dh]
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self._rope_len = n

    # ---- segments
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_w).to(self.dtype)  # [T, D]

    def pre_attn(self, i: int, h: torch.Tensor, pos: torch.Tensor):
        """h [..., T, D], pos [..., T] absolute positions -> q [..., H, T, Dh],
        k/v [..., Hkv, T, Dh] with norms and RoPE applied. Leading dims are free, so a batched
        caller can reuse it."""
        L = self.layers[i]
        qkv = linear(rms_norm(h, L.attn_norm, self.cfg.rms_eps), L.wqkv)  # [..., T, (H + 2Hkv) Dh]
        if L.bqkv is not None:
            qkv = qkv + L.bqkv
        return self.heads(i, qkv, pos)

    def heads(self, i: int, qkv: torch.Tensor, pos: torch.Tensor):
        """The rest of pre_attn: projected qkv [..., T, (H + 2Hkv) Dh] -> q, k, v per head, with
        q/k norms and RoPE."""
        cfg, L = self.cfg, self.layers[i]
        T, Dh = qkv.shape[-2], cfg.head_dim
        lead = qkv.shape[:-2]
        q, k, v = qkv.split([cfg.num_heads * Dh, cfg.kv_dim, cfg.kv_dim], dim=-1)
        q = q.view(*lead, T, cfg.num_heads, Dh).transpose(-3, -2)  # [..., H, T, Dh]
        k = k.view(*lead, T, cfg.num_kv_heads, Dh).transpose(-3, -2)  # [..., Hkv, T, Dh]
        v = v.view(*lead, T, cfg.num_kv_heads, Dh).transpose(-3, -2)  # [..., Hkv, T, Dh]
        if L.q_norm is not None:
            q, k = rms_norm(q, L.q_norm, cfg.rms_eps), rms_norm(k, L.k_norm, cfg.rms_eps)
        cos, sin = self.rope_at(pos)  # [..., 1, T, Dh]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def rope_at(self, pos):
        """cos, sin [..., 1, T, Dh] at ``pos``: positions [..., T], or RopeRows gathered once
        for a whole forward (fixed_shape.py: not once per layer)."""
        if isinstance(pos, RopeRows):
            return pos.cos, pos.sin
        return self.cos[pos].unsqueeze(-3), self.sin[pos].unsqueeze(-3)

    def attention(
        self,
        i: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cache: KVCache,
        exact: bool = False,
    ) -> torch.Tensor:
        """Append k/v to the cache, attend causally over everything cached. -> [T, H Dh].

        exact: each query row attends alone over its own prefix of keys, the very call a 1-row
        step at that position makes, so its output has that step's bits (see ``verify``)."""
        start = cache.lengths[i]
        cache.append(i, k, v)
        K, V = cache.view(i)  # [Hkv, n, Dh]
        T, n = q.shape[1], K.shape[1]
        if exact and T > 1:
            o = torch.cat(
                [
                    attend(q[:, t : t + 1], K[:, : start + t + 1], V[:, : start + t + 1])
                    for t in range(T)
                ],
                dim=1,
            )  # [H, T, Dh]
            return o.transpose(0, 1).reshape(T, -1)
        if T == 1:
            mask, causal = None, False
        elif start == 0:
            mask, causal = None, True
        else:
            # Query t sits at absolute position start + t and may see keys 0..start + t: every
            # cached key, then a causal [T, T] tail. Additive, so it costs one add per score.
            tail = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
            mask, causal = F.pad(tail, (n - T, 0)), False  # [T, n]
        o = attend(q, K, V, mask, causal)  # [H, T, Dh]
        return o.transpose(0, 1).reshape(T, -1)  # [T, H Dh]

    def post_attn(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """h [..., T, D] residual stream, o [..., T, H Dh] attention output -> next h."""
        L = self.layers[i]
        return residual_mlp(h, o, L.wo, L.mlp_norm, L.w_gate_up, L.w_down, self.cfg.rms_eps)

    def post_pre(self, i: int, h: torch.Tensor, o: torch.Tensor, pos: torch.Tensor):
        """post_attn of layer i then pre_attn of layer i + 1: the dense work between two
        attentions, which a backend may run as one fused graph. -> (h, q, k, v)."""
        h = self.post_attn(i, h, o)
        return (h, *self.pre_attn(i + 1, h, pos))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return linear(rms_norm(h, self.final_norm, self.cfg.rms_eps), self.head_w).float()  # [R, V]

    # ---- whole forward
    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        cache: KVCache,
        taps: tuple[int, ...] = (),
        logits_rows: str | slice = "all",
        exact: bool = False,
        cols=None,
    ) -> ForwardOut:
        """ids [T] continue the sequence in ``cache``. logits_rows: "all", "last", "none" or a
        slice.
        exact: row-invariant attention (``verify``). cols: the token ids whose logits the caller
        reads (None: all); a kernel that computes only those leaves the others at -inf."""
        start, T = cache.length, ids.shape[0]
        if start + T > self.cfg.max_position_embeddings:
            raise ThorError(
                f"sequence of {start + T} tokens exceeds the model context "
                f"{self.cfg.max_position_embeddings}"
            )
        self._ensure_rope(start + T)
        h = (self if self.backend is None else self.backend).embed(ids.to(self.device))
        rows = (
            logits_rows
            if isinstance(logits_rows, slice)
            else {"all": slice(None), "last": slice(-1, None), "none": None}[logits_rows]
        )
        out = ForwardOut(None)
        if self.runner is None:
            out.taps, out.logits = self.run_layers(h, cache, taps, rows, exact)
        else:
            out.taps, out.logits = self.runner.run(h, cache, taps, rows, exact, cols)
        return out

    def segments(self, exact: bool):
        """Whose dense segments the layer path calls: an attached engine backend's (for a
        verify, row-invariant ones or the backend row by row), else the model's own."""
        if self.backend is None:
            return self
        return self.backend_exact if exact else self.backend

    def run_layers(
        self,
        h: torch.Tensor,
        cache: KVCache,
        taps: tuple[int, ...],
        rows: slice | None,
        exact: bool,
        seg=None,
    ):
        """The layer path: h [T, D] embedded -> ({layer: [T, D]}, logits [R, V] of ``rows`` or
        None). seg: whose dense segments run (default ``segments(exact)``); attention is ours."""
        seg = self.segments(exact) if seg is None else seg
        start, T = cache.length, h.shape[0]
        pos = torch.arange(start, start + T, device=self.device)  # [T]
        n, out_taps = self.cfg.num_layers, {}
        q, k, v = seg.pre_attn(0, h, pos)
        for i in range(n):
            o = self.attention(i, q, k, v, cache, exact)
            if i + 1 < n:
                h, q, k, v = seg.post_pre(i, h, o, pos)
            else:
                h = seg.post_attn(i, h, o)
            if i in taps:
                out_taps[i] = h
        return out_taps, None if rows is None else seg.head(h[rows])

    def verify(
        self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = (), cols=None
    ) -> ForwardOut:
        """The decode cycle's forward over anchor + drafts, ids [T] -> logits [T, V] (``cols``:
        the ids whose logits are read, see ``forward``).

        Row t's logits, taps and stored K/V are bit-for-bit what a 1-row step at its position
        would produce: projections run on row-invariant kernels (RowLoop where a kernel is not),
        attention per row. So greedy speculative decoding commits exactly the tokens plain
        decoding commits, whatever the KV dtype — no tolerance: an fp8 cache holds the same
        bytes either way. Plain decoding is this with T = 1."""
        parts = [
            self.forward(
                ids[s : s + EXACT_ROWS],
                cache,
                taps,
                exact=True,
                cols=reads_part(cols, s, s + EXACT_ROWS),
            )
            for s in range(0, ids.shape[0], EXACT_ROWS)
        ]
        if len(parts) == 1:
            return parts[0]
        return ForwardOut(
            torch.cat([p.logits for p in parts]),
            {i: torch.cat([p.taps[i] for p in parts]) for i in taps},
        )

    def prefill(
        self,
        ids: torch.Tensor,
        cache: KVCache,
        chunk: int = 0,
        taps: tuple[int, ...] = (),
        tap_rows: int = 0,
    ) -> ForwardOut:
        """Run the prompt in chunks of ``chunk`` tokens (0 = one pass). Returns last-row logits and
        the taps of the last ``tap_rows`` prompt tokens (drafter window seeding)."""
        T = ids.shape[0]
        step = chunk if chunk and chunk > 0 else T
        tap_parts: dict[int, list[torch.Tensor]] = {i: [] for i in taps}
        out = ForwardOut(None)
        for s in range(0, T, step):
            e = min(T, s + step)
            want_taps = taps if tap_rows and e > T - tap_rows else ()
            o = self.forward(
                ids[s:e], cache, taps=want_taps, logits_rows="last" if e == T else "none"
            )
            for i, t in o.taps.items():
                tap_parts[i].append(t[max(0, T - tap_rows - s) :])
            out.logits = o.logits
        if tap_rows:
            out.taps = {i: torch.cat(p) for i, p in tap_parts.items()}
        return out
