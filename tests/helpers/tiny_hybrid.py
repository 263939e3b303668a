"""Tiny random-weight hybrid (Gated-DeltaNet) checkpoints: Qwen3.5, Qwen3-Next, and both with
mixture-of-experts MLP blocks.

Real HF directories written by transformers itself, so they go through our loader as a
user's checkpoint would and transformers can load them as the oracle.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.tiny import make_tokenizer

HYBRID_CONFIGS = {
    # 4 layers: GDN, GDN, GDN, full attention. 2 key heads serve 4 value heads (GQA in GDN).
    "qwen3_5": dict(
        architectures=["Qwen3_5ForCausalLM"],
        model_type="qwen3_5_text",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=False,
    ),
    "qwen3_next": dict(
        architectures=["Qwen3NextForCausalLM"],
        model_type="qwen3_next",
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=0,
        tie_word_embeddings=True,
    ),
}
# MoE: 8 experts, 2 per token. Qwen3-Next: layer 2 keeps a dense MLP (mlp_only_layers), the router
# weights are not renormalised, and transformers saves one tensor per expert; Qwen3.5-MoE: every
# layer has a MoE block, renormalised, fused 3-D expert tensors.
_EXPERTS = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=48,
)
HYBRID_CONFIGS["qwen3_next_moe"] = dict(
    HYBRID_CONFIGS["qwen3_next"],
    **_EXPERTS,
    decoder_sparse_step=1,
    mlp_only_layers=[2],
    norm_topk_prob=False,
)
HYBRID_CONFIGS["qwen3_5_moe"] = dict(
    {k: v for k, v in HYBRID_CONFIGS["qwen3_5"].items() if k != "intermediate_size"},
    architectures=["Qwen3_5MoeForCausalLM"],
    model_type="qwen3_5_moe_text",
    **_EXPERTS,
)


def make_hybrid_dir(
    path: Path, arch: str = "qwen3_5", seed: int = 0, std: float = 0.08, **over
) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fast = make_tokenizer(path)
    kw = dict(HYBRID_CONFIGS[arch], **over)
    archs = kw.pop("architectures")
    model_type = kw.pop("model_type")
    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=len(fast),
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        **kw,
    )
    cfg.architectures = archs
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.5, 8.0).log())  # decays well inside (0, 1)
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "linear_attn.norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))  # plain scale
            elif "norm" in name:
                p.copy_(0.1 * torch.randn_like(p))  # zero-centred: the scale is 1 + w
            else:
                p.normal_(0.0, std)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return m.eval()
