"""Hybrid Gated-DeltaNet targets (Qwen3.5, Qwen3-Next): config, GDN mixer, recurrent state
with checkpoint slots, and the model. Imported lazily by the loader."""


def is_hybrid_config(cfg) -> bool:
    from thor_runtime.models.hybrid.config import HybridConfig

    return isinstance(cfg, HybridConfig)
