"""Acceptance policies: pure functions on tensors, no model access.

Vocabulary (as vLLM's rejection sampler): of K drafts, the *accepted* ones are the
longest prefix the policy keeps; then one more token is always committed — the
*recovered* token at the first rejection, or the *bonus* token after all K were
accepted. So a cycle commits 1..K+1 tokens, and K = 0 is plain decoding.

Every policy takes ``logits [K+1, V]`` where row j is the target's prediction after
the anchor and drafts d1..dj, and returns ``(n_accepted, committed)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thor_runtime.config import RELAXED_MARGINS
from thor_runtime.config import SpeculationSettings as _Defaults
from thor_runtime.errors import ThorError


def accept_strict(logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, list[int]]:
    """Greedy: keep drafts equal to the target argmax; then the argmax at the first miss."""
    return accept_greedy(rows_argmax(logits), drafts)  # [K+1]: the one sync of a cycle


def rows_argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [R, V] -> [R], each row's first maximum (torch's and numpy's rule alike). On a CPU
    numpy's, on the logits' own memory: torch's argmax of several 151,936-wide rows runs on its
    OpenMP pool, whose threads then spin on the cores the next verify's threads need (prompt
    lookup on chat decoded ~1.15x faster without it, docs/performance.md)."""
    if logits.device.type == "cpu" and logits.dtype in (
        torch.float32,
        torch.float64,
        torch.float16,
    ):
        return torch.from_numpy(logits.detach().numpy().argmax(-1))
    return logits.argmax(-1)


def accept_greedy(target: torch.Tensor, drafts: torch.Tensor) -> tuple[int, list[int]]:
    """accept_strict on the rows' argmax ids, target [K+1], found by the caller."""
    target = target.to(drafts.device)
    k = drafts.shape[0]
    n = int(torch.cumprod((drafts == target[:k]).int(), 0).sum()) if k else 0
    return n, drafts[:n].tolist() + [int(target[n])]


@dataclass(frozen=True)
class RelaxedConfig:
    """Relaxed acceptance inside a thinking span [begin_id ... end_id] and, with ``spans``,
    inside the free-text spans the constraint names (``Constraint.relaxed_spans``).

    A draft inside a span is kept when it is in the target's top-k and its margin to the
    top-1 is <= delta. margin="logit" compares raw logits (as FlashRT does);
    margin="prob" compares softmax probabilities (as TensorRT-LLM's MTP does).
    Default: logit margin, top-k 3, delta 2.0 — loose enough to pay off, and only ever
    applied to text the planner never parses. begin_id / end_id None: no thinking span
    (a tokenizer without <think>), only the constraint's spans.
    """

    begin_id: int | None
    end_id: int | None
    top_k: int = _Defaults.relaxed_topk
    delta: float = _Defaults.relaxed_delta
    margin: str = _Defaults.relaxed_margin
    spans: bool = False

    def __post_init__(self):
        if self.margin not in RELAXED_MARGINS:
            raise ThorError(f"relaxed margin must be 'logit' or 'prob', got {self.margin!r}")
        if self.top_k < 1 or self.delta < 0:
            raise ThorError("relaxed acceptance needs top_k >= 1 and delta >= 0")
        if (self.begin_id is None) != (self.end_id is None):
            raise ThorError("relaxed acceptance: give both thinking tokens or neither")
        if self.begin_id is not None and self.begin_id == self.end_id:
            raise ThorError("relaxed acceptance: begin and end thinking tokens must differ")
        if self.begin_id is None and not self.spans:
            raise ThorError(
                "relaxed acceptance needs a thinking span or free-text spans; neither is set"
            )


def in_thinking(seq: list[int], cfg: RelaxedConfig) -> bool:
    """True when the last begin-thinking token in ``seq`` has not been closed."""
    if cfg.begin_id is None:
        return False
    for t in reversed(seq):
        if t == cfg.end_id:
            return False
        if t == cfg.begin_id:
            return True
    return False


def thinking_flags(drafts: list[int], inside: bool, cfg: RelaxedConfig) -> list[bool]:
    """Per draft: whether it may be relaxed as thinking text. ``inside``: the anchor is inside
    the span. The draft that closes the span is checked strictly; a begin token opens it for
    the drafts after it."""
    out = []
    for d in drafts:
        out.append(inside and d != cfg.end_id)
        if d == cfg.end_id:
            inside = False
        elif d == cfg.begin_id:
            inside = True
    return out


def accept_relaxed_at(
    logits: torch.Tensor, drafts: torch.Tensor, relax: list[bool], cfg: RelaxedConfig
) -> tuple[int, list[int], int]:
    """``relax[j]``: draft j may be kept by the relaxed rule; every other draft must equal the
    target's argmax. -> (n_accepted, committed, how many of the accepted the relaxed rule kept
    that strict acceptance would have refused)."""
    target = logits.argmax(-1)  # [K+1]
    k = drafts.shape[0]
    if cfg.margin == "prob":
        score = torch.softmax(logits.float(), dim=-1)  # [K+1, V]
    else:
        score = logits.float()
    n = relaxed = 0
    for j in range(k):
        d = int(drafts[j])
        ok = d == int(target[j])
        if not ok and j < len(relax) and relax[j]:
            row = score[j]
            topk = torch.topk(row, min(cfg.top_k, row.shape[0])).indices
            ok = bool((topk == d).any()) and float(row.max() - row[d]) <= cfg.delta
            relaxed += ok
        if not ok:
            break
        n += 1
    return n, drafts[:n].tolist() + [int(target[n])], relaxed


def accept_relaxed(
    logits: torch.Tensor, drafts: torch.Tensor, inside: bool, cfg: RelaxedConfig
) -> tuple[int, list[int]]:
    """``inside``: whether the anchor is inside a thinking span. Outside the span, and
    for the draft that closes it, the check is strict; a begin token opens it for the
    drafts after it."""
    n, committed, _ = accept_relaxed_at(
        logits, drafts, thinking_flags(drafts.tolist(), inside, cfg), cfg
    )
    return n, committed


def accept_sampling(
    probs: torch.Tensor,
    drafts: torch.Tensor,
    gen: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> tuple[int, list[int]]:
    """Speculative sampling (Leviathan et al.; Chen et al.).

    probs [K+1, V]: the target distribution per row; draft_probs [K, V]: the proposal's
    (None = deterministic proposer, i.e. one-hot on the draft). Draft j is kept with
    probability min(1, p/q); at the first rejection the token is drawn from the
    normalized residual (p - q)+, after all K the bonus from p[K]. The committed tokens
    are then distributed exactly as the target's.
    """
    k = drafts.shape[0]
    for j in range(k):
        d = int(drafts[j])
        p = probs[j]
        q_d = 1.0 if draft_probs is None else float(draft_probs[j, d])
        if q_d > 0 and float(torch.rand((), generator=gen)) < min(1.0, float(p[d]) / q_d):
            continue
        if draft_probs is None:
            resid = p.clone()
            resid[d] = 0.0
        else:
            resid = (p - draft_probs[j]).clamp_min(0.0)
        s = resid.sum()
        resid = resid / s if s > 0 else p  # p == q exactly: any draw from p is right
        return j, drafts[:j].tolist() + [int(torch.multinomial(resid, 1, generator=gen))]
    return k, drafts.tolist() + [int(torch.multinomial(probs[k], 1, generator=gen))]
