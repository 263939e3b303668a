"""How a projection weight is held and called: weight-only int8 and oneDNN-packed weights.

Both are callables ``w(x)`` beside plain tensors, so every segment calls ``linear`` alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Up to this many rows the int8 kernel wins (decode and verify); beyond it (prefill) the
# dense fp32 matmul does — measured on AVX-512 CPUs, see docs/performance.md.
INT8_MAX_ROWS = 16


class Int8Weight:
    """Weight-only int8, one bf16 scale per output channel, for the weight-bound small-M
    matmuls of decode and verify (a quarter of fp32's bytes to read per token). Large-M
    work (prefill) runs on a dense fp32 copy when ``keep_dense`` — compute-bound there,
    and int8 unpacking would only slow it."""

    def __init__(self, w: torch.Tensor, keep_dense: bool = True):
        w = w.float()
        s = w.abs().amax(1).clamp_min(1e-8) / 127.0  # [out]
        self.q = torch.round(w / s[:, None]).to(torch.int8).contiguous()  # [out, in]
        self.s = s.to(torch.bfloat16)
        self.dense = w.contiguous() if keep_dense else None
        self.shape = w.shape
        try:
            torch._weight_int8pack_mm(
                torch.zeros(1, w.shape[1], dtype=torch.bfloat16, device=w.device), self.q, self.s
            )
            self.kernel = True
        except (RuntimeError, NotImplementedError, AttributeError):
            self.kernel = False  # no int8 kernel on this device: dequantize instead

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead, d = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, d)  # [M, in]
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
        x2 = x.reshape(-1, d)  # [M, in]
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


def linear(x: torch.Tensor, w) -> torch.Tensor:
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w(x)
