"""Reference target model in torch, split into named segments.

embed -> per layer [pre_attn -> attention -> post_attn] -> head

``pre_attn`` and ``post_attn`` are dense, shape-stable work that a backend (ONNX
Runtime, TensorRT) can replace; ``attention`` stays in torch because it owns the KV
cache. Weights use HF names (``model.layers.N.self_attn.q_proj.weight`` ...) so both
loaders feed the same constructor; q/k/v and gate/up are fused here for fewer kernels.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .config import WEIGHT_LAYOUTS, ModelConfig
from .errors import ThorError
from .kv_cache import KVCache
from .lowbit import GROUP, Int4Weight, int4_projection, pick_int4_kernel


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # fp32 statistics as in HF, so bf16 weights don't drift on the variance.
    if x.is_cuda:
        # one fused kernel instead of five: decode on a GPU is bound by kernel count at these sizes
        y = F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps)
        return y if x.dtype == torch.float32 else y.to(x.dtype)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w     # w is kept in fp32
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / float(rs["factor"])
    elif kind == "llama3":
        factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        mid = (wavelen <= old / lo) & (wavelen >= old / hi)
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [H, T, Dh]; cos/sin: [T, Dh]. Rotate-half layout (HF convention)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


# Queries per call up to which ``attend`` uses plain batched matmuls. Decode and verify
# (1..~32 rows) are there: on CPU, torch's SDPA costs ~0.5 ms per call for one query and
# ~2 ms with a mask, against ~0.05-0.3 ms for the matmuls (SmolLM2-135M, 850 keys).
# Prefill keeps SDPA, whose fused kernel never materializes [T, n] scores per head.
SMALL_ATTN_ROWS = 64


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads.

    q [..., H, T, Dh]; k, v [..., Hkv, n, Dh] with H a multiple of Hkv (query head h reads KV
    head h // (H / Hkv)); mask None, or bool broadcastable to [..., 1, T, n] (True = attend), or
    float [T, n] added to the scores; causal: query t sees keys 0..t (T == n). -> [..., H, T, Dh].
    """
    H, T, Dh = q.shape[-3:]
    Hkv, n = k.shape[-3], k.shape[-2]
    if T > SMALL_ATTN_ROWS or (causal and T > 1):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=H != Hkv)
    g, lead = H // Hkv, q.shape[:-3]
    if T == 1 and mask is None and q.dim() == 3:
        # One query row: a decode step, and each row of an exact verify (both come here, so
        # they share the bits). bmm and an in-place scale: ~1 ms less per step than the
        # broadcasting matmuls below (SmolLM2-135M, 30 layers), the same kernels and bits.
        s = torch.bmm(q.reshape(Hkv, g, Dh), k.transpose(1, 2)).mul_(Dh ** -0.5)  # [Hkv, g, n]
        return torch.bmm(torch.softmax(s, -1, dtype=torch.float32).to(v.dtype), v).view(H, 1, Dh)
    # The g query heads of one KV head share its keys: fold them into the row dim, so one
    # matmul per KV head replaces a copy of K/V per query head.
    qg = q.reshape(*lead, Hkv, g * T, Dh)                                      # [..., Hkv, gT, Dh]
    s = torch.matmul(qg, k.transpose(-1, -2)) * (Dh ** -0.5)                  # [..., Hkv, gT, n]
    if mask is not None:
        s = s.view(*lead, Hkv, g, T, n)
        s = s + mask if mask.is_floating_point() else s.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        s = s.view(*lead, Hkv, g * T, n)
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(p, v).view(*lead, H, T, Dh)                           # [..., H, T, Dh]


# Up to this many rows the int8 kernel wins (decode and verify); beyond it (prefill) the
# dense fp32 matmul does — measured on AVX-512 CPUs, see docs/performance.md.
INT8_MAX_ROWS = 16
# A prepared head (an Int8Weight from the weight cache) under this key of the weights dict.
PREPARED_HEAD = "thor.head_w"


