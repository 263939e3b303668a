"""One ONNX Runtime call between two attentions, for models whose projections run on
MatMulNBits (lowbit_ort.py).

The graph for boundary i -> i + 1 does what ``post_attn(i)`` and the projection half of
``pre_attn(i + 1)`` do: out projection + residual, RMSNorm, gate/up, SiLU(gate) * up, down +
residual, RMSNorm, q/k/v (+ bias). Head reshapes, q/k norms, RoPE and attention stay in
torch. At decode's single row a step is mostly call overhead outside the projections: this
is one call where there were four projection calls and some twenty small torch ops.

The graph's rows are independent of each other, and a single row is padded to two (see
lowbit_ort), so the model probes it like a projection kernel and uses it only where each row
gets the bits it gets alone.
"""
from __future__ import annotations

import numpy as np
import torch

from .lowbit_ort import NBitsWeight, as_rows, session


def _rms_nodes(x: str, y: str, w: torch.Tensor, eps: float, prefix: str) -> tuple[list, list]:
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis, in fp32 as ``rms_norm``."""
    from onnx import helper, numpy_helper

    inits = [numpy_helper.from_array(w.float().numpy(), f"{prefix}w"),
             numpy_helper.from_array(np.array(eps, np.float32), f"{prefix}eps"),
             numpy_helper.from_array(np.array([-1], np.int64), f"{prefix}ax")]
    n = lambda op, ins, out, **kw: helper.make_node(op, ins, [out], **kw)  # noqa: E731
    nodes = [n("Mul", [x, x], f"{prefix}sq"),
             n("ReduceMean", [f"{prefix}sq", f"{prefix}ax"], f"{prefix}ms", keepdims=1),   # [M, 1]
             n("Add", [f"{prefix}ms", f"{prefix}eps"], f"{prefix}var"),
             n("Sqrt", [f"{prefix}var"], f"{prefix}sd"),
             n("Div", [x, f"{prefix}sd"], f"{prefix}xn"),
             n("Mul", [f"{prefix}xn", f"{prefix}w"], y)]
    return nodes, inits


class FusedPostPre:
    """(h [..., D], o [..., H Dh]) -> (next h [..., D], qkv of layer i + 1 [..., (H + 2 Hkv) Dh])."""

    def __init__(self, model, i: int):
        from onnx import helper, numpy_helper

        cfg, L, nxt = model.cfg, model.layers[i], model.layers[i + 1]
        eps, I = cfg.rms_eps, cfg.intermediate_size
        parts = [L.wo.nodes("O", "PO", "o_"),
                 _rms_nodes("H2", "X", L.mlp_norm, eps, "n1_"),
                 L.w_gate_up.nodes("X", "GU", "gu_"),
                 L.w_down.nodes("A", "PD", "d_"),
                 _rms_nodes("h", "X2", nxt.attn_norm, eps, "n2_"),
                 nxt.wqkv.nodes("X2", "QKV" if nxt.bqkv is None else "QKV0", "qkv_")]
        nodes = [ns for ns, _ in parts]
        inits = [t for _, ts in parts for t in ts] + [numpy_helper.from_array(np.array([I, I], np.int64), "split")]
        nodes.append([helper.make_node("Add", ["H", "PO"], ["H2"]),
                      helper.make_node("Split", ["GU", "split"], ["G", "U"], axis=-1),
                      helper.make_node("Sigmoid", ["G"], ["SG"]),
                      helper.make_node("Mul", ["G", "SG"], ["SiLU"]),
                      helper.make_node("Mul", ["SiLU", "U"], ["A"]),
                      helper.make_node("Add", ["H2", "PD"], ["h"])])
        if nxt.bqkv is not None:
            inits.append(numpy_helper.from_array(nxt.bqkv.float().numpy(), "bqkv"))
            nodes.append([helper.make_node("Add", ["QKV0", "bqkv"], ["QKV"])])
        D, Dh = cfg.hidden_size, cfg.head_dim
        self.key = f"FusedPostPre{(D, cfg.num_heads, cfg.num_kv_heads, Dh, I, nxt.bqkv is not None)}"
        self.session = session(nodes, inits, {"H": D, "O": cfg.num_heads * Dh},
                               {"h": D, "QKV": (cfg.num_heads + 2 * cfg.num_kv_heads) * Dh}, torch.get_num_threads())

    def __call__(self, h: torch.Tensor, o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lead = h.shape[:-1]
        m = lead.numel()
        h2, qkv = self.session.run(None, {"H": as_rows(h), "O": as_rows(o)})
        return (torch.from_numpy(h2[:m]).view(*lead, -1).to(h.dtype),
                torch.from_numpy(qkv[:m]).view(*lead, -1).to(h.dtype))


def fusable(model, i: int) -> bool:
    L, nxt = model.layers[i], model.layers[i + 1]
    return all(isinstance(w, NBitsWeight) for w in (L.wo, L.w_gate_up, L.w_down, nxt.wqkv))


def fuse_layers(model, verdict: dict[str, bool]) -> list[FusedPostPre] | None:
    """The fused graphs for every boundary, or None when one cannot be fused or its rows are
    not row-invariant here (then the per-projection path runs, with its own probes).
    verdict: as in make_rows_exact (kept by the weight cache per CPU environment)."""
    from .model import EXACT_ROWS

    n = model.cfg.num_layers
    if n < 2 or not all(fusable(model, i) for i in range(n - 1)):
        return None
    first = FusedPostPre(model, 0)      # probed before the other n - 2 graphs are built
    if first.key not in verdict:
        cfg, g = model.cfg, torch.Generator().manual_seed(0)
        h = torch.randn(EXACT_ROWS, cfg.hidden_size, generator=g)                      # [R, D]
        o = torch.randn(EXACT_ROWS, cfg.num_heads * cfg.head_dim, generator=g)         # [R, H Dh]
        alone = [torch.cat(t) for t in zip(*(first(h[r:r + 1], o[r:r + 1]) for r in range(EXACT_ROWS)))]
        verdict[first.key] = all(torch.equal(a[:m], b) for m in range(2, EXACT_ROWS + 1)
                                 for a, b in zip(alone, first(h[:m], o[:m])))
    if not verdict[first.key]:
        return None
    return [first] + [FusedPostPre(model, i) for i in range(1, n - 1)]


def prepare_sessions(model) -> None:
    """Build, at load, every projection session a forward will call outside the fused graphs
    (the first layer's q/k/v, the last layer's MLP, the head), then hand the heap memory that
    building them freed back to the OS: glibc keeps freed blocks of this size (the serialized
    graphs, tens of MB for the head) in its heap, where they would count as resident for the
    life of the process."""
    n = model.cfg.num_layers
    layers = range(n) if model.fused is None else (0, n - 1)
    for w in [getattr(model.layers[i], f) for i in layers for f in ("wqkv", "wo", "w_gate_up", "w_down")] + \
            [model.head_w]:
        if isinstance(w, NBitsWeight):
            w.session
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to hand back this way
        pass
