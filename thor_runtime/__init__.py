"""thor-runtime's library: load a model, build a Runtime, generate (speculatively, under a grammar).

The front door. Other packages import the runtime from here or from a subpackage's own module
(``thor_runtime.engine``, ``.cache``, ``.kernels``, ``.models``, ``.loading``, ``.speculative``)
and from the top-level modules ``config``, ``errors``, ``fileio``, ``device``, ``catalog`` and
``model_choice``; never from a file inside a subpackage (tests/test_layering.py holds this).

    from thor_runtime import RuntimeConfig, Runtime, SamplingParams, load

The folders, by role:
    engine/       the generation loop, the kernel runner, in-flight batching, fixed shape
    kernels/      low-bit weights, the row kernel and its C sources, ONNX Runtime step graphs
    cache/        KV cache, prompt prefixes in memory and on disk, world starts
    models/       the math: dense and hybrid targets, the target protocol, the model config
    loading/      HF safetensors and GGUF files, tokenizer, the weight cache
    speculative/  proposers (DFlash, prompt lookup, combined, auto), acceptance, draft budgets
    config.py     RuntimeConfig, every runtime setting once; catalog.py the pullable models
    model_choice.py  which pulled model a CUDA device runs by default (measured, cached)

Names load on first use, so ``import thor_runtime`` stays light (no torch until one is asked for).
"""

from __future__ import annotations

__all__ = [
    "Result",
    "Runtime",
    "RuntimeConfig",
    "SamplingParams",
    "SpecOptions",
    "Speculation",
    "ThorError",
    "build_speculation",
    "load",
]


def __getattr__(name: str):
    # static imports, one branch per module, so the layering test sees every edge
    if name in ("Result", "Runtime"):
        from thor_runtime.engine import generate as module
    elif name == "SamplingParams":
        from thor_runtime.engine import sampling as module
    elif name == "RuntimeConfig":
        from thor_runtime import config as module
    elif name == "ThorError":
        from thor_runtime import errors as module
    elif name == "load":
        from thor_runtime import loading as module
    elif name in ("SpecOptions", "Speculation", "build_speculation"):
        from thor_runtime import speculative as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
