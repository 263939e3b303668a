"""Which kernel int4 projections run on: ONNX Runtime's MatMulNBits or torch's packed int4.

Apart from lowbit.py (the codes and torch's kernel) so that neither kernel module imports
the other: this one sits above both.
"""

from __future__ import annotations

import torch

from thor_runtime.errors import ThorError
from thor_runtime.kernels.lowbit import (
    GROUP,
    ROWS_MULTIPLE,
    FusedPart,
    Int4Codes,
    Int4Weight,
    quantize_int4,
)
from thor_runtime.kernels.lowbit_ort import NBitsWeight
from thor_runtime.kernels.projections import Int8Weight


def int4_kernels() -> dict:
    """Kernel name -> projection class, fastest first (measured: docs/performance.md, low-bit
    weights). Each class has ``from_codes(parts)`` and ``available()``."""
    return {"ort": NBitsWeight, "torch": Int4Weight}


def pick_int4_kernel(name: str = "auto") -> str:
    """-> the kernel int4 weights run on: ``name``, or for "auto" the first available."""
    kernels = int4_kernels()
    if name != "auto":
        if name not in kernels:
            raise ThorError(
                f"unknown int4 kernel {name!r}; choose auto or one of {', '.join(kernels)}"
            )
        if not kernels[name].available():
            why = "install the onnx extra" if name == "ort" else "this torch has no int4 CPU kernel"
            raise ThorError(f"int4 kernel {name!r} is not available here ({why})")
        return name
    for k, cls in kernels.items():
        if cls.available():
            return k
    raise ThorError(
        "no int4 kernel is available here (install the onnx extra, or use --dtype int8)"
    )


def int4_projection(parts: list, kernel: str = "torch"):
    """The model's projection from its HF tensors: Int4Codes (packed here), FusedPart (as
    loaded), or float tensors (re-quantized). Shapes the kernel cannot take (inputs not a
    multiple of GROUP; for torch's packing, outputs not of ROWS_MULTIPLE) run weight-only
    int8 instead."""
    if all(isinstance(p, FusedPart) for p in parts):
        fused = parts[0].weight
        if any(p.weight is not fused for p in parts):
            raise ThorError("weight cache: a fused projection is split across entries")
        return fused
    N, K = sum(p.shape[0] for p in parts), parts[0].shape[1]
    if K % GROUP or (kernel == "torch" and N % ROWS_MULTIPLE):
        return Int8Weight(
            torch.cat([p.dequantize() if isinstance(p, Int4Codes) else p.float() for p in parts]),
            keep_dense=False,
        )
    codes = [p if isinstance(p, Int4Codes) else quantize_int4(p) for p in parts]
    return int4_kernels()[kernel].from_codes(codes)