class Int8Weight:
    """Weight-only int8, one bf16 scale per output channel, for the weight-bound small-M
    matmuls of decode and verify (a quarter of fp32's bytes to read per token). Large-M
    work (prefill) runs on a dense fp32 copy when ``keep_dense`` — compute-bound there,
    and int8 unpacking would only slow it."""

    def __init__(self, w: torch.Tensor, keep_dense: bool = True):
        w = w.float()
        s = w.abs().amax(1).clamp_min(1e-8) / 127.0                 # [out]
        self.q = torch.round(w / s[:, None]).to(torch.int8).contiguous()  # [out, in]
        self.s = s.to(torch.bfloat16)
        self.dense = w.contiguous() if keep_dense else None
        self.shape = w.shape
        try:
            torch._weight_int8pack_mm(torch.zeros(1, w.shape[1], dtype=torch.bfloat16, device=w.device),
                                      self.q, self.s)
            self.kernel = True
        except (RuntimeError, NotImplementedError, AttributeError):
            self.kernel = False  # no int8 kernel on this device: dequantize instead

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, d = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, d)                                        # [M, in]
        if self.kernel and x2.shape[0] <= INT8_MAX_ROWS:
            # the kernel takes row-major rows only (a hybrid's gated attention output is a view)
            y = torch._weight_int8pack_mm(x2.to(torch.bfloat16).contiguous(), self.q, self.s)
        else:
            w = self.dense if self.dense is not None else self.q.float() * self.s.float()[:, None]
            y = F.linear(x2.float(), w)
        return y.to(x.dtype).view(*lead, -1)


# Up to this many rows a dense (MKL) matmul beats the oneDNN-packed one on this CPU class:
# measured for SmolLM2-135M's projections (2 threads), dense/packed ms for all 30 layers +
# head: M=1 19.5/23.1, M=2 21.1/23.3, M=3 22.7/22.5, M=4 33.9/24.9, M=16 42.6/34.2.
DENSE_MAX_ROWS = 3


class PackedWeight:
    """A weight in oneDNN's blocked layout (CPU), packed once at load, for multi-row matmuls.

    MKL's ``F.linear`` switches to a kernel that scales poorly from M = 4 rows on: a 16-row
    verify costs ~2.2x a 1-row step. The packed weight brings that to ~1.8x, but its 1-row
    GEMV is ~15% slower than MKL's. ``dense`` (the same weight, plain) serves the rows up to
    DENSE_MAX_ROWS — plain decoding and short verifies — at the cost of a second copy.
    """

    def __init__(self, w: torch.Tensor, dense: torch.Tensor | None = None):
        self.shape = w.shape
        self.w = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None)
        self.dense = dense

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, d = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, d)                                        # [M, in]
        if self.dense is not None and x2.shape[0] <= DENSE_MAX_ROWS:
            return F.linear(x, self.dense)
        y = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.w, None, "none", [], "")
        return y.view(*lead, -1)

    @staticmethod
    def available(dtype: torch.dtype, device: torch.device) -> bool:
        """oneDNN packing exists for this dtype on this device (CPU builds with mkldnn)."""
        if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
            return False
        try:
            PackedWeight(torch.zeros(8, 8, dtype=dtype))(torch.zeros(1, 8, dtype=dtype))
            return True
        except (RuntimeError, NotImplementedError, AttributeError):
            return False


# Verify rows at most per forward of the exact decode path (``TargetModel.verify``): wider
# verifies run as consecutive forwards of this many rows, which is causally the same thing.
EXACT_ROWS = 16


class RowLoop:
    """A weight whose kernel gives a row different bits depending on how many rows share the
    call (MKL fp32 switches GEMV/GEMM kernels; ``dual`` mixes two). Decode-sized inputs go one
    row at a time, so every row gets exactly what a 1-row step gets; prefill-sized ones (more
    than EXACT_ROWS rows, never part of a verify) keep the fast kernel."""

    def __init__(self, w):
        self.w, self.shape = w, w.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])                              # [M, in]
        if not 1 < x2.shape[0] <= EXACT_ROWS:
            return linear(x, self.w)
        return torch.cat([linear(x2[i:i + 1], self.w) for i in range(x2.shape[0])]).view(*x.shape[:-1], -1)


Weight = torch.Tensor | Int8Weight | PackedWeight | RowLoop | Int4Weight


