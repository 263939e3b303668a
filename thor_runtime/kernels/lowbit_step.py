"""The whole forward of a MatMulNBits model as one ONNX Runtime call, attention included.

With lowbit_fused.py a decode step of the default model was ~60 calls (a graph per layer
boundary, attention in torch between them) and spent ~2/3 of its time outside the weight
kernels. Here attention runs in the graph too, on ORT's GroupQueryAttention, which reads the
KV cache and appends the new keys and values in place: the graph's past and present K/V are
bound (IOBinding) to the same bytes, this layer's slice of our own ``KVCache``. So the cache
stays ours: ``append`` is the graph's write plus the lengths, ``crop`` is unchanged, a
prefix-cache copy is a tensor copy.

Exactness. A single row is padded to two as in lowbit_ort: the copy is a second position,
whose key and value land one slot past the sequence (the cache keeps a spare slot for it) and
are overwritten by the next step. Row t of a T-row call attends over keys 0..start + t only
(GroupQueryAttention's causal softmax); whether its bits equal a 1-row step's is probed at
load (``step_graph``) and the graph is used only where they do.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from thor_runtime.engine.exactness import EXACT_ROWS
from thor_runtime.kernels.lowbit_fused import graph_key, rms_nodes
from thor_runtime.kernels.lowbit_ort import MIN_ROWS, NBitsWeight, as_rows, session

# GroupQueryAttention's CPU kernel takes head sizes in multiples of this (others: no graph)
HEAD_MULTIPLE = 16
# Rows per graph call (see ``StepGraph.__call__``); a multiple of EXACT_ROWS
CHUNK_ROWS = 128


def _layer_nodes(model, i: int, x: str, r: str, p: str) -> tuple[list, list]:
    """Layer i from x = RMSNorm(r) * attn_norm (r [M, D]: its residual input) to h{i} and, when
    a layer follows, x{i + 1}. The norms are ORT's fused RMSNorm ops, the residual adds inside
    them (SkipSimplifiedLayerNormalization also returns the sum), RoPE inside attention: ~20
    nodes a layer where the per-boundary graphs had ~50 (a node costs some microseconds)."""
    from onnx import helper, numpy_helper

    cfg, L = model.cfg, model.layers[i]
    H, Hkv, eps = cfg.num_heads, cfg.num_kv_heads, cfg.rms_eps
    last = i + 1 == cfg.num_layers
    n = lambda op, ins, outs, **kw: helper.make_node(op, ins, outs, **kw)  # noqa: E731
    ms = dict(domain="com.microsoft")
    qkv = f"{p}QKV" if L.bqkv is None else f"{p}QKV0"
    parts = [
        L.wqkv.nodes(x, qkv, f"{p}qkv_"),
        L.wo.nodes(f"{p}O", f"{p}PO", f"{p}o_"),
        L.w_gate_up.nodes(f"{p}X", f"{p}GU", f"{p}gu_"),
        L.w_down.nodes(f"{p}A", f"{p}PD", f"{p}d_"),
    ]
    inits = [numpy_helper.from_array(L.mlp_norm.float().numpy(), f"{p}mlp_norm")]
    nodes = [n("Unsqueeze", [f"{p}QKV", "axis0"], [f"{p}P"])]  # [1, M, (H + 2Hkv) Dh]
    if L.bqkv is not None:
        inits.append(numpy_helper.from_array(L.bqkv.float().numpy(), f"{p}bqkv"))
        nodes.append(n("Add", [qkv, f"{p}bqkv"], [f"{p}QKV"]))
    if L.q_norm is None:
        attn_in = [f"{p}P", "", ""]
    else:  # q/k RMSNorm per head before RoPE: q, k, v apart
        qn, kn = (
            rms_nodes(f"{p}Qh", f"{p}Qn", L.q_norm, eps, f"{p}qn_"),
            rms_nodes(f"{p}Kh", f"{p}Kn", L.k_norm, eps, f"{p}kn_"),
        )
        inits += qn[1] + kn[1]
        nodes += (
            [
                n("Split", [f"{p}P", "q_k_v"], [f"{p}Q", f"{p}K", f"{p}V"], axis=-1),
                n("Reshape", [f"{p}Q", "q_heads"], [f"{p}Qh"]),  # [1, M, H, Dh]
                n("Reshape", [f"{p}K", "k_heads"], [f"{p}Kh"]),
            ]
            + qn[0]
            + kn[0]
            + [  # [1, M, Hkv, Dh]
                n("Reshape", [f"{p}Qn", "q_flat"], [f"{p}Qf"]),  # [1, M, H Dh]
                n("Reshape", [f"{p}Kn", "k_flat"], [f"{p}Kf"]),
            ]
        )
        attn_in = [f"{p}Qf", f"{p}Kf", f"{p}V"]
    nodes += [
        n(
            "GroupQueryAttention",
            attn_in + [f"pk{i}", f"pv{i}", "seqlens", "total", "cos_cache", "sin_cache"],
            [f"{p}O3", f"ck{i}", f"cv{i}"],
            num_heads=H,
            kv_num_heads=Hkv,
            do_rotary=1,
            **ms,
        ),  # [1, M, H Dh]
        n("Squeeze", [f"{p}O3", "axis0"], [f"{p}O"]),  # [M, H Dh]
        n(
            "SkipSimplifiedLayerNormalization",
            [f"{p}PO", r, f"{p}mlp_norm"],
            [f"{p}X", "", "", f"{p}H2"],
            epsilon=eps,
            **ms,
        ),  # X, H2 = r + PO
        n("Split", [f"{p}GU", "split"], [f"{p}G", f"{p}U"], axis=-1),
        n("Sigmoid", [f"{p}G"], [f"{p}SG"]),
        n("Mul", [f"{p}G", f"{p}SG"], [f"{p}SiLU"]),
        n("Mul", [f"{p}SiLU", f"{p}U"], [f"{p}A"]),
    ]
    if last:
        nodes.append(n("Add", [f"{p}PD", f"{p}H2"], [f"h{i}"]))
    else:
        inits.append(
            numpy_helper.from_array(model.layers[i + 1].attn_norm.float().numpy(), f"{p}next_norm")
        )
        nodes.append(
            n(
                "SkipSimplifiedLayerNormalization",
                [f"{p}PD", f"{p}H2", f"{p}next_norm"],
                [f"x{i + 1}", "", "", f"h{i}"],
                epsilon=eps,
                **ms,
            )
        )
    return [x for ns, _ in parts for x in ns] + nodes, [t for _, ts in parts for t in ts] + inits


class StepGraph:
    """h [T, D] (embedded ids), positions start..start + T - 1, an fp32 KVCache -> the logits
    of the rows asked for and h after the layers asked for (taps), appending T keys and
    values per layer."""

    def __init__(self, model):
        from onnx import TensorProto, helper, numpy_helper

        cfg = model.cfg
        n, D, H, Hkv, Dh = (
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        Di = cfg.intermediate_size
        inits = [
            numpy_helper.from_array(np.array(v, np.int64), k)
            for k, v in (
                ("axis0", [0]),
                ("split", [Di, Di]),
                ("q_k_v", [H * Dh, Hkv * Dh, Hkv * Dh]),
                ("q_heads", [1, -1, H, Dh]),
                ("k_heads", [1, -1, Hkv, Dh]),
                ("q_flat", [1, -1, H * Dh]),
                ("k_flat", [1, -1, Hkv * Dh]),
            )
        ]
        nodes, its = rms_nodes("h_in", "x0", model.layers[0].attn_norm, cfg.rms_eps, "first_")
        inits += its
        for i in range(n):
            ns, its = _layer_nodes(model, i, f"x{i}", "h_in" if i == 0 else f"h{i - 1}", f"L{i}_")
            nodes, inits = nodes + ns, inits + its
        kv = (TensorProto.FLOAT, [1, Hkv, "S", Dh])
        table = (TensorProto.FLOAT, ["P", Dh // 2])
        inputs = {
            "h_in": D,
            "seqlens": (TensorProto.INT32, [1]),
            "total": (TensorProto.INT32, []),
            "cos_cache": table,
            "sin_cache": table,
        }
        outputs = {f"h{i}": D for i in range(n)}
        # The head, on the rows asked for ("rows" [R], R >= 2: a single row is asked twice,
        # for the same row-invariance as the layers). A head ORT cannot run stays in torch.
        self.head = isinstance(model.head_w, NBitsWeight)
        if self.head:
            inputs["rows"] = (TensorProto.INT64, ["R"])
            outputs["logits"] = (TensorProto.FLOAT, ["R", cfg.vocab_size])
            norm, head = (
                rms_nodes("hr", "xr", model.final_norm, cfg.rms_eps, "final_"),
                model.head_w.nodes("xr", "logits", "head_"),
            )
            nodes += (
                [helper.make_node("Gather", [f"h{n - 1}", "rows"], ["hr"], axis=0)]
                + norm[0]
                + head[0]
            )
            inits += norm[1] + head[1]
        for i in range(n):
            inputs |= {f"pk{i}": kv, f"pv{i}": kv}
            outputs |= {f"ck{i}": kv, f"cv{i}": kv}
        self.model, self.n, self.kv_shape = model, n, (Hkv, Dh)
        self.key = graph_key(model, "StepGraph" + ("+head" if self.head else ""))
        self.session = session([nodes], inits, inputs, outputs, torch.get_num_threads())
        self._bound = (None, None, {})  # (cache, its K/V storage pointers, {taps: IOBinding})
        self._one = threading.Lock()  # the binding above serves one call at a time
        self._tables = None  # (the model's cos table, cos half, sin half): RoPE for GQA

    def _outputs(self, taps: tuple[int, ...]) -> list[str]:
        return (
            ([f"h{i}" for i in taps] + ["logits"])
            if self.head
            else [f"h{i}" for i in sorted(set(taps) | {self.n - 1})]
        )

    def _binding(self, cache, taps: tuple[int, ...]):
        """The IOBinding with ``cache``'s K/V bound as every layer's past and present (made once
        per cache and set of outputs: binding per call would be ~120 binds)."""
        ptrs = (cache.k.data_ptr(), cache.v.data_ptr())
        if self._bound[0] is not cache or self._bound[1] != ptrs:
            self._bound = (cache, ptrs, {})
        if taps in self._bound[2]:
            return self._bound[2][taps]
        b = self.session.io_binding()
        Hkv, Dh = self.kv_shape
        S = cache.k.shape[2]  # the physical slots, spare included
        shape = [1, Hkv, S, Dh]
        for i in range(self.n):
            for t, past, present in ((cache.k, f"pk{i}", f"ck{i}"), (cache.v, f"pv{i}", f"cv{i}")):
                ptr = t[i].data_ptr()
                b.bind_input(past, "cpu", 0, np.float32, shape, ptr)
                b.bind_output(present, "cpu", 0, np.float32, shape, ptr)
        self._bound[2][taps] = b
        return b

    def fits(self, cache, T: int) -> bool:
        """This cache's K/V can be bound: fp32 storage with a slot for the padded row."""
        return (
            cache.store_dtype == torch.float32
            and cache.k.is_contiguous()
            and cache.v.is_contiguous()
            and cache.length + max(T, MIN_ROWS) <= cache.k.shape[2]
        )

    def __call__(
        self, h: torch.Tensor, cache, taps: tuple[int, ...] = (), rows: slice | None = slice(None)
    ):
        """h [T, D] -> ({i: h after layer i, [T, D]} for i in taps, logits [R, V] of h[rows] or
        None for rows=None). Appends to ``cache`` (all layers at one length; the positions
        follow it). A long input runs in calls of CHUNK_ROWS rows: in one call of 870 rows the
        graph's intermediates raised the peak RSS by ~250 MB, and chunks prefill as fast."""
        taps = tuple(taps)

        def run(s: int, e: int, want):
            with self._one:
                return self._run(h[s:e], cache, taps, want)

        return in_calls(run, h.shape[0], rows, CHUNK_ROWS, taps)

    def _run(self, h: torch.Tensor, cache, taps: tuple[int, ...], want: np.ndarray | None):
        T, start = h.shape[0], cache.length
        M = max(T, MIN_ROWS)
        b = self._binding(cache, taps)
        b.bind_cpu_input("h_in", as_rows(h))
        m = self.model
        m.ensure_positions(start + M)  # the padded row's position too
        if self._tables is None or self._tables[0] is not m.cos:  # the model grew its table
            half = m.cos.shape[-1] // 2
            self._tables = (
                m.cos,
                m.cos[:, :half].float().contiguous().numpy(),
                m.sin[:, :half].float().contiguous().numpy(),
            )
        b.bind_cpu_input("cos_cache", self._tables[1])
        b.bind_cpu_input("sin_cache", self._tables[2])
        b.bind_cpu_input("seqlens", np.array([start + M - 1], np.int32))
        b.bind_cpu_input("total", np.array(start + M, np.int32))
        if self.head:  # no logits wanted: the last row's, unread (the graph has one plan)
            r = np.array([T - 1]) if want is None else want
            b.bind_cpu_input("rows", np.concatenate([r] * MIN_ROWS) if len(r) < MIN_ROWS else r)
        names = self._outputs(taps)
        for name in names:  # rebound each call: ORT allocates them at this call's row count
            b.bind_output(name, "cpu")
        self.session.run_with_iobinding(b)
        cache.lengths = [start + T] * self.n
        outs = dict(zip(names, (o.numpy() for o in b.get_outputs()[2 * self.n :])))  # after the K/V
        hs = {i: torch.from_numpy(outs[f"h{i}"][:T]) for i in taps}
        if want is None:
            return hs, None
        if self.head:
            return hs, torch.from_numpy(outs["logits"][: len(want)])
        return hs, m.head(torch.from_numpy(outs[f"h{self.n - 1}"][:T])[torch.from_numpy(want)])


