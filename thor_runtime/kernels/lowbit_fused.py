"""One ONNX Runtime call between two attentions, for models whose projections run on
MatMulNBits (lowbit_ort.py).

The graph for boundary i -> i + 1 does what ``post_attn(i)`` and the projection half of
``pre_attn(i + 1)`` do: out projection + residual, RMSNorm, gate/up, SiLU(gate) * up, down +
residual, RMSNorm, q/k/v (+ bias), and the rest of ``heads(i + 1)``: the head split, q/k norms
and RoPE (the rows of cos/sin are inputs). Attention stays in torch: it owns the KV cache. At
decode's single row a step is mostly call overhead outside the projections: this is one call
where there were four projection calls and some thirty small torch ops.

The graph's rows are independent of each other, and a single row is padded to two (see
lowbit_ort), so the model probes it like a projection kernel and uses it only where each row
gets the bits it gets alone.
"""

from __future__ import annotations

import numpy as np
import torch

from thor_runtime.engine.exactness import EXACT_ROWS
from thor_runtime.kernels.lowbit_ort import NBitsWeight, as_rows, session


def rms_nodes(x: str, y: str, w: torch.Tensor, eps: float, prefix: str) -> tuple[list, list]:
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis (fp32), as one ORT node."""
    from onnx import helper, numpy_helper

    return (
        [
            helper.make_node(
                "SimplifiedLayerNormalization", [x, f"{prefix}w"], [y], epsilon=eps, axis=-1
            )
        ],
        [numpy_helper.from_array(w.float().numpy(), f"{prefix}w")],
    )


def _rope_nodes(
    x: str, y: str, heads: int, dh: int, norm: torch.Tensor | None, eps: float, prefix: str
) -> tuple[list, list]:
    """y [M, heads, Dh] = RoPE(x [M, heads, Dh]) per head (after the head's RMSNorm when ``norm``).
    Rotate-half as ``apply_rope``, x * cos + rot(x) * sin with rot(x) = (-x2, x1), written as
    x * cos + swap(x) * sinS where swap(x) = (x2, x1) and sinS = (-sin1, sin2) (graph inputs
    cosU/sinU [M, 1, Dh]): a sign flip commutes with rounding, so the bits are the same, with
    no Neg node."""
    from onnx import helper, numpy_helper

    n = lambda op, ins, out, **kw: helper.make_node(op, ins, [out], **kw)  # noqa: E731
    inits = [numpy_helper.from_array(np.array([dh // 2, dh // 2], np.int64), f"{prefix}halves")]
    nodes = []
    if norm is not None:
        nodes, its = rms_nodes(x, f"{prefix}xn", norm, eps, f"{prefix}norm_")
        inits, x = inits + its, f"{prefix}xn"
    # (a Gather with a swap index is one node fewer, but ORT's runs ~5x slower than these two)
    nodes += [
        helper.make_node("Split", [x, f"{prefix}halves"], [f"{prefix}x1", f"{prefix}x2"], axis=-1),
        n("Concat", [f"{prefix}x2", f"{prefix}x1"], f"{prefix}sw", axis=-1),
        n("Mul", [x, "cosU"], f"{prefix}a"),
        n("Mul", [f"{prefix}sw", "sinU"], f"{prefix}b"),
        n("Add", [f"{prefix}a", f"{prefix}b"], y),
    ]
    return nodes, inits


def shared_nodes(cfg) -> tuple[list, list]:
    """What the layer nodes below share in one graph: the split sizes and the RoPE rows
    cosU/sinU [M, 1, Dh] from the graph inputs cos/sin [M, Dh]."""
    from onnx import helper, numpy_helper

    H, Hkv, Dh, Di = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), k)
        for k, v in (
            ("split", [Di, Di]),
            ("qk_v", [H + Hkv, Hkv]),
            ("q_k", [H, Hkv]),
            ("q_k_v", [H, Hkv, Hkv]),
            ("heads3", [0, H + 2 * Hkv, Dh]),
            ("axis1", [1]),
            ("rows", [0, -1]),
        )
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["cos", "axis1"], ["cosU"]),  # [M, 1, Dh]
        helper.make_node("Unsqueeze", ["sin", "axis1"], ["sinU"]),
    ]
    return nodes, inits


def post_nodes(model, i: int, h: str, o: str, out: str, p: str) -> tuple[list, list]:
    """``post_attn(i)``: out = h + o @ wo^T, then out += MLP(RMSNorm(out)) (names under ``p``)."""
    from onnx import helper

    L, eps = model.layers[i], model.cfg.rms_eps
    parts = [
        L.wo.nodes(o, f"{p}PO", f"{p}o_"),
        rms_nodes(f"{p}H2", f"{p}X", L.mlp_norm, eps, f"{p}n1_"),
        L.w_gate_up.nodes(f"{p}X", f"{p}GU", f"{p}gu_"),
        L.w_down.nodes(f"{p}A", f"{p}PD", f"{p}d_"),
    ]
    n = lambda op, ins, outs, **kw: helper.make_node(op, ins, outs, **kw)  # noqa: E731
    glue = [
        n("Add", [h, f"{p}PO"], [f"{p}H2"]),
        n("Split", [f"{p}GU", "split"], [f"{p}G", f"{p}U"], axis=-1),
        n("Sigmoid", [f"{p}G"], [f"{p}SG"]),
        n("Mul", [f"{p}G", f"{p}SG"], [f"{p}SiLU"]),
        n("Mul", [f"{p}SiLU", f"{p}U"], [f"{p}A"]),
        n("Add", [f"{p}H2", f"{p}PD"], [out]),
    ]
    return [x for ns, _ in parts for x in ns] + glue, [t for _, ts in parts for t in ts]


def pre_nodes(model, j: int, h: str, out: str, p: str) -> tuple[list, list]:
    """``pre_attn(j)`` up to the head split: out [M, (H + 2Hkv) Dh] = q, k, v of layer j with
    q/k normed (when the model has those norms) and rotated, row by row."""
    from onnx import helper, numpy_helper

    cfg, L, eps = model.cfg, model.layers[j], model.cfg.rms_eps
    H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qkv = f"{p}QKV" if L.bqkv is None else f"{p}QKV0"
    parts = [
        rms_nodes(h, f"{p}X2", L.attn_norm, eps, f"{p}n2_"),
        L.wqkv.nodes(f"{p}X2", qkv, f"{p}qkv_"),
    ]
    if L.bqkv is not None:
        parts.append(
            (
                [helper.make_node("Add", [qkv, f"{p}bqkv"], [f"{p}QKV"])],
                [numpy_helper.from_array(L.bqkv.float().numpy(), f"{p}bqkv")],
            )
        )
    parts.append(
        ([helper.make_node("Reshape", [f"{p}QKV", "heads3"], [f"{p}QKV3"])], [])
    )  # [M, H + 2Hkv, Dh]
    if L.q_norm is None:  # q and k heads rotate as one block
        parts += [
            ([helper.make_node("Split", [f"{p}QKV3", "qk_v"], [f"{p}QK3", f"{p}V3"], axis=1)], []),
            _rope_nodes(f"{p}QK3", f"{p}QKr3", H + Hkv, Dh, None, eps, f"{p}qk_"),
            ([helper.make_node("Split", [f"{p}QKr3", "q_k"], [f"{p}Q3", f"{p}K3"], axis=1)], []),
        ]
    else:
        parts += [
            (
                [
                    helper.make_node(
                        "Split", [f"{p}QKV3", "q_k_v"], [f"{p}Qn3", f"{p}Kn3", f"{p}V3"], axis=1
                    )
                ],
                [],
            ),
            _rope_nodes(f"{p}Qn3", f"{p}Q3", H, Dh, L.q_norm, eps, f"{p}q_"),
            _rope_nodes(f"{p}Kn3", f"{p}K3", Hkv, Dh, L.k_norm, eps, f"{p}k_"),
        ]
    parts.append(
        (
            [
                helper.make_node("Concat", [f"{p}Q3", f"{p}K3", f"{p}V3"], [f"{p}QKVr3"], axis=1),
                helper.make_node("Reshape", [f"{p}QKVr3", "rows"], [out]),
            ],
            [],
        )
    )
    return [x for ns, _ in parts for x in ns], [t for _, ts in parts for t in ts]


def graph_key(model, name: str) -> str:
    """What a probe verdict for a graph of this model's shapes is kept under."""
    cfg, L = model.cfg, model.layers[-1]
    shapes = (
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        L.bqkv is not None,
    )
    return f"{name}{shapes}+rope{'+qknorm' if L.q_norm is not None else ''}"


class FusedPostPre:
    """(h [T, D], o [T, H Dh], cos/sin rows) -> (next h [T, D], q [H, T, Dh], k/v [Hkv, T, Dh]) of
    layer i + 1, q/k normed (when the model has those norms) and rotated: what ``post_pre`` returns.
    RoPE and the head split run in the graph because at one row they were ~15 small torch ops
    per layer (~0.1 ms each, more than the graph's own elementwise work)."""

    def __init__(self, model, i: int):
        cfg = model.cfg
        H, Hkv, Dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        parts = [
            shared_nodes(cfg),
            post_nodes(model, i, "H", "O", "h", ""),
            pre_nodes(model, i + 1, "h", "QKVr", ""),
        ]
        self.heads = (H, Hkv, Dh)
        self.key = graph_key(model, "FusedPostPre")
        self.session = session(
            [ns for ns, _ in parts],
            [t for _, ts in parts for t in ts],
            {"H": cfg.hidden_size, "O": H * Dh, "cos": Dh, "sin": Dh},
            {"h": cfg.hidden_size, "QKVr": (H + 2 * Hkv) * Dh},
            torch.get_num_threads(),
        )

    def __call__(self, h: torch.Tensor, o: torch.Tensor, cos: np.ndarray, sin: np.ndarray):
        """cos/sin: the rows of the positions, as ``as_rows`` gives them ([max(T, 2), Dh]); sin with
        its first half negated (see _rope_nodes)."""
        T = h.shape[0]
        H, Hkv, Dh = self.heads
        h2, qkv = self.session.run(None, {"H": as_rows(h), "O": as_rows(o), "cos": cos, "sin": sin})
        x = qkv[:T].reshape(T, -1, Dh).transpose(1, 0, 2)  # [H + 2Hkv, T, Dh] (views)
        return (
            torch.from_numpy(h2[:T]),
            torch.from_numpy(x[:H]),
            torch.from_numpy(x[H : H + Hkv]),
            torch.from_numpy(x[H + Hkv :]),
        )


class FusedLayers(list):
    """The graphs of every layer boundary (index i: after layer i), and the RoPE rows of the
    forward that is running: gathered and padded once for all its layers."""

    def __init__(self, graphs: list[FusedPostPre]):
        super().__init__(graphs)
        self._rows = None  # (pos, cos table, cos rows, sin rows)

    def post_pre(
        self,
        i: int,
        h: torch.Tensor,
        o: torch.Tensor,
        pos: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ):
        """As ``TargetModel.post_pre`` (h [T, D], o [T, H Dh], pos [T]; cos/sin: the model's tables
        [S, Dh]). A forward passes the same ``pos`` object to all its layers: that identity (and
        the table's) keys the gathered rows, and the reference held here keeps it unique."""
        r = self._rows
        if r is None or r[0] is not pos or r[1] is not cos:
            s = sin[pos]  # [T, Dh] (a copy)
            s[..., : s.shape[-1] // 2].neg_()  # _rope_nodes' sinS
            r = self._rows = (pos, cos, as_rows(cos[pos]), as_rows(s))
        return self[i](h, o, r[2], r[3])


def fusable(model, i: int) -> bool:
    L, nxt = model.layers[i], model.layers[i + 1]
    return all(isinstance(w, NBitsWeight) for w in (L.wo, L.w_gate_up, L.w_down, nxt.wqkv))


def fuse_layers(model, verdict: dict[str, bool]) -> FusedLayers | None:
    """The fused graphs for every boundary, or None when one cannot be fused or its rows are
    not row-invariant here (then the per-projection path runs, with its own probes).
    verdict: as in make_rows_exact (kept by the weight cache per CPU environment)."""

    n = model.cfg.num_layers
    if n < 2 or not all(fusable(model, i) for i in range(n - 1)):
        return None
    first = FusedPostPre(model, 0)  # probed before the other n - 2 graphs are built
    if first.key not in verdict:
        cfg, g = model.cfg, torch.Generator().manual_seed(0)
        h = torch.randn(EXACT_ROWS, cfg.hidden_size, generator=g)  # [R, D]
        o = torch.randn(EXACT_ROWS, cfg.num_heads * cfg.head_dim, generator=g)  # [R, H Dh]
        cs = torch.randn(2, EXACT_ROWS, cfg.head_dim, generator=g)  # cos, sinS [R, Dh]

        def run(a, b):  # rows a..b-1 -> h [T, D], then q/k/v as [T, n Dh]
            h2, *qkv = first(h[a:b], o[a:b], as_rows(cs[0, a:b]), as_rows(cs[1, a:b]))
            return [h2] + [x.transpose(0, 1).reshape(b - a, -1) for x in qkv]

        alone = [torch.cat(t) for t in zip(*(run(r, r + 1) for r in range(EXACT_ROWS)))]
        verdict[first.key] = all(
            torch.equal(a[:m], b)
            for m in range(2, EXACT_ROWS + 1)
            for a, b in zip(alone, run(0, m))
        )
    if not verdict[first.key]:
        return None
    return FusedLayers([first] + [FusedPostPre(model, i) for i in range(1, n - 1)])


def prepare_sessions(model, kernels) -> None:
    """Build, at load, every projection session a forward will call outside the fused graphs
    (the first layer's q/k/v, the last layer's MLP, the head), then hand back what ORT now
    holds its own copy of: the pages of memory-mapped weights that only ORT reads
    (mapped_pages.py; every projection of the model is in a session, a fused graph or the step
    graph by now) and the heap memory that
    building the sessions freed: glibc keeps freed blocks of this size (the serialized graphs,
    tens of MB for the head) in its heap, where they would count as resident for the life of
    the process. kernels: the runner's (runner.py): its step graph, fused graphs and row kernel."""
    from thor_runtime.kernels.mapped_pages import release_pages

    n = model.cfg.num_layers
    step, fused = kernels.built_step, kernels.fused
    layers = () if step is not None else range(n) if fused is None else (0, n - 1)
    head = [] if step is not None and step.head else [model.head_w]
    for w in [
        getattr(model.layers[i], f) for i in layers for f in ("wqkv", "wo", "w_gate_up", "w_down")
    ] + head:
        if isinstance(w, NBitsWeight):
            w.session
    # the row kernel (rowstep.py) reads blobs and scales where they are, unless its build keeps
    # a regrouped copy: only what ORT alone reads is handed back then (Q4_1's corrections: the
    # kernel has its minima apart)
    alone = None if kernels.rows is None or kernels.rows.group else {"corr"}
    release_pages(
        [
            t
            for w in ort_weights(model, kernels)
            for k, t in w.tensors().items()
            if alone is None or k in alone
        ]
    )
    _trim_heap()


def release_copied(model) -> None:
    """Hand back the mapped pages of every MatMulNBits weight once a regrouping row kernel
    holds its own copy of them: read once to regroup, then only by rare paths (a session or
    graph built on first use, dequantize), which fault them in again."""
    from thor_runtime.kernels.mapped_pages import release_pages

    weights = [model.head_w] + [
        getattr(L, f) for L in model.layers for f in ("wqkv", "wo", "w_gate_up", "w_down")
    ]
    weights = [getattr(w, "w", w) for w in weights]  # a RowLoop's own weight
    release_pages([t for w in weights if isinstance(w, NBitsWeight) for t in w.tensors().values()])
    _trim_heap()


def _trim_heap() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        pass


def ort_weights(model, kernels) -> list[NBitsWeight]:
    """The model's MatMulNBits weights whose bytes ORT holds (in their own session, a fused
    graph or the step graph); a weight wrapped for row-exactness (RowLoop) builds its session on
    first use."""
    n = model.cfg.num_layers
    fused = (
        set()
        if kernels.fused is None
        else {(i, f) for i in range(n - 1) for f in ("wo", "w_gate_up", "w_down")}
        | {(i, "wqkv") for i in range(1, n)}
    )
    step = kernels.built_step
    if step is not None:
        fused = {(i, f) for i in range(n) for f in ("wqkv", "wo", "w_gate_up", "w_down")}
    in_step = step is not None and step.head
    out = [
        w
        for w in [model.head_w]
        if isinstance(w, NBitsWeight) and (w._session is not None or in_step)
    ]
    for i, L in enumerate(model.layers):
        for f in ("wqkv", "wo", "w_gate_up", "w_down"):
            w = getattr(L, f)
            if isinstance(w, NBitsWeight) and (w._session is not None or (i, f) in fused):
                out.append(w)
    return out