def make_rows_exact(model, names: tuple[str, ...], verdict: dict[str, bool] | None = None) -> list[str]:
    """Wrap every projection (``names`` of each of ``model.layers``, and ``model.head_w``) whose
    kernel is not row-invariant here in a RowLoop, one probe per distinct kernel and shape.
    verdict: earlier probes' results (kernel/shape key -> bool), used and filled in; valid only
    for the same torch, CPU capability, thread count and dtype (the weight cache keys them so).
    -> the names of the wrapped projections."""
    verdict = {} if verdict is None else verdict

    def exact(w) -> bool:
        key = f"{type(w).__name__}{tuple(w.shape)}{'+dense' if getattr(w, 'dense', None) is not None else ''}"
        if key not in verdict:
            verdict[key] = rows_invariant(w, w.shape[1], model.dtype, model.device)
        return verdict[key]

    wrapped = []
    for L in model.layers:
        for n in names:
            if not exact(getattr(L, n)):
                setattr(L, n, RowLoop(getattr(L, n)))
                wrapped.append(n)
    if not exact(model.head_w):
        model.head_w = RowLoop(model.head_w)
        wrapped.append("head")
    return sorted(set(wrapped))


def int8_head(lm_head: torch.Tensor, int4_kernel: str | None):
    """The quantized models' output projection: 8-bit blocks on MatMulNBits next to its int4
    projections (a Q8_0 table keeps its own codes), else torch's per-channel int8."""
    if int4_kernel == "ort" and lm_head.shape[1] % GROUP == 0:
        from .lowbit_ort import NBitsWeight
        return NBitsWeight.from_dense_int8(lm_head)
    return Int8Weight(lm_head, keep_dense=False)


def linear(x: torch.Tensor, w) -> torch.Tensor:
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w(x)


class RowWise:
    """A segment backend (ONNX Runtime, TensorRT) called one row at a time: each call is the
    very call a 1-row step makes, so ``verify`` stays exact on a backend whose kernels give a
    row different bits depending on the row count."""

    def __init__(self, backend):
        self.b = backend

    def embed(self, ids):
        return self.b.embed(ids)                   # a gather: the same bits for any row count

    def pre_attn(self, i, h, pos):
        rows = [self.b.pre_attn(i, h[t:t + 1], pos[t:t + 1]) for t in range(h.shape[0])]
        return tuple(torch.cat(parts, dim=-2) for parts in zip(*rows))   # q [H, T, Dh], k/v [Hkv, T, Dh]

    def post_attn(self, i, h, o):
        return torch.cat([self.b.post_attn(i, h[t:t + 1], o[t:t + 1]) for t in range(h.shape[0])])

    def post_pre(self, i, h, o, pos):
        rows = [self.b.post_pre(i, h[t:t + 1], o[t:t + 1], pos[t:t + 1]) for t in range(h.shape[0])]
        hs, *qkv = zip(*rows)
        return (torch.cat(hs), *(torch.cat(parts, dim=-2) for parts in qkv))

    def head(self, h):
        return torch.cat([self.b.head(h[t:t + 1]) for t in range(h.shape[0])])


def backend_for_verify(model, backend):
    """``backend`` itself if its dense segments give each of 2..EXACT_ROWS rows the bits that row
    gets alone (probed on seeded inputs through the segments a verify calls), else RowWise."""
    cfg, R = model.cfg, EXACT_ROWS
    g = torch.Generator().manual_seed(0)
    h = torch.randn(R, cfg.hidden_size, generator=g).to(model.dtype)
    o = torch.randn(R, cfg.num_heads * cfg.head_dim, generator=g).to(model.dtype)
    pos = torch.arange(R)
    rw = RowWise(backend)
    last = cfg.num_layers - 1       # a fused backend has post_attn for the last layer only
    calls = [lambda b, m: b.pre_attn(0, h[:m], pos[:m]), lambda b, m: (b.post_attn(last, h[:m], o[:m]),),
             lambda b, m: (b.head(h[:m]),)]
    if cfg.num_layers > 1:
        calls.append(lambda b, m: b.post_pre(0, h[:m], o[:m], pos[:m]))
    for call in calls:
        alone = call(rw, R)
        for m in range(2, R + 1):
            got = call(backend, m)
            if not all(torch.equal(x, y[..., :m, :] if y.dim() == 3 else y[:m]) for x, y in zip(got, alone)):
                return rw
    return backend


def rows_invariant(w, d_in: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``linear(x, w)`` gives each of 2..EXACT_ROWS rows the very bits it gives that row
    alone, on this CPU, with this kernel, shape and thread count. A GEMM computes every row
    with the same instruction sequence, so one seeded probe per kernel and shape decides."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(EXACT_ROWS, d_in, generator=g).to(device=device, dtype=dtype)   # [R, in]
    alone = torch.cat([linear(x[i:i + 1], w) for i in range(EXACT_ROWS)])          # [R, out]
    return all(torch.equal(linear(x[:m], w), alone[:m]) for m in range(2, EXACT_ROWS + 1))


@dataclass
class Layer:
    attn_norm: torch.Tensor          # [D]
    wqkv: Weight                     # [(H + 2 Hkv) Dh, D]
    wo: Weight                       # [D, H Dh]
    mlp_norm: torch.Tensor           # [D]
    w_gate_up: Weight                # [2 I, D]
    w_down: Weight                   # [D, I]
    q_norm: torch.Tensor | None = None  # [Dh] (qwen3)
    k_norm: torch.Tensor | None = None  # [Dh]
    bqkv: torch.Tensor | None = None    # [(H + 2 Hkv) Dh] (qwen2)


@dataclass(frozen=True)
class RopeRows:
    """cos, sin [..., 1, T, Dh] of one forward's positions, passed to the layers' ``pre_attn`` in
    place of the positions so they gather them once (on a GPU each gather is a kernel)."""
    cos: torch.Tensor
    sin: torch.Tensor


@dataclass
class ForwardOut:
    logits: torch.Tensor | None                      # [R, V] fp32 for the requested rows
    taps: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [T, D] (output of that layer)


def _expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    D, I, Dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    H, Hk = cfg.num_heads, cfg.num_kv_heads
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, D), "model.norm.weight": (D,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, D)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (H * Dh, D), p + "self_attn.k_proj.weight": (Hk * Dh, D),
            p + "self_attn.v_proj.weight": (Hk * Dh, D), p + "self_attn.o_proj.weight": (D, H * Dh),
            p + "mlp.gate_proj.weight": (I, D), p + "mlp.up_proj.weight": (I, D),
            p + "mlp.down_proj.weight": (D, I),
        })
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (Dh,)
            shapes[p + "self_attn.k_norm.weight"] = (Dh,)
        if cfg.qkv_bias:
            shapes.update({p + "self_attn.q_proj.bias": (H * Dh,), p + "self_attn.k_proj.bias": (Hk * Dh,),
                           p + "self_attn.v_proj.bias": (Hk * Dh,)})
    return shapes


def check_weights(cfg: ModelConfig, weights: dict[str, torch.Tensor], source: str) -> None:
    for name, shape in _expected_shapes(cfg).items():
        if name not in weights:
            raise ThorError(f"{source}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ThorError(f"{source}: tensor {name} has shape {list(weights[name].shape)}, "
                            f"expected {list(shape)}")


def residual_mlp(h: torch.Tensor, o: torch.Tensor, w_out, mlp_norm: torch.Tensor, w_gate_up, w_down,
                 eps: float) -> torch.Tensor:
    """Everything after a mixer: out projection + residual, then SwiGLU MLP + residual.
    h [..., T, D] residual stream, o [..., T, *] mixer output -> next h."""
    h = h + linear(o, w_out)
    x = rms_norm(h, mlp_norm, eps)
    gate, up = linear(x, w_gate_up).chunk(2, dim=-1)                       # [..., T, I] each
    return h + linear(F.silu(gate) * up, w_down)


def resolve_layout(dtype: torch.dtype, device: torch.device, quant: str | None, layout: str,
                   quants: tuple[str, ...] = ("int8", "int4")):
    """-> (compute dtype, concrete layout) for a model's weights; refuses what cannot be held."""
    if quant is not None and quant not in quants:
        raise ThorError(f"unknown weight quantization {quant!r} (supported: {', '.join(quants)})")
    if layout not in WEIGHT_LAYOUTS:
        raise ThorError(f"unknown weight layout {layout!r}; choose one of {', '.join(WEIGHT_LAYOUTS)}")
    if quant:
        dtype = torch.bfloat16
    can_pack = not quant and PackedWeight.available(dtype, device)
    if layout in ("packed", "dual") and not can_pack:
        raise ThorError(f"weight layout {layout!r} needs a CPU torch with oneDNN and fp32/bf16 weights "
                        f"(got {dtype} on {device}{', int8' if quant else ''})")
    if layout == "auto":
        # packed: one row-invariant kernel for every row count (exact verifies), and bf16 has
        # no fast MKL GEMV anyway
        layout = "packed" if can_pack else "dense"
    return dtype, layout


