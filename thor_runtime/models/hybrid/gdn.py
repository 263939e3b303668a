"""Gated DeltaNet token mixer: short causal depthwise conv + gated delta rule.

Per value head the recurrent state S [dk, dv] evolves, for each token t, as

    S <- exp(g_t) * S                      g_t = -exp(A_log) * softplus(a_t + dt_bias)  (<= 0)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T  beta_t = sigmoid(b_t)
    o_t = S^T q_t                           q, k L2-normalized, q scaled by dk^-1/2

where q, k, v come out of a depthwise causal conv (kernel ``k``, SiLU) over the projected
rows. Two forms compute it:

* ``step``: one token, the recurrent form. Decode runs it once; a verify over K+1 rows runs
  it once per row and leaves the state after every row in a checkpoint slot. Every op of a
  row works on tensors of that row's shape only (transcendentals included), so a row of a
  verify and a 1-row decode step given the same inputs produce bit-identical states.
* ``chunked``: the parallel (WY / UT-transform) form for prefill: within a chunk of C tokens
  the delta-rule updates become triangular solves and matmuls; only the chunk boundaries are
  sequential. It returns the final state only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk of the parallel form


@dataclass
class GDNWeights:
    """The state-touching parameters of one GDN layer (fp32)."""

    conv_w: torch.Tensor  # [C, k] depthwise taps, C = 2 Kd + Vd (q, k, v channels)
    neg_A: torch.Tensor  # [Hv]   -exp(A_log)
    dt_bias: torch.Tensor  # [Hv]
    num_k_heads: int
    num_v_heads: int
    dk: int
    dv: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.dk


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _conv(w: GDNWeights, win: torch.Tensor, T: int) -> torch.Tensor:
    """win [k-1+T, C] (conv state then the new rows) -> SiLU(conv) [T, C]. Elementwise
    multiply-adds only, so each output row is exact whatever T is."""
    k = w.conv_w.shape[1]
    acc = win[0:T] * w.conv_w[:, 0]
    for i in range(1, k):
        acc = acc + win[i : i + T] * w.conv_w[:, i]
    return acc  # [T, C] (SiLU applied by caller)


def _split_qkv(w: GDNWeights, x: torch.Tensor):
    """x [..., C] after the conv -> q, k [..., Hv, dk] (key heads repeated per value head),
    v [..., Hv, dv]; q and k L2-normalized, q scaled."""
    lead = x.shape[:-1]
    q, k, v = x.split([w.key_dim, w.key_dim, w.num_v_heads * w.dv], dim=-1)
    q = q.reshape(*lead, w.num_k_heads, w.dk)
    k = k.reshape(*lead, w.num_k_heads, w.dk)
    r = w.num_v_heads // w.num_k_heads
    if r > 1:  # value head h reads key head h // r
        q, k = q.repeat_interleave(r, dim=-2), k.repeat_interleave(r, dim=-2)
    q = l2norm(q) * (w.dk**-0.5)
    return q, l2norm(k), v.reshape(*lead, w.num_v_heads, w.dv)


def step(
    w: GDNWeights,
    win: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    s_in: torch.Tensor,
    s_out: torch.Tensor,
) -> torch.Tensor:
    """One token. win [k, C] fp32 (conv state + this row), b/a [Hv] fp32, s_in [Hv, dk, dv]
    (read first), s_out [Hv, dk, dv] (written; may be s_in). -> o [Hv, dv]."""
    x = F.silu(_conv(w, win, 1)[0])  # [C]
    q, k, v = _split_qkv(w, x)  # [Hv, dk], [Hv, dk], [Hv, dv]
    beta = torch.sigmoid(b)  # [Hv]
    decay = torch.exp(w.neg_A * F.softplus(a + w.dt_bias))  # [Hv]
    torch.mul(s_in, decay[:, None, None], out=s_out)
    kv_mem = torch.bmm(k[:, None, :], s_out)[:, 0]  # [Hv, dv] what S predicts for k
    delta = (v - kv_mem) * beta[:, None]  # [Hv, dv]
    s_out.add_(k[:, :, None] * delta[:, None, :])
    return torch.bmm(q[:, None, :], s_out)[:, 0]  # [Hv, dv]


def chunked(w: GDNWeights, win: torch.Tensor, b: torch.Tensor, a: torch.Tensor, s0: torch.Tensor):
    """All rows at once. win [k-1+T, C], b/a [T, Hv], s0 [Hv, dk, dv]
    -> (o [T, Hv, dv], final state [Hv, dk, dv])."""
    T = b.shape[0]
    x = F.silu(_conv(w, win, T))  # [T, C]
    q, k, v = _split_qkv(w, x)  # [T, Hv, d]
    beta = torch.sigmoid(b)  # [T, Hv]
    g = w.neg_A * F.softplus(a + w.dt_bias)  # [T, Hv] log decay
    C = CHUNK
    pad = (-T) % C
    n = (T + pad) // C

    def heads_first(t):  # [T, Hv, ...] -> [Hv, n, C, ...], zero-padded rows at the end
        t = t.transpose(0, 1)
        t = F.pad(t, (0, 0, 0, pad)) if t.dim() == 3 else F.pad(t, (0, pad))
        return t.reshape(t.shape[0], n, C, *t.shape[2:])

    q, k, v, beta, g = (heads_first(t) for t in (q, k, v, beta, g))
    G = g.cumsum(-1)  # [Hv, n, C] log decay from chunk start
    causal = torch.ones(C, C, dtype=torch.bool, device=win.device).tril()
    # decay between rows s <= t of a chunk (masked above the diagonal before exp: no overflow)
    D = (
        (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    )  # [Hv, n, C, C]
    kb = k * beta[..., None]  # [Hv, n, C, dk]
    # (I + A) U = beta V - beta exp(G) K S0, A strictly lower: A[t, s] = beta_t e^{G_t-G_s} k_t.k_s
    A = (kb @ k.transpose(-1, -2)) * D
    A = A.masked_fill(~causal.tril(-1), 0.0)
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    U0 = torch.linalg.solve_triangular(
        eye + A, v * beta[..., None], upper=False, unitriangular=True
    )
    W = torch.linalg.solve_triangular(
        eye + A, kb * G.exp()[..., None], upper=False, unitriangular=True
    )
    QK = (q @ k.transpose(-1, -2)) * D  # [Hv, n, C, C] intra-chunk scores
    q_dec = q * G.exp()[..., None]  # reads the chunk-start state
    k_rest = k * (G[..., -1:] - G).exp()[..., None]  # decay from row to chunk end
    S = s0.clone()
    out = torch.empty_like(U0)  # [Hv, n, C, dv]
    for c in range(n):
        u = U0[:, c] - W[:, c] @ S  # [Hv, C, dv] corrected new values
        out[:, c] = q_dec[:, c] @ S + QK[:, c] @ u
        S = S * G[:, c, -1].exp()[:, None, None] + k_rest[:, c].transpose(-1, -2) @ u
    o = out.reshape(out.shape[0], n * C, -1)[:, :T].transpose(0, 1)  # [T, Hv, dv]
    return o, S