def in_calls(run, T: int, rows: slice | None, size: int, taps: tuple[int, ...]):
    """Rows 0..T-1 of a whole-forward kernel in calls of at most ``size``, in order:
    run(s, e, want) computes rows s..e-1, ``want`` the asked rows among them (indices from s;
    None: none) -> ({i: [e - s, D]} for taps, logits [len(want), V] or None). -> the same for
    all T rows."""
    want = None if rows is None else np.arange(T)[rows]  # row indices, ascending
    parts = []
    for s in range(0, T, size):
        e = min(T, s + size)
        w = None if want is None else want[(want >= s) & (want < e)] - s
        parts.append(run(s, e, w if w is not None and len(w) else None))
    if len(parts) == 1:
        return parts[0]
    return (
        {i: torch.cat([p[0][i] for p in parts]) for i in taps},
        None if want is None else torch.cat([p[1] for p in parts if p[1] is not None]),
    )


def rows_invariant(g, cfg, rows: int) -> bool:
    """The probe of a whole-forward kernel g (StepGraph's call): ``rows`` random rows after a
    3-row start, each alone and then the first m of them together for every m in 2..rows;
    every layer's output, the logits and every cached key and value must be the same bits."""
    from thor_runtime.cache.kv_cache import KVCache

    taps = tuple(range(cfg.num_layers))
    h = torch.randn(
        3 + rows, cfg.hidden_size, generator=torch.Generator().manual_seed(0)
    )  # [3 + R, D]
    cache = KVCache(cfg, 3 + rows, "fp32", torch.float32)
    g(h[:3], cache, rows=None)

    def run(a: int, b: int) -> list[torch.Tensor]:  # rows a..b-1: every layer's h, the logits
        hs, logits = g(h[a:b], cache, taps)
        return [hs[i] for i in taps] + [logits]

    alone = [torch.cat(x) for x in zip(*(run(3 + r, 4 + r) for r in range(rows)))]
    kv = (cache.k[:, :, : 3 + rows].clone(), cache.v[:, :, : 3 + rows].clone())

    def same(m: int) -> bool:
        cache.crop(3)
        return (
            all(torch.equal(a[:m], b) for a, b in zip(alone, run(3, 3 + m)))
            and torch.equal(kv[0][:, :, : 3 + m], cache.k[:, :, : 3 + m])
            and torch.equal(kv[1][:, :, : 3 + m], cache.v[:, :, : 3 + m])
        )

    return all(same(m) for m in range(2, rows + 1))


def step_graph(model, verdict: dict[str, bool]) -> StepGraph | None:
    """The model's step graph, or None when its rows are not row-invariant here (then the
    per-boundary graphs run). verdict: as in make_rows_exact (kept per CPU environment)."""

    if model.cfg.head_dim % HEAD_MULTIPLE:
        return None
    g = StepGraph(model)
    if g.key not in verdict:
        verdict[g.key] = rows_invariant(g, model.cfg, EXACT_ROWS)
    return g if verdict[g.key] else None
