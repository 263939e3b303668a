"""Configuration of a hybrid Gated-DeltaNet target (Qwen3.5, Qwen3-Next).

The fields shared with dense targets (hidden size, attention heads, ...) keep ModelConfig's
names, so the drafter, the proposers and calibration read a hybrid config like any other;
the extra fields describe the linear-attention (GDN) layers. Field meanings follow the HF
config: ``layer_types`` lists "linear_attention" | "full_attention" per layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..errors import ThorError

LAYER_TYPES = {"linear_attention": "gdn", "full_attention": "attn"}
# HF architectures this package implements -> our arch name. The conditional-generation
# class is the multimodal checkpoint; only its language model is loaded.
HF_HYBRID_ARCH = {"Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5ForConditionalGeneration": "qwen3_5",
                  "Qwen3NextForCausalLM": "qwen3_next"}


@dataclass(frozen=True)
class HybridConfig(ModelConfig):
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 4
    partial_rotary_factor: float = 1.0
    # Layers whose MLP is a mixture of experts (Qwen3-Next); refused at model build time.
    moe_layers: tuple[int, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if len(self.layer_types) != self.num_layers:
            raise ThorError(f"model config: layer_types has {len(self.layer_types)} entries for "
                            f"{self.num_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ThorError(f"model config: unknown layer types {bad} (supported: {', '.join(LAYER_TYPES)})")
        if "full_attention" not in self.layer_types or "linear_attention" not in self.layer_types:
            raise ThorError("model config: a hybrid target needs both linear_attention and full_attention layers")
        for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel"):
            if int(getattr(self, k)) <= 0:
                raise ThorError(f"model config: {k} must be positive, got {getattr(self, k)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ThorError(f"model config: linear_num_value_heads {self.linear_num_value_heads} is not a "
                            f"multiple of linear_num_key_heads {self.linear_num_key_heads}")
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2:
            raise ThorError(f"model config: partial_rotary_factor {self.partial_rotary_factor} gives an odd or "
                            f"empty rotary dim for head_dim {self.head_dim}")

    # ---- derived sizes
    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def attn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def key_dim(self) -> int:          # all key heads of one GDN layer
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:         # channels of the causal conv: q, k, v
        return 2 * self.key_dim + self.value_dim

    def attn_cfg(self) -> ModelConfig:
        """A dense-shaped config covering only the full-attention layers (sizes the KV cache)."""
        return ModelConfig(arch="qwen3", vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=len(self.attn_layers),
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           rms_eps=self.rms_eps, rope_theta=self.rope_theta,
                           max_position_embeddings=self.max_position_embeddings, name=self.name)


def _rope(c: dict, where: str) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from either the flat or the rope_parameters form."""
    rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        raise ThorError(f"{where}: rope type {kind!r} is not supported for hybrid targets (default only)")
    theta = float(c.get("rope_theta") or rp.get("rope_theta", 10000.0))
    prf = float(c.get("partial_rotary_factor") or rp.get("partial_rotary_factor", 1.0))
    return theta, prf


def hybrid_config_from_hf(c: dict, arch_name: str, where: str, name: str) -> HybridConfig:
    """``c``: a parsed HF config.json whose architectures include ``arch_name``."""
    arch = HF_HYBRID_ARCH[arch_name]
    if arch_name == "Qwen3_5ForConditionalGeneration":
        c = dict(c.get("text_config") or {}, tie_word_embeddings=c.get("tie_word_embeddings",
                 (c.get("text_config") or {}).get("tie_word_embeddings", False)))
    try:
        n = int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        types = c.get("layer_types")
        if types is None:  # HF's default: every full_attention_interval-th layer is full attention
            every = int(c.get("full_attention_interval", 4))
            types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
        moe: tuple[int, ...] = ()
        if arch == "qwen3_next" and int(c.get("num_experts", 0) or 0) > 0:
            step, only = int(c.get("decoder_sparse_step", 1)), set(c.get("mlp_only_layers") or [])
            moe = tuple(i for i in range(n) if i not in only and (i + 1) % step == 0)
        theta, prf = _rope(c, where)
        return HybridConfig(
            arch=arch, vocab_size=int(c["vocab_size"]), hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]), num_layers=n, num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            rms_eps=float(c.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)), name=name,
            layer_types=tuple(types), linear_num_key_heads=int(c["linear_num_key_heads"]),
            linear_num_value_heads=int(c["linear_num_value_heads"]),
            linear_key_head_dim=int(c["linear_key_head_dim"]),
            linear_value_head_dim=int(c["linear_value_head_dim"]),
            linear_conv_kernel=int(c.get("linear_conv_kernel_dim", 4)), partial_rotary_factor=prf,
            moe_layers=moe,
        )
    except KeyError as e:
        raise ThorError(f"{where} lacks required key {e.args[0]!r}") from None
