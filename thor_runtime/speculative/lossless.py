"""Losslessness gate: is a speculative run's output plain decoding's, and where it is not, was
the difference a numerical tie?

Why a gate and not only ``==``: a K+1-row verify forward and a 1-row decode step run different
matmul kernels (GEMM vs GEMV on CPU, other tile shapes on GPU), so the same token's hidden
state differs in the last bits. With fp32 weights and fp32 KV that noise is ~1e-6 in the
logits and greedy output stays identical. With FP8 KV (3 mantissa bits) a last-bit difference
that lands on a rounding boundary moves a stored K/V value by a whole e4m3 step, and plain
decoding itself then flips near-ties when only the thread count changes. A divergence is
accepted as lossless when both tokens are within ``tol`` logits of the top-1 of a fresh
reference forward at that position (a tie under the reference; the same rule FlashRT's gate
uses with 0.20 nat); anything else is a logic error and fails the gate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

DEFAULT_TIE_TOL = (
    0.25  # logits; fp8 KV thread-count noise was measured up to ~0.2 (docs/performance.md)
)


@dataclass(frozen=True)
class Verdict:
    status: str  # "identical" | "tie" | "mismatch"
    position: int | None = None  # first generated position where the outputs differ
    plain_token: int | None = None
    other_token: int | None = None
    regret: float | None = None  # max over the two tokens of (top-1 logit - token logit)

    @property
    def lossless(self) -> bool:
        return self.status != "mismatch"

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """First index where a and b differ (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.inference_mode()
def reference_logits(runtime, prompt_ids: list[int], prefix: list[int]) -> torch.Tensor:
    """Next-token logits [V] after prompt + prefix from one fresh prefill in the runtime's own
    weights and KV dtype (a third computation, independent of both runs being compared)."""
    ids = list(prompt_ids) + list(prefix)
    cache = runtime.new_cache(len(ids) + 1)
    return runtime.model.prefill(
        torch.tensor(ids, dtype=torch.long), cache, runtime.prefill_chunk
    ).logits[-1]


def judge(
    runtime, prompt_ids: list[int], plain: list[int], other: list[int], tol: float = DEFAULT_TIE_TOL
) -> Verdict:
    """Compare another run's tokens with plain decoding's (same prompt, same settings)."""
    if tol < 0:
        raise ValueError(f"tie tolerance must be >= 0, got {tol}")
    j = first_divergence(plain, other)
    if j is None:
        return Verdict("identical")
    if j >= min(len(plain), len(other)):
        # One run stopped where the other went on: a stop decision, never a tie.
        return Verdict("mismatch", position=j)
    a, b = plain[j], other[j]
    logits = reference_logits(runtime, prompt_ids, plain[:j]).float()  # [V]
    top = float(logits.max())
    regret = max(top - float(logits[a]), top - float(logits[b]))
    return Verdict("tie" if regret <= tol else "mismatch", j, a, b, round(regret, 4))


def summarize(verdicts: list[Verdict]) -> dict:
    """Per-prompt verdicts -> {"gate": worst status, "lossless": bool, "divergences": [...]}."""
    order = ("identical", "tie", "mismatch")
    worst = max((v.status for v in verdicts), key=order.index, default="identical")
    return {
        "gate": worst,
        "lossless": all(v.lossless for v in verdicts),
        "divergences": [
            {"prompt": i, **v.to_dict()} for i, v in enumerate(verdicts) if v.status != "identical"
        ],
    }
