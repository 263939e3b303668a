"""Exact verifies: what makes a verify row carry the bits of a 1-row step at its position.

A projection whose kernel gives a row different bits by row count runs row by row (RowLoop);
a segment backend (ONNX Runtime, TensorRT) that does the same is called row by row (RowWise).
Which ones need it is probed once per kernel and shape (``rows_invariant``).
"""

from __future__ import annotations

import torch

from thor_runtime.kernels.projections import linear

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
        x2 = x.reshape(-1, x.shape[-1])  # [M, in]
        if not 1 < x2.shape[0] <= EXACT_ROWS:
            return linear(x, self.w)
        return torch.cat([linear(x2[i : i + 1], self.w) for i in range(x2.shape[0])]).view(
            *x.shape[:-1], -1
        )


def make_rows_exact(
    model, names: tuple[str, ...], verdict: dict[str, bool] | None = None
) -> list[str]:
    """Wrap every projection (``names`` of each of ``model.layers``, and ``model.head_w``) whose
    kernel is not row-invariant here in a RowLoop, one probe per distinct kernel and shape.
    verdict: earlier probes' results (kernel/shape key -> bool), used and filled in; valid only
    for the same torch, CPU capability, thread count and dtype (the weight cache keys them so).
    -> the names of the wrapped projections."""
    verdict = {} if verdict is None else verdict

    def exact(w) -> bool:
        key = (
            f"{type(w).__name__}{tuple(w.shape)}"
            f"{'+dense' if getattr(w, 'dense', None) is not None else ''}"
        )
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


def rows_invariant(w, d_in: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``linear(x, w)`` gives each of 2..EXACT_ROWS rows the very bits it gives that row
    alone, on this CPU, with this kernel, shape and thread count. A GEMM computes every row
    with the same instruction sequence, so one seeded probe per kernel and shape decides."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(EXACT_ROWS, d_in, generator=g).to(device=device, dtype=dtype)  # [R, in]
    alone = torch.cat([linear(x[i : i + 1], w) for i in range(EXACT_ROWS)])  # [R, out]
    return all(torch.equal(linear(x[:m], w), alone[:m]) for m in range(2, EXACT_ROWS + 1))


class RowWise:
    """A segment backend (ONNX Runtime, TensorRT) called one row at a time: each call is the
    very call a 1-row step makes, so ``verify`` stays exact on a backend whose kernels give a
    row different bits depending on the row count."""

    def __init__(self, backend):
        self.b = backend

    def embed(self, ids):
        return self.b.embed(ids)  # a gather: the same bits for any row count

    def pre_attn(self, i, h, pos):
        rows = [self.b.pre_attn(i, h[t : t + 1], pos[t : t + 1]) for t in range(h.shape[0])]
        return tuple(
            torch.cat(parts, dim=-2) for parts in zip(*rows)
        )  # q [H, T, Dh], k/v [Hkv, T, Dh]

    def post_attn(self, i, h, o):
        return torch.cat(
            [self.b.post_attn(i, h[t : t + 1], o[t : t + 1]) for t in range(h.shape[0])]
        )

    def post_pre(self, i, h, o, pos):
        rows = [
            self.b.post_pre(i, h[t : t + 1], o[t : t + 1], pos[t : t + 1])
            for t in range(h.shape[0])
        ]
        hs, *qkv = zip(*rows)
        return (torch.cat(hs), *(torch.cat(parts, dim=-2) for parts in qkv))

    def head(self, h):
        return torch.cat([self.b.head(h[t : t + 1]) for t in range(h.shape[0])])


def backend_for_verify(model, backend):
    """``backend`` itself if its dense segments give each of 2..EXACT_ROWS rows the bits that row
    gets alone (probed on seeded inputs through the segments a verify calls), else RowWise."""
    cfg, R = model.cfg, EXACT_ROWS
    g = torch.Generator().manual_seed(0)
    h = torch.randn(R, cfg.hidden_size, generator=g).to(model.dtype)
    o = torch.randn(R, cfg.num_heads * cfg.head_dim, generator=g).to(model.dtype)
    pos = torch.arange(R)
    rw = RowWise(backend)
    last = cfg.num_layers - 1  # a fused backend has post_attn for the last layer only
    calls = [
        lambda b, m: b.pre_attn(0, h[:m], pos[:m]),
        lambda b, m: (b.post_attn(last, h[:m], o[:m]),),
        lambda b, m: (b.head(h[:m]),),
    ]
    if cfg.num_layers > 1:
        calls.append(lambda b, m: b.post_pre(0, h[:m], o[:m], pos[:m]))
    for call in calls:
        alone = call(rw, R)
        for m in range(2, R + 1):
            got = call(backend, m)
            if not all(
                torch.equal(x, y[..., :m, :] if y.dim() == 3 else y[:m]) for x, y in zip(got, alone)
            ):
                return rw
    return backend
