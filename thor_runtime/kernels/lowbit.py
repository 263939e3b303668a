"""Weight-only int4 projections: 4-bit codes with a scale and a zero per group of 32 inputs.

This is the shape of GGUF's Q4_0 / Q4_1 blocks (32 weights, one fp16 scale ``d`` and, for
Q4_1, a minimum ``m``: w = d * q + m, q in 0..15), so those files load without
re-quantizing: torch's CPU int4 kernel computes w = (q - 8) * scale + zero, hence
scale = d and zero = m + 8 d. Other formats (float checkpoints, K-quants) are re-quantized
to the same layout (min/max per group). Activations are bf16: the kernel takes its scales
in the activation dtype, and its fp16/fp32 paths are 10-100x slower on CPUs without
AVX-512 FP16.

The kernel (``torch._weight_int4pack_mm_for_cpu``) computes each output row with the same
instruction sequence whatever the row count, so verifies need no RowLoop (the model's load
probe decides, as for every kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from thor_runtime.errors import ThorError

GROUP = 32
# Inner-k tiles argument of torch's CPU int4 packing (the CPU kernel ignores values above 1
# except for validation); the packed layout is row-block local, so fused projections are
# packed once from their concatenated codes.
_INNER_K_TILES = 1
# The packing needs the output size to be a multiple of this; other shapes run int8.
ROWS_MULTIPLE = 16


@dataclass(frozen=True)
class Int4Codes:
    """One projection before packing: codes [N, K] uint8 in 0..15, scale/zero [N, K/GROUP] fp32."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def __post_init__(self):
        N, K = self.codes.shape
        if K % GROUP:
            raise ThorError(f"int4 weights need an input size divisible by {GROUP}, got {K}")
        if tuple(self.scale.shape) != (N, K // GROUP) or self.zero.shape != self.scale.shape:
            raise ThorError(
                f"int4 scales of shape {list(self.scale.shape)} "
                f"do not fit codes {list(self.codes.shape)}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def permute_rows(self, order: np.ndarray) -> "Int4Codes":
        idx = torch.from_numpy(np.ascontiguousarray(order))
        return Int4Codes(self.codes[idx], self.scale[idx], self.zero[idx])

    def dequantize(self) -> torch.Tensor:
        """-> [N, K] fp32, w = (q - 8) * scale + zero (exactly what the kernel's weights are,
        before its scales are rounded to bf16)."""
        s = self.scale.repeat_interleave(GROUP, 1)
        z = self.zero.repeat_interleave(GROUP, 1)
        return (self.codes.float() - 8) * s + z


def quantize_int4(w: torch.Tensor) -> Int4Codes:
    """Asymmetric min/max 4-bit quantization per group of GROUP inputs. w [N, K] -> codes."""
    w = w.float()
    N, K = w.shape
    if K % GROUP:
        raise ThorError(f"int4 weights need an input size divisible by {GROUP}, got {K}")
    g = w.view(N, K // GROUP, GROUP)
    lo, hi = g.amin(-1), g.amax(-1)  # [N, K/G]
    d = ((hi - lo) / 15).clamp_min(1e-10)
    q = torch.round((g - lo[..., None]) / d[..., None]).clamp(0, 15).to(torch.uint8).view(N, K)
    return Int4Codes(q, d, lo + 8 * d)


def q4_blocks(raw: np.ndarray, shape: tuple[int, int], kind: str) -> Int4Codes:
    """GGUF Q4_0 / Q4_1 blocks as stored -> codes with the file's own scales (no re-quantizing).

    raw: uint8 [N, K/32 * block_bytes]; Q4_1 block = fp16 d, fp16 m, 16 bytes of nibbles
    (element j in the low nibble of byte j, element j + 16 in its high nibble); Q4_0 = fp16 d
    and the nibbles, w = d * (q - 8)."""
    N, K = shape
    head = {"Q4_0": 2, "Q4_1": 4}[kind]
    b = np.asarray(raw, dtype=np.uint8).reshape(N, K // GROUP, head + 16)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # [N, K/G]
    nib = b[..., head:]  # [N, K/G, 16]
    codes = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).reshape(N, K)  # [N, K]
    if kind == "Q4_1":
        m = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8 * d
    else:
        zero = np.zeros_like(d)
    return Int4Codes(torch.from_numpy(codes), torch.from_numpy(d), torch.from_numpy(zero))


class Int4Weight:
    """A packed int4 projection for torch's CPU kernel. packed: kernel layout (uint8);
    sz: [K/GROUP, N, 2] bf16 (scale, zero). Every row count runs the int4 kernel: no dense
    copy is kept (prefill pays ~2x fp32's matmul time for a quarter of its memory)."""

    def __init__(self, packed: torch.Tensor, sz: torch.Tensor, shape: tuple[int, int]):
        self.packed, self.sz, self.shape = packed, sz, torch.Size(shape)

    @classmethod
    def pack(cls, parts: list[Int4Codes]) -> "Int4Weight":
        """Fuse projections that share their input (q/k/v, gate/up) along the output dim."""
        codes = torch.cat([p.codes for p in parts]).to(torch.int32).contiguous()  # [N, K]
        scale = torch.cat([p.scale for p in parts])  # [N, K/G]
        zero = torch.cat([p.zero for p in parts])
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, _INNER_K_TILES)
        sz = torch.stack([scale.t(), zero.t()], -1).to(torch.bfloat16).contiguous()  # [K/G, N, 2]
        return cls(packed, sz, tuple(codes.shape))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, d = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, d).to(torch.bfloat16)  # [M, in]
        y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, GROUP, self.sz)  # [M, out]
        return y.to(x.dtype).view(*lead, -1)

    from_codes = pack

    @staticmethod
    def available() -> bool:
        try:
            Int4Weight.pack([quantize_int4(torch.ones(ROWS_MULTIPLE, GROUP))])(torch.ones(1, GROUP))
            return True
        except (RuntimeError, NotImplementedError, AttributeError):
            return False


@dataclass(frozen=True)
class FusedPart:
    """Stands for one HF projection tensor (``.shape``) whose packed form is already fused
    into ``weight`` (a weight cache hit): the model takes ``weight`` as is."""

    weight: Int4Weight
    shape: tuple[int, int]
