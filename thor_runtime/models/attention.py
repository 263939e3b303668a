"""The math every mixer shares: RMSNorm, rotary position tables, and scaled dot-product
attention with grouped KV heads at the sizes decode and verify call it."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from thor_runtime.models.config import ModelConfig


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # fp32 statistics as in HF, so bf16 weights don't drift on the variance.
    if x.is_cuda:
        # one fused kernel instead of five: decode on a GPU is bound by kernel count at these sizes
        y = F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps)
        return y if x.dtype == torch.float32 else y.to(x.dtype)
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w  # w is kept in fp32
    return y if x.dtype == torch.float32 else y.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rs = cfg.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv = inv / float(rs["factor"])
    elif kind == "llama3":
        factor, lo, hi = (
            float(rs["factor"]),
            float(rs["low_freq_factor"]),
            float(rs["high_freq_factor"]),
        )
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


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads.

    q [..., H, T, Dh]; k, v [..., Hkv, n, Dh] with H a multiple of Hkv (query head h reads KV
    head h // (H / Hkv)); mask None, or bool broadcastable to [..., 1, T, n] (True = attend), or
    float [T, n] added to the scores; causal: query t sees keys 0..t (T == n). -> [..., H, T, Dh].
    """
    H, T, Dh = q.shape[-3:]
    Hkv, n = k.shape[-3], k.shape[-2]
    if T > SMALL_ATTN_ROWS or (causal and T > 1):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=H != Hkv
        )
    g, lead = H // Hkv, q.shape[:-3]
    if T == 1 and mask is None and q.dim() == 3:
        # One query row: a decode step, and each row of an exact verify (both come here, so
        # they share the bits). bmm and an in-place scale: ~1 ms less per step than the
        # broadcasting matmuls below (SmolLM2-135M, 30 layers), the same kernels and bits.
        s = torch.bmm(q.reshape(Hkv, g, Dh), k.transpose(1, 2)).mul_(Dh**-0.5)  # [Hkv, g, n]
        return torch.bmm(torch.softmax(s, -1, dtype=torch.float32).to(v.dtype), v).view(H, 1, Dh)
    # The g query heads of one KV head share its keys: fold them into the row dim, so one
    # matmul per KV head replaces a copy of K/V per query head.
    qg = q.reshape(*lead, Hkv, g * T, Dh)  # [..., Hkv, gT, Dh]
    s = torch.matmul(qg, k.transpose(-1, -2)) * (Dh**-0.5)  # [..., Hkv, gT, n]
    if mask is not None:
        s = s.view(*lead, Hkv, g, T, n)
        s = (
            s + mask
            if mask.is_floating_point()
            else s.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        )
        s = s.view(*lead, Hkv, g * T, n)
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype)
    return torch.matmul(p, v).view(*lead, H, T, Dh)  # [..., H, T, Dh]
