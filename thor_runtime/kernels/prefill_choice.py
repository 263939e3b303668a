"""Which kernel runs a MatMulNBits model's prompt rows: the row kernel or ONNX Runtime's step
graph, whichever prefills faster here: settled by the build where it is known, else measured
once per CPU environment and kernel build.

Where the answer is known, no clock. A build that regroups the weights (``rows.group`` > 0:
AVX-512 VNNI, 16 outputs per vector op; AVX2, 8) prefills 256 rows in 0.5x the step graph's
time on AVX-512 and 0.6-0.85x on an AVX2-only EPYC (docs/performance.md): it runs them. Two
starts without a shared weight cache used to time the two kernels and could disagree where they
ran close, and so give the same prompt different last bits.

Where it is not, measure. How the interleaved builds (NEON, plain C) compare with ONNX
Runtime's MLAS GEMM is not a constant of the architecture, so the runner asks the clock there.

Why one kernel for every prompt length, not one per token count. The prompt rows a plan
prefills are split differently from run to run (a stored prefix, the prefix cache, chunked
prefill): both kernels are row-invariant, so any split of one kernel gives the same bits, but
rows from two kernels differ in their last bits, and a plan with a stored prefix must be
byte-identical to one without. The choice is made at ``ROWS`` rows (a world and a task: what a
plan prefills once its shared prefix is stored) and then holds for all of them.

The verdict is kept beside the row-invariance probes (``model.row_verdicts``: the weight cache
stores them per CPU environment, threads included), so a cached model does not measure again.
"""

from __future__ import annotations

import time

import torch

ROWS = 256  # prompt rows timed per kernel (a world and a task)
ROUNDS = 2  # timed rounds each, interleaved after a warm-up; the fastest counts


def _seconds(kernel, model, h: torch.Tensor) -> float:
    from thor_runtime.cache.kv_cache import KVCache

    cache = KVCache(model.cfg, h.shape[0] + 1, "fp32", torch.float32)
    t0 = time.perf_counter()
    kernel(h, cache, (), slice(-1, None))
    return time.perf_counter() - t0


def measure(model, rows, step) -> dict[str, float]:
    """Seconds per prompt of ``ROWS`` rows for each kernel, the fastest of ``ROUNDS`` rounds."""
    h = torch.randn(
        ROWS, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0)
    )  # [ROWS, D]
    kernels = {"rowstep": rows, "ort-step-graph": step}
    for k in kernels.values():  # warm-up: first-call costs
        _seconds(k, model, h[:16])
    best = {name: float("inf") for name in kernels}
    for _ in range(ROUNDS):
        for name, k in kernels.items():
            best[name] = min(best[name], _seconds(k, model, h))
    return best


def settled_by_build(rows) -> bool:
    """Whether the row kernel's build alone says it runs every prompt row (it regroups)."""
    return rows is not None and rows.group > 0


def prefill_on_rows(model, rows, step, verdict: dict[str, bool]) -> bool:
    """Whether the row kernel runs every prompt row of ``model``: with no step graph it is the
    fastest left; a regrouping build runs them; otherwise measured when ``verdict`` has no
    answer for this build of the row kernel."""
    if rows is None or step is None:
        return rows is not None
    if settled_by_build(rows):
        return True
    key = f"PrefillOnRows:{rows.build}"
    if key not in verdict:
        s = measure(model, rows, step)
        verdict[key] = s["rowstep"] < s["ort-step-graph"]
    return verdict[key]
