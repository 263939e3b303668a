"""The model shapes the device benchmark runs, random models at them, and its timing helpers."""

from __future__ import annotations

import statistics
import time

# name -> (architecture, hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied)
SHAPES = {
    "smollm2-135m": ("llama", 576, 1536, 30, 9, 3, 64, 49152, True),
    "qwen2.5-0.5b": ("qwen2", 896, 4864, 24, 14, 2, 64, 151936, True),
    "qwen3-8b": ("qwen3", 4096, 12288, 36, 32, 8, 128, 151936, False),
}
# `make demo`'s kitchen plan with the planner model: prompt and generated tokens
# (docs/performance.md)
PLAN_SHAPE = (970, 135)


def shape_config(name: str):
    from thor_runtime.models import ModelConfig

    arch, d, inter, n, h, hk, dh, v, tied = SHAPES[name]
    return ModelConfig(
        arch=arch,
        vocab_size=v,
        hidden_size=d,
        intermediate_size=inter,
        num_layers=n,
        num_heads=h,
        num_kv_heads=hk,
        head_dim=dh,
        tie_word_embeddings=tied,
        max_position_embeddings=32768,
        rope_theta=1e6,
        name=name,
    )


def random_model(cfg, device, dtype):
    """A TargetModel of ``cfg`` with seeded random weights, made directly on ``device``."""
    import torch

    from thor_runtime.models import TargetModel
    from thor_runtime.models import dense_expected_shapes as _expected_shapes

    g = torch.Generator(device=device).manual_seed(0)
    weights = {}
    for name, shape in _expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            weights[name] = torch.randn(shape, generator=g, device=device, dtype=dtype) * 0.02
    return TargetModel(cfg, weights, dtype, source=cfg.name, device=device)


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs, the device synchronised around each."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def copy_bandwidth(device) -> float:
    """Bytes per second a device-to-device copy moves, counting bytes read and written."""
    import torch

    n = (1 << 30) if device.type == "cuda" else (1 << 27)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / timed(lambda: dst.copy_(src), device, 10)


def weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every projection and norm, the head, one
    embedding row."""
    import torch

    total = 0
    for L in model.layers:
        for t in (
            L.attn_norm,
            L.wqkv,
            L.wo,
            L.mlp_norm,
            L.w_gate_up,
            L.w_down,
            L.q_norm,
            L.k_norm,
            L.bqkv,
        ):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    head = model.head_w if isinstance(model.head_w, torch.Tensor) else model.lm_head
    return (
        total
        + head.numel() * head.element_size()
        + model.embed_w.shape[1] * model.embed_w.element_size()
    )


class NullTokenizer:
    """Decodes nothing: speed runs never look at text."""

    eos_token_ids = ()

    def decode(self, ids):
        return ""
