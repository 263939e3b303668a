"""Kernels that run a target's projections faster than torch eager: low-bit (int4/int8) weights,
the row kernel (C sources in csrc/), ONNX Runtime step graphs, and the choice between them.

Other packages import kernels through this module; names load on first use.
"""

from __future__ import annotations

__all__ = ["cpu_isa"]


def __getattr__(name: str):
    # static imports, one branch per module, so the layering test sees every edge
    if name in ("cpu_isa",):
        from thor_runtime.kernels import rowstep as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
