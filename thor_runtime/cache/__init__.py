"""What the runtime keeps between forwards and between requests: the KV cache (fp32/bf16/fp8),
prompt prefixes in memory (prefix_cache) and on disk (prefix_store), and the shelf of world
starts (prefix_shelf).

Other packages import caches through this module; names load on first use.
"""

from __future__ import annotations

__all__ = [
    "FP8_MAX",
    "KVCache",
    "KVScales",
    "PrefixShelf",
    "common_prefix",
    "load_prefix",
    "prefix_key",
    "prefix_path",
    "prompt_set_hash",
    "save_prefix",
]


def __getattr__(name: str):
    # static imports, one branch per module, so the layering test sees every edge
    if name in ("FP8_MAX", "KVCache", "KVScales", "prompt_set_hash"):
        from thor_runtime.cache import kv_cache as module
    elif name in ("common_prefix",):
        from thor_runtime.cache import prefix_cache as module
    elif name in ("PrefixShelf",):
        from thor_runtime.cache import prefix_shelf as module
    elif name in ("load_prefix", "prefix_key", "prefix_path", "save_prefix"):
        from thor_runtime.cache import prefix_store as module

        name = {"load_prefix": "load", "save_prefix": "save"}.get(name, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
