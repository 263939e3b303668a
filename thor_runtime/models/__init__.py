"""Target models as math: the dense transformer (dense.py), the hybrid Gated-DeltaNet models
(hybrid/), the target protocol every caller holds (target.py), their config and the shared
attention math. What runs them faster lives in kernels/ and engine/runner.py.

Other packages import models through this module; names load on first use.
"""

from __future__ import annotations

__all__ = [
    "EXACT_ROWS",
    "HybridConfig",
    "HybridModel",
    "Int8Weight",
    "ModelConfig",
    "PackedWeight",
    "RowLoop",
    "TargetModel",
    "backend_for_verify",
    "dense_expected_shapes",
    "hybrid_expected_shapes",
]


def __getattr__(name: str):
    # static imports, one branch per module, so the layering test sees every edge
    if name in ("ModelConfig",):
        from thor_runtime.models import config as module
    elif name in (
        "EXACT_ROWS",
        "Int8Weight",
        "PackedWeight",
        "RowLoop",
        "TargetModel",
        "backend_for_verify",
        "dense_expected_shapes",
    ):
        from thor_runtime.models import dense as module

        name = {"dense_expected_shapes": "_expected_shapes"}.get(name, name)
    elif name in ("HybridConfig",):
        from thor_runtime.models.hybrid import config as module
    elif name in ("HybridModel",):
        from thor_runtime.models.hybrid import model as module
    elif name in ("hybrid_expected_shapes",):
        from thor_runtime.models.hybrid import weights as module

        name = {"hybrid_expected_shapes": "expected_shapes"}.get(name, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
