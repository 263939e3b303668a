"""Backends for the target model's dense segments (embed, pre_attn, post_attn, head).

segments.py exports them to ONNX; backend.py is the one interface (torch, onnxruntime,
tensorrt); cache.py is the hash-pinned engine cache every non-torch backend loads from;
selftest.py is the on-device parity self-test. Heavy dependencies (onnx, onnxruntime,
tensorrt) are imported only where used.
"""

# The names of backend.BACKENDS, importable without torch (config checks that must be fast);
# stated once, in the runtime's config table.
from thor_runtime.config import ENGINE_BACKENDS as BACKEND_NAMES  # noqa: E402

__all__ = ["BACKEND_NAMES"]
