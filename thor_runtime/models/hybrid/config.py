"""Configuration of a hybrid Gated-DeltaNet target (Qwen3.5, Qwen3.5-MoE, Qwen3-Next).

The fields shared with dense targets (hidden size, attention heads, ...) keep ModelConfig's
names, so the drafter, the proposers and calibration read a hybrid config like any other;
the extra fields describe the linear-attention (GDN) layers and the mixture-of-experts MLP
blocks. Field meanings follow the HF config: ``layer_types`` lists "linear_attention" |
"full_attention" per layer; ``moe_layers`` are the layers whose MLP is a sparse MoE block.
"""

from __future__ import annotations

from dataclasses import dataclass

from thor_runtime.errors import ThorError
from thor_runtime.models.config import ModelConfig

LAYER_TYPES = {"linear_attention": "gdn", "full_attention": "attn"}
# HF architectures this package implements -> our arch name. The conditional-generation
# classes are multimodal checkpoints; only their language model is loaded. Qwen3.5-MoE has
# Qwen3.5's layers (the same tensor names) with a MoE block as every layer's MLP.
HF_HYBRID_ARCH = {
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5",
    "Qwen3NextForCausalLM": "qwen3_next",
}
_MOE_EVERY_LAYER = {"Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"}


@dataclass(frozen=True)
class HybridConfig(ModelConfig):
    layer_types: tuple[str, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 4
    partial_rotary_factor: float = 1.0
    # Mixture-of-experts MLP blocks (thor_runtime/models/hybrid/moe.py): the layers that have one,
    # routed experts, experts per token, their widths, and whether the top-k router weights
    # are renormalised to sum to 1. The other layers keep the dense MLP (intermediate_size).
    moe_layers: tuple[int, ...] = ()
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True

    def __post_init__(self):
        super().__post_init__()
        if len(self.layer_types) != self.num_layers:
            raise ThorError(
                f"model config: layer_types has {len(self.layer_types)} entries for "
                f"{self.num_layers} layers"
            )
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ThorError(
                f"model config: unknown layer types {bad} (supported: {', '.join(LAYER_TYPES)})"
            )
        if "full_attention" not in self.layer_types or "linear_attention" not in self.layer_types:
            raise ThorError(
                "model config: a hybrid target needs both linear_attention and full_attention "
                "layers"
            )
        for k in (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel",
        ):
            if int(getattr(self, k)) <= 0:
                raise ThorError(f"model config: {k} must be positive, got {getattr(self, k)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ThorError(
                f"model config: linear_num_value_heads {self.linear_num_value_heads} is not a "
                f"multiple of linear_num_key_heads {self.linear_num_key_heads}"
            )
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2:
            raise ThorError(
                f"model config: partial_rotary_factor {self.partial_rotary_factor} gives an odd or "
                f"empty rotary dim for head_dim {self.head_dim}"
            )
        if not self.moe_layers:
            return
        if (
            list(self.moe_layers) != sorted(set(self.moe_layers))
            or not 0 <= self.moe_layers[0] <= self.moe_layers[-1] < self.num_layers
        ):
            raise ThorError(
                f"model config: moe_layers {list(self.moe_layers)} are not distinct layers "
                f"of 0..{self.num_layers - 1} in order"
            )
        for k in (
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        ):
            if int(getattr(self, k)) <= 0:
                raise ThorError(
                    f"model config: {k} must be positive for MoE layers, got {getattr(self, k)}"
                )
        if self.num_experts_per_tok > self.num_experts:
            raise ThorError(
                f"model config: num_experts_per_tok {self.num_experts_per_tok} exceeds "
                f"num_experts {self.num_experts}"
            )

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
    def key_dim(self) -> int:  # all key heads of one GDN layer
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:  # channels of the causal conv: q, k, v
        return 2 * self.key_dim + self.value_dim

    def attn_cfg(self) -> ModelConfig:
        """A dense-shaped config covering only the full-attention layers (sizes the KV cache)."""
        return ModelConfig(
            arch="qwen3",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=len(self.attn_layers),
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rms_eps=self.rms_eps,
            rope_theta=self.rope_theta,
            max_position_embeddings=self.max_position_embeddings,
            name=self.name,
        )


def _rope(c: dict, where: str) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from either the flat or the rope_parameters form."""
    rp = c.get("rope_parameters") or c.get("rope_scaling") or {}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind != "default":
        raise ThorError(
            f"{where}: rope type {kind!r} is not supported for hybrid targets (default only)"
        )
    theta = float(c.get("rope_theta") or rp.get("rope_theta", 10000.0))
    prf = float(c.get("partial_rotary_factor") or rp.get("partial_rotary_factor", 1.0))
    return theta, prf


def hybrid_config_from_hf(c: dict, arch_name: str, where: str, name: str) -> HybridConfig:
    """``c``: a parsed HF config.json whose architectures include ``arch_name``."""
    arch = HF_HYBRID_ARCH[arch_name]
    if arch_name.endswith("ForConditionalGeneration"):
        c = dict(
            c.get("text_config") or {},
            tie_word_embeddings=c.get(
                "tie_word_embeddings",
                (c.get("text_config") or {}).get("tie_word_embeddings", False),
            ),
        )
    try:
        n = int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        types = c.get("layer_types")
        if types is None:  # HF's default: every full_attention_interval-th layer is full attention
            every = int(c.get("full_attention_interval", 4))
            types = [
                "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)
            ]
        if c.get("hidden_act", "silu") != "silu":
            raise ThorError(f"{where}: hidden_act {c['hidden_act']!r} is not supported (silu only)")
        moe, experts = _moe_layers(c, arch_name, n, where)
        theta, prf = _rope(c, where)
        # Qwen3.5-MoE has no dense MLP and no intermediate_size; the shared expert's width
        # stands in where a dense width is asked for (sizing a drafter's MLP).
        dense_i = (
            c["shared_expert_intermediate_size"]
            if arch_name in _MOE_EVERY_LAYER
            else c["intermediate_size"]
        )
        return HybridConfig(
            arch=arch,
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(dense_i),
            num_layers=n,
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            rms_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            name=name,
            layer_types=tuple(types),
            linear_num_key_heads=int(c["linear_num_key_heads"]),
            linear_num_value_heads=int(c["linear_num_value_heads"]),
            linear_key_head_dim=int(c["linear_key_head_dim"]),
            linear_value_head_dim=int(c["linear_value_head_dim"]),
            linear_conv_kernel=int(c.get("linear_conv_kernel_dim", 4)),
            partial_rotary_factor=prf,
            moe_layers=moe,
            **experts,
        )
    except KeyError as e:
        raise ThorError(f"{where} lacks required key {e.args[0]!r}") from None


def _moe_layers(c: dict, arch_name: str, n: int, where: str) -> tuple[tuple[int, ...], dict]:
    """The layers with a MoE block and the expert fields, by transformers' rules: Qwen3.5-MoE
    has one in every layer; Qwen3-Next in layer i when num_experts > 0, i is not in
    mlp_only_layers and (i + 1) % decoder_sparse_step == 0. No MoE: ((), {}). A missing
    field is refused rather than given transformers' default (a guessed expert count or
    width would only fail later, on the weights)."""
    if arch_name in _MOE_EVERY_LAYER:
        moe = tuple(range(n))
    elif (
        HF_HYBRID_ARCH[arch_name] == "qwen3_next" and int(c["num_experts"]) > 0
    ):  # no default: HF's is 512
        step, only = int(c.get("decoder_sparse_step", 1)), set(c.get("mlp_only_layers") or [])
        if step <= 0:
            raise ThorError(f"{where}: decoder_sparse_step must be positive, got {step}")
        moe = tuple(i for i in range(n) if i not in only and (i + 1) % step == 0)
    else:
        return (), {}
    if not moe:
        return (), {}
    return moe, dict(
        num_experts=int(c["num_experts"]),
        num_experts_per_tok=int(c["num_experts_per_tok"]),
        moe_intermediate_size=int(c["moe_intermediate_size"]),
        shared_expert_intermediate_size=int(c["shared_expert_intermediate_size"]),
        # Qwen3.5-MoE's router always renormalises; Qwen3-Next's does when norm_topk_prob.
        norm_topk_prob=arch_name in _MOE_EVERY_LAYER or bool(c.get("norm_topk_prob", True)),
    )
