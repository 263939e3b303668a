"""Frozen, validated configuration for the target model."""

from __future__ import annotations

from dataclasses import dataclass, field

from thor_runtime.errors import ThorError

# How a model's projection weights are held in memory on CPU (model.py; --weights-layout).
# dense: plain tensors; packed: oneDNN-packed only; dual: both (fastest for every row count
# with fp32, twice the projection memory); auto: dual for fp32 and packed for bf16 where
# oneDNN packing exists, else dense.
WEIGHT_LAYOUTS = ("auto", "dense", "packed", "dual")
# --dtype choices: auto (int4 for a quantized GGUF, else the file's float type), float, weight-only
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "int4")

# Architectures the reference model implements; the value says whether q/k get an RMSNorm.
# Hybrid Gated-DeltaNet targets (thor_runtime/models/hybrid) carry a HybridConfig; their
# full-attention layers have q/k norms.
ARCHITECTURES = {"llama": False, "qwen3": True, "qwen2": False, "qwen3_5": True, "qwen3_next": True}
# Architectures whose q/k/v projections carry a bias (the fused wqkv gets a fused bias).
QKV_BIAS_ARCHITECTURES = frozenset({"qwen2"})


def check_attention_dims(what: str, cfg, sizes: tuple[str, ...]) -> None:
    """Shared by the target and drafter configs: positive sizes, GQA grouping, RoPE pairs."""
    for k in sizes:
        if int(getattr(cfg, k)) <= 0:
            raise ThorError(f"{what}: {k} must be positive, got {getattr(cfg, k)}")
    if cfg.num_heads % cfg.num_kv_heads:
        raise ThorError(
            f"{what}: num_heads {cfg.num_heads} is not a multiple of "
            f"num_kv_heads {cfg.num_kv_heads}"
        )
    if cfg.head_dim % 2:
        raise ThorError(f"{what}: head_dim {cfg.head_dim} must be even for RoPE")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    # HF-style rope_scaling dict ("llama3", "linear", "dynamic" not supported) or None.
    rope_scaling: dict | None = field(default=None, hash=False, compare=False)
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 2048
    name: str = "model"

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ThorError(
                f"unknown architecture {self.arch!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        check_attention_dims(
            "model config",
            self,
            (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "max_position_embeddings",
            ),
        )
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type", "default"))
            if kind not in ("default", "linear", "llama3"):
                raise ThorError(
                    f"model config: rope_scaling type {kind!r} is not supported "
                    "(supported: linear, llama3)"
                )

    @property
    def qk_norm(self) -> bool:
        return ARCHITECTURES[self.arch]

    @property
    def qkv_bias(self) -> bool:
        return self.arch in QKV_BIAS_ARCHITECTURES

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim
