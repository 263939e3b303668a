"""Speculative cycle on a hybrid target: checkpoint-slot rollback vs snapshot + re-forward.

Used by ``thor bench --rollback``. One cycle = a verify forward over K+1 rows, then the
rollback to a partial accept of n drafts (``accept``: n = K // 2 by default, a typical miss
mid-block; ``none`` n = 0; ``all-but-one`` n = K - 1). Both paths run the verify as the decode
loop does (``verify``: exact rows), and the replay's re-forward is exact too.
The slot path selects the state after row n (an index); the replay path restores the
snapshot taken before the verify and runs the n+1 accepted rows through the model again.
The target is a random-weight hybrid large enough that a forward is weight-bound.
"""

from __future__ import annotations

import statistics
import time

import torch

from thor_runtime.errors import ThorError
from thor_runtime.models import HybridConfig, HybridModel
from thor_runtime.models import hybrid_expected_shapes as expected_shapes

# drafts accepted of K, per --accept
ACCEPTS = {"half": lambda K: K // 2, "none": lambda K: 0, "all-but-one": lambda K: K - 1}

# ~100M parameters: 6 GDN + 2 full-attention layers, Qwen3.5-like head shapes.
BENCH_CONFIG = dict(
    arch="qwen3_5",
    vocab_size=8192,
    hidden_size=1024,
    intermediate_size=2816,
    num_layers=8,
    num_heads=8,
    num_kv_heads=2,
    head_dim=128,
    max_position_embeddings=4096,
    layer_types=("linear_attention",) * 3
    + ("full_attention",)
    + ("linear_attention",) * 3
    + ("full_attention",),
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel=4,
    partial_rotary_factor=0.25,
    tie_word_embeddings=True,
    name="bench-hybrid",
)


def random_hybrid(cfg: HybridConfig, seed: int = 0, layout: str = "auto") -> HybridModel:
    """Random weights of the right shapes (no checkpoint needed)."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("A_log"):
            w[name] = torch.empty(shape).uniform_(1.0, 8.0, generator=g).log()
        elif name.endswith(
            ("dt_bias", "layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")
        ):
            w[name] = torch.zeros(shape)  # zero-centred norms: scale 1
        elif name.endswith("linear_attn.norm.weight"):
            w[name] = torch.ones(shape)
        else:
            w[name] = torch.randn(shape, generator=g) * 0.02
    return HybridModel(cfg, w, source="random bench hybrid", layout=layout)


def _cycle_times(
    model: HybridModel, K: int, n: int, naive: bool, repeats: int, prompt: int, seed: int
):
    g = torch.Generator().manual_seed(seed)
    V = model.cfg.vocab_size
    cache = model.new_cache(prompt + (repeats + 2) * (K + 1) + 1, naive=naive)
    model.prefill(torch.randint(0, V, (prompt,), generator=g), cache)
    verify, rollback = [], []
    for r in range(repeats + 1):  # the first cycle warms up
        rows = torch.randint(0, V, (K + 1,), generator=g)
        t0 = time.perf_counter()
        model.verify(
            rows, cache
        )  # what the decode loop runs: exact rows, as the replay's re-forward
        t1 = time.perf_counter()
        cache.crop(cache.start + n + 1)
        t2 = time.perf_counter()
        if r:
            verify.append(t1 - t0)
            rollback.append(t2 - t1)
    return statistics.median(verify), statistics.median(rollback), cache


def bench_rollback(
    ks=(3, 7, 15),
    repeats: int = 5,
    prompt: int = 64,
    accept: str = "half",
    model: HybridModel | None = None,
    log=None,
) -> dict:
    """-> {"config": ..., "rows": [{K, n, verify/rollback/cycle ms per path, speedup, slot
    bytes}]}."""
    model = model or random_hybrid(HybridConfig(**BENCH_CONFIG))
    n_params = sum(int(torch.tensor(s).prod()) for s in expected_shapes(model.cfg).values())
    if accept not in ACCEPTS:
        raise ThorError(f"unknown accept {accept!r}; choose one of {', '.join(ACCEPTS)}")
    rows = []
    for K in ks:
        n = ACCEPTS[accept](K)
        ms = {}
        for path, naive in (("slots", False), ("replay", True)):
            v, rb, cache = _cycle_times(model, K, n, naive, repeats, prompt, seed=K)
            ms[path] = {
                "verify_ms": round(v * 1e3, 3),
                "rollback_ms": round(rb * 1e3, 4),
                "cycle_ms": round((v + rb) * 1e3, 3),
                "state_bytes": cache.rec.nbytes(),
            }
        row = {
            "K": K,
            "accepted": n,
            **{f"{p}_{k}": x for p, d in ms.items() for k, x in d.items()},
            "speedup": round(ms["replay"]["cycle_ms"] / ms["slots"]["cycle_ms"], 3),
            "slot_bytes": cache.rec.slot_nbytes(K + 1),
        }
        rows.append(row)
        if log:
            log(
                f"K={K:2d} n={n:2d}  slots: verify {row['slots_verify_ms']:8.2f} ms  rollback "
                f"{row['slots_rollback_ms']:7.4f} ms | "
                f"replay: verify {row['replay_verify_ms']:8.2f} ms  "
                f"rollback {row['replay_rollback_ms']:8.2f} ms | cycle x{row['speedup']:.2f}  "
                f"slots {row['slot_bytes'] / 2**20:.2f} MiB"
            )
    c = model.cfg
    shape = {
        "layers": list(c.layer_types),
        "hidden": c.hidden_size,
        "intermediate": c.intermediate_size,
        "gdn_heads_k_v": [c.linear_num_key_heads, c.linear_num_value_heads],
        "gdn_head_dims_k_v": [c.linear_key_head_dim, c.linear_value_head_dim],
    }
    return {
        "model": c.name,
        "shape": shape,
        "params": n_params,
        "layout": model.layout,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "prompt": prompt,
        "accept": accept,
        "rows": rows,
    }
