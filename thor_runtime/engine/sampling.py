"""Sampling parameters and the target distribution they define."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thor_runtime.config import SamplingSettings as _Defaults
from thor_runtime.errors import ThorError


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = _Defaults.temperature  # 0 = greedy
    top_k: int = _Defaults.top_k  # 0 = off
    top_p: float = _Defaults.top_p
    seed: int | None = _Defaults.seed
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ThorError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ThorError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ThorError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ThorError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ThorError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits [R, V] -> probabilities [R, V] after temperature, top-k and top-p.

    Speculative sampling compares against exactly this distribution, so plain and
    speculative sampling share it.
    """
    # Each row shifted to its largest logit first: a tiny temperature (1e-40 is a valid request)
    # sends logit / t to +-inf and the softmax to NaN; shifted, the largest stays 0 and the others
    # go to -inf, the greedy limit. Softmax is shift-invariant, so nothing else moves. t is held
    # to fp32's smallest normal number: below it, as an fp32 divisor, it would be 0.
    x = logits.float()
    x = (x - x.amax(-1, keepdim=True)) / max(
        p.temperature, torch.finfo(torch.float32).tiny
    )  # [R, V]
    if p.top_k and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[..., -1:]  # [R, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        sx, si = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sx, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sx, dim=-1) >= p.top_p  # keep the token that crosses top_p
        sx = sx.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, si, sx)
    return torch.softmax(x, dim=-1)


def make_generator(seed: int | None) -> torch.Generator:
    if seed is not None and not 0 <= seed < 2**64:  # manual_seed's range; past it, an overflow
        raise ThorError(f"seed must be in [0, 2**64), got {seed}")
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else torch.seed() % (2**63))
    return g