class TargetModel:
    """Batch-1 decoder. Every forward takes the next T token ids of one sequence.

    ``quant="int8"``: projection weights (and the head) as Int8Weight, activations bf16.
    ``layout``: how the other projection weights are held, see WEIGHT_LAYOUTS."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32,
                 source: str = "weights", device: str | torch.device = "cpu", quant: str | None = None,
                 layout: str = "auto", row_verdicts: dict[str, bool] | None = None, int4_kernel: str = "auto"):
        check_weights(cfg, weights, source)
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
            if quant == "int4":  # weight-only int4, group scales (thor_runtime/lowbit.py)
                return int4_projection([weights[n] for n in names], self.int4_kernel)
            t = torch.cat([weights[n].to(self.device) for n in names]).contiguous()
            return Int8Weight(t) if quant else held(t.to(dtype))

        def table(name):
            return weights[name].to(device=self.device, dtype=table_dtype).contiguous()

        self.embed_w = table("model.embed_tokens.weight")         # [V, D]
        self.lm_head = self.embed_w if cfg.tie_word_embeddings else table("lm_head.weight")
        # The drafter shares lm_head as a plain tensor; the target's own head may be int8 or
        # packed (the dense tensor stays anyway: embedding lookups and the drafter read it).
        self.head_w = weights.get(PREPARED_HEAD) or (
            int8_head(self.lm_head, self.int4_kernel) if quant else held(self.lm_head))
        self.final_norm = norm("model.norm.weight")
        self.layers: list[Layer] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(Layer(
                attn_norm=norm(p + "input_layernorm.weight"),
                wqkv=proj(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                wo=proj(p + "self_attn.o_proj.weight"),
                mlp_norm=norm(p + "post_attention_layernorm.weight"),
                w_gate_up=proj(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                w_down=proj(p + "mlp.down_proj.weight"),
                q_norm=norm(p + "self_attn.q_norm.weight") if cfg.qk_norm else None,
                k_norm=norm(p + "self_attn.k_norm.weight") if cfg.qk_norm else None,
                bqkv=torch.cat([w(p + f"self_attn.{n}_proj.bias") for n in "qkv"]) if cfg.qkv_bias else None,
            ))
        self.inv_freq = rope_inv_freq(cfg).to(self.device)  # [Dh/2]
        self._rope_len = 0
        self._ensure_rope(min(cfg.max_position_embeddings, 4096))      # (the step graph's probe reads it)
        t0 = time.perf_counter()
        self.row_verdicts = {} if row_verdicts is None else row_verdicts
        # Off the CPU, verifies are exact by running every decode forward at one shape
        # (fixed_shape.py), not by row-invariant kernels.
        self.row_loops = (make_rows_exact(self, ("wqkv", "wo", "w_gate_up", "w_down"), self.row_verdicts)
                          if self.device.type == "cpu" else [])
        # MatMulNBits models: the whole forward as one graph for fp32 KV caches
        # (lowbit_step.py), one graph per layer boundary for the others (lowbit_fused.py),
        # each where row-invariant. The second is built on first use: it holds its own copy
        # of the weights.
        self.step, self.fused, self._fused_built = None, None, False
        self.rows, self.rows_why = None, "weights are not MatMulNBits blocks"
        if self.int4_kernel == "ort":
            from .lowbit_fused import prepare_sessions
            from .lowbit_step import step_graph
            self.step = step_graph(self, self.row_verdicts)
            if self.step is None:
                self._build_fused()
            from .rowstep import row_step
            self.rows, self.rows_why = row_step(self, self.row_verdicts)
            if self.step is not None:
                prepare_sessions(self)
        self.probe_s = time.perf_counter() - t0
        # What runs the dense segments in ``forward`` (engines.Backend: ONNX Runtime, TensorRT);
        # None = the torch methods below. Attention stays here: it owns the KV cache.
        self.backend = None
        self.backend_exact = None             # what ``verify`` runs the backend's segments through

    @property
    def decode_kernel(self) -> str:
        """What runs decode steps and verifies on an fp32 cache (reports, /health)."""
        if self.rows is not None:
            return "rowstep"
        if self.step is not None:
            return "ort-step-graph"
        return self.int4_kernel or "torch"

    # ---- rope table (grown on demand; positions beyond the config are refused upstream)
    def ensure_positions(self, n: int) -> None:
        self._ensure_rope(n)

    def _ensure_rope(self, n: int) -> None:
        if n <= self._rope_len:
            return
        t = torch.arange(n, dtype=torch.float32, device=self.device)
        freqs = torch.outer(t, self.inv_freq)                   # [S, Dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)                 # [S, Dh]
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self._rope_len = n

    # ---- segments
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_w).to(self.dtype)    # [T, D]

    def pre_attn(self, i: int, h: torch.Tensor, pos: torch.Tensor):
        """h [..., T, D], pos [..., T] absolute positions -> q [..., H, T, Dh], k/v [..., Hkv, T, Dh]
        with norms and RoPE applied. Leading dims are free, so a batched caller can reuse it."""
        L = self.layers[i]
        qkv = linear(rms_norm(h, L.attn_norm, self.cfg.rms_eps), L.wqkv)   # [..., T, (H + 2Hkv) Dh]
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
        q = q.view(*lead, T, cfg.num_heads, Dh).transpose(-3, -2)     # [..., H, T, Dh]
        k = k.view(*lead, T, cfg.num_kv_heads, Dh).transpose(-3, -2)  # [..., Hkv, T, Dh]
        v = v.view(*lead, T, cfg.num_kv_heads, Dh).transpose(-3, -2)  # [..., Hkv, T, Dh]
        if L.q_norm is not None:
            q, k = rms_norm(q, L.q_norm, cfg.rms_eps), rms_norm(k, L.k_norm, cfg.rms_eps)
        cos, sin = self.rope_at(pos)                                   # [..., 1, T, Dh]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def rope_at(self, pos):
        """cos, sin [..., 1, T, Dh] at ``pos``: positions [..., T], or RopeRows gathered once
        for a whole forward (fixed_shape.py: not once per layer)."""
        if isinstance(pos, RopeRows):
            return pos.cos, pos.sin
        return self.cos[pos].unsqueeze(-3), self.sin[pos].unsqueeze(-3)

    def attention(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                  exact: bool = False) -> torch.Tensor:
        """Append k/v to the cache, attend causally over everything cached. -> [T, H Dh].

        exact: each query row attends alone over its own prefix of keys, the very call a 1-row
        step at that position makes, so its output has that step's bits (see ``verify``)."""
        start = cache.lengths[i]
        cache.append(i, k, v)
        K, V = cache.view(i)                                    # [Hkv, n, Dh]
        T, n = q.shape[1], K.shape[1]
        if exact and T > 1:
            o = torch.cat([attend(q[:, t:t + 1], K[:, :start + t + 1], V[:, :start + t + 1])
                           for t in range(T)], dim=1)           # [H, T, Dh]
            return o.transpose(0, 1).reshape(T, -1)
        if T == 1:
            mask, causal = None, False
        elif start == 0:
            mask, causal = None, True
        else:
            # Query t sits at absolute position start + t and may see keys 0..start + t: every
            # cached key, then a causal [T, T] tail. Additive, so it costs one add per score.
            tail = torch.full((T, T), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
            mask, causal = F.pad(tail, (n - T, 0)), False                          # [T, n]
        o = attend(q, K, V, mask, causal)                        # [H, T, Dh]
        return o.transpose(0, 1).reshape(T, -1)                 # [T, H Dh]

    def post_attn(self, i: int, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """h [..., T, D] residual stream, o [..., T, H Dh] attention output -> next h."""
        L = self.layers[i]
        return residual_mlp(h, o, L.wo, L.mlp_norm, L.w_gate_up, L.w_down, self.cfg.rms_eps)

    def _build_fused(self) -> None:
        """The per-boundary graphs, then the sessions they leave out, and the weights' pages
        ORT has read handed back."""
        from .lowbit_fused import fuse_layers, prepare_sessions
        self.fused, self._fused_built = fuse_layers(self, self.row_verdicts), True
        prepare_sessions(self)

    def post_pre(self, i: int, h: torch.Tensor, o: torch.Tensor, pos: torch.Tensor):
        """post_attn of layer i then pre_attn of layer i + 1: the dense work between two
        attentions, which a backend may run as one fused graph. -> (h, q, k, v)."""
        if self.int4_kernel == "ort" and not self._fused_built:      # a first bf16/fp8 cache
            self._build_fused()
        if self.fused is not None:
            return self.fused.post_pre(i, h, o, pos, self.cos, self.sin)
        h = self.post_attn(i, h, o)
        return (h, *self.pre_attn(i + 1, h, pos))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return linear(rms_norm(h, self.final_norm, self.cfg.rms_eps), self.head_w).float()  # [R, V]

    # ---- whole forward
    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = (),
                logits_rows: str | slice = "all", exact: bool = False) -> ForwardOut:
        """ids [T] continue the sequence in ``cache``. logits_rows: "all", "last", "none" or a slice.
        exact: row-invariant attention (``verify``)."""
        start, T = cache.length, ids.shape[0]
        if start + T > self.cfg.max_position_embeddings:
            raise ThorError(f"sequence of {start + T} tokens exceeds the model context "
                            f"{self.cfg.max_position_embeddings}")
        self._ensure_rope(start + T)
        seg = self if self.backend is None else self.backend
        h = seg.embed(ids.to(self.device))
        out = ForwardOut(None)
        rows = logits_rows if isinstance(logits_rows, slice) else \
            {"all": slice(None), "last": slice(-1, None), "none": None}[logits_rows]
        if exact and self.rows is not None and self.backend is None and self.rows.fits(cache, T):
            # steps and verifies: each row alone on our kernel (rowstep.py), no padding
            out.taps, out.logits = self.rows(h, cache, taps, rows)
            return out
        if self.step is not None and self.backend is None and self.step.fits(cache, T):
            # row-invariant (probed): ``exact`` holds as it is
            out.taps, out.logits = self.step(h, cache, taps, rows)
            return out
        pos = torch.arange(start, start + T, device=self.device)      # [T]
        n = self.cfg.num_layers
        if exact and self.backend is not None:
            seg = self.backend_exact          # row-invariant, or the backend row by row
        q, k, v = seg.pre_attn(0, h, pos)
        for i in range(n):
            o = self.attention(i, q, k, v, cache, exact)
            if i + 1 < n:
                h, q, k, v = seg.post_pre(i, h, o, pos)
            else:
                h = seg.post_attn(i, h, o)
            if i in taps:
                out.taps[i] = h
        if rows is not None:
            out.logits = seg.head(h[rows])
        return out

    def verify(self, ids: torch.Tensor, cache: KVCache, taps: tuple[int, ...] = ()) -> ForwardOut:
        """The decode cycle's forward over anchor + drafts, ids [T] -> logits [T, V].

        Row t's logits, taps and stored K/V are bit-for-bit what a 1-row step at its position
        would produce: projections run on row-invariant kernels (RowLoop where a kernel is not),
        attention per row. So greedy speculative decoding commits exactly the tokens plain
        decoding commits, whatever the KV dtype — no tolerance: an fp8 cache holds the same
        bytes either way. Plain decoding is this with T = 1."""
        parts = [self.forward(ids[s:s + EXACT_ROWS], cache, taps, exact=True)
                 for s in range(0, ids.shape[0], EXACT_ROWS)]
        if len(parts) == 1:
            return parts[0]
        return ForwardOut(torch.cat([p.logits for p in parts]),
                          {i: torch.cat([p.taps[i] for p in parts]) for i in taps})

    def prefill(self, ids: torch.Tensor, cache: KVCache, chunk: int = 0, taps: tuple[int, ...] = (),
                tap_rows: int = 0) -> ForwardOut:
        """Run the prompt in chunks of ``chunk`` tokens (0 = one pass). Returns last-row logits and
        the taps of the last ``tap_rows`` prompt tokens (drafter window seeding)."""
        T = ids.shape[0]
        step = chunk if chunk and chunk > 0 else T
        tap_parts: dict[int, list[torch.Tensor]] = {i: [] for i in taps}
        out = ForwardOut(None)
        for s in range(0, T, step):
            e = min(T, s + step)
            want_taps = taps if tap_rows and e > T - tap_rows else ()
            o = self.forward(ids[s:e], cache, taps=want_taps, logits_rows="last" if e == T else "none")
            for i, t in o.taps.items():
                tap_parts[i].append(t[max(0, T - tap_rows - s):])
            out.logits = o.logits
        if tap_rows:
            out.taps = {i: torch.cat(p) for i, p in tap_parts.items()}
        return out
