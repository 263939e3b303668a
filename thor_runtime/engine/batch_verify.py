"""The verifies of several sequences as one forward: in-flight batching's math (inflight.py
gathers the calls).

Each call is one sequence's verify — anchor + drafts after its cache — and each gets back
exactly what ``model.verify`` gives it alone, bit for bit, whoever shares the forward. That
holds by the same construction that makes a verify row a 1-row step's bits (exactness.py):
the dense work runs on row-invariant kernels (probed at load, RowLoop otherwise) in chunks of
at most EXACT_ROWS rows, so a row's bits do not depend on the rows beside it, and attention
runs per row over that row's own sequence. Rows of different sequences therefore share the
weights' trip through memory (the point of batching on a CPU: a 4-row projection costs about
1.7 1-row ones) and nothing else.

Which form runs follows the kernel the runner picks for each call: the row kernel takes rows of
several caches in one call (rowstep.py ``many``), the layer path (torch, engine backends, the
fused graphs) takes concatenated rows with attention split by sequence. A kernel that binds one
cache per call (the ORT step graph), the padded verify and hybrid targets run the calls one
after another: still exact, not faster. The fixed-shape decoder (fixed_shape.py, CUDA) keeps a
KV slot per sequence and runs them as the one forward it runs anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from thor_runtime.engine.constraint import reads_part
from thor_runtime.engine.exactness import EXACT_ROWS
from thor_runtime.errors import ThorError
from thor_runtime.models.dense import ForwardOut


@dataclass
class VerifyCall:
    ids: torch.Tensor  # [T] anchor + drafts
    cache: object
    taps: tuple[int, ...] = ()
    cols: object = None  # the ids whose logits the caller reads (None: all)


def verify_many(model, verify: Callable, calls: list[VerifyCall]) -> list[ForwardOut]:
    """``verify`` is the runtime's own (what a call alone would run); one ForwardOut per call."""
    form = _form(model, verify, calls)
    if form is None:
        return [verify(c.ids, c.cache, taps=c.taps, cols=c.cols) for c in calls]
    for c in calls:
        if c.cache.length + c.ids.shape[0] > model.cfg.max_position_embeddings:
            raise ThorError(
                f"sequence of {c.cache.length + c.ids.shape[0]} tokens exceeds the model context "
                f"{model.cfg.max_position_embeddings}"
            )
    return form(model, calls)


def slotted(verify):
    """The fixed-shape decoder with several slots whose verify this is, or None."""
    owner = getattr(verify, "__self__", None)
    return owner if getattr(owner, "slots", 1) > 1 and hasattr(owner, "verify_many") else None


def shares(model, verify) -> bool:
    """Whether rounds of this model and verify run as one forward (else one call after another)."""
    if slotted(verify) is not None:
        return True
    if model.is_hybrid or getattr(verify, "__self__", None) is not model:
        return False
    r = model.runner
    return r is None or r.rows is not None or r.step is None


def _form(model, verify, calls):
    """The batched form that runs these calls as their verifies alone would, or None."""
    if len(calls) < 2 or not shares(model, verify):
        return None
    decoder = slotted(verify)
    if decoder is not None:  # every forward runs all its slots' rows anyway
        return lambda model, calls: decoder.verify_many(calls)
    r = model.runner
    if r is None:
        return _layers_with(model.segments(True))
    picks = {r.pick(c.cache, c.ids.shape[0], True).name for c in calls}
    if picks == {"rowstep"}:
        return _rowstep
    if picks == {"torch"}:
        return _layers_with(model)
    if picks == {"engine"}:
        return _layers_with(model.segments(True))
    if picks == {"fused-graphs"}:
        from thor_runtime.engine.runner import FusedSegments

        return _layers_with(FusedSegments(model, r.fused))
    return None


def _spans(calls) -> list[tuple[int, int]]:
    out, a = [], 0
    for c in calls:
        out.append((a, a + c.ids.shape[0]))
        a += c.ids.shape[0]
    return out


def _split(calls, taps: dict[int, torch.Tensor], logits: torch.Tensor) -> list[ForwardOut]:
    """Concatenated rows back to one ForwardOut per call, each with the taps it asked for."""
    return [
        ForwardOut(logits[a:b], {i: taps[i][a:b] for i in c.taps})
        for c, (a, b) in zip(calls, _spans(calls))
    ]


def _chunked(fn, *rows_first):
    """fn over row chunks of at most EXACT_ROWS rows (the widest call the row-invariance probes
    cover), outputs concatenated: tensors shaped [N, ...] by rows, [H, N, Dh] by dim -2."""
    N = rows_first[0].shape[0]
    if N <= EXACT_ROWS:
        return fn(*rows_first)
    parts = [fn(*(t[s : s + EXACT_ROWS] for t in rows_first)) for s in range(0, N, EXACT_ROWS)]
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    return tuple(torch.cat(p, dim=0 if p[0].dim() == 2 else -2) for p in zip(*parts))


def _layers_with(seg):
    def run(model, calls):
        return _layers(model, seg, calls)

    return run


@torch.inference_mode()
def _layers(model, seg, calls) -> list[ForwardOut]:
    """The layer path over every call's rows: dense segments on the concatenation, attention
    per sequence (exact: each row over its own prefix)."""
    dev, n = model.device, model.cfg.num_layers
    spans = _spans(calls)
    model.ensure_positions(max(c.cache.length + c.ids.shape[0] for c in calls))
    h = torch.cat([seg.embed(c.ids.to(dev)) for c in calls])  # [N, D]
    pos = torch.cat(
        [torch.arange(c.cache.length, c.cache.length + c.ids.shape[0], device=dev) for c in calls]
    )  # [N]
    want = set().union(*(c.taps for c in calls))
    taps: dict[int, torch.Tensor] = {}
    q, k, v = _chunked(
        lambda hh, pp: seg.pre_attn(0, hh, pp), h, pos
    )  # q [H, N, Dh], k/v [Hkv, N, Dh]
    for i in range(n):
        o = torch.cat(
            [
                model.attention(i, q[:, a:b], k[:, a:b], v[:, a:b], c.cache, exact=True)
                for c, (a, b) in zip(calls, spans)
            ]
        )  # [N, H Dh]
        if i + 1 < n:
            h, q, k, v = _chunked(lambda hh, oo, pp: seg.post_pre(i, hh, oo, pp), h, o, pos)
        else:
            h = _chunked(lambda hh, oo: seg.post_attn(i, hh, oo), h, o)
        if i in want:
            taps[i] = h
    return _split(calls, taps, _chunked(seg.head, h))


def _rowstep(model, calls) -> list[ForwardOut]:
    """The row kernel, MAX_ROWS rows per call; a sequence's rows may span two calls in order
    (its later rows then see the K/V the earlier call wrote, as in a chunked verify). Each
    sequence's logits are computed over the ids it reads (rowstep.py ``many``)."""
    from thor_runtime.kernels.rowstep import MAX_ROWS

    kern = model.runner.rows
    want = tuple(sorted(set().union(*(c.taps for c in calls))))
    pieces: list[tuple[int, int, int]] = []  # (call, first row, rows) in row order
    for j, c in enumerate(calls):
        for s in range(0, c.ids.shape[0], MAX_ROWS):
            pieces.append((j, s, min(MAX_ROWS, c.ids.shape[0] - s)))
    groups, cur, used = [], [], 0
    for p in pieces:
        if used + p[2] > MAX_ROWS or any(q[0] == p[0] for q in cur):  # one stretch per cache a call
            groups.append(cur)
            cur, used = [], 0
        cur.append(p)
        used += p[2]
    groups.append(cur)
    taps_parts: dict[int, list] = {i: [] for i in want}
    logit_parts: list[list] = [[] for _ in calls]
    for g in groups:
        ids = torch.cat([calls[j].ids[s : s + m] for j, s, m in g])
        h = model.embed(ids.to(model.device))  # [n, D]
        t, lg = kern.many(
            h,
            [calls[j].cache for j, _, _ in g],
            [m for _, _, m in g],
            want,
            [reads_part(calls[j].cols, s, s + m) for j, s, m in g],
        )
        for (j, _, _), part in zip(g, lg):
            logit_parts[j].append(part)
        for i in want:
            taps_parts[i].append(t[i])
    # groups are consecutive runs of the pieces, which follow the calls' rows in order; joined
    # by numpy, as a torch copy of this size wakes torch's pool beside the kernel's (rowstep.py)
    taps = {i: _joined(p) for i, p in taps_parts.items()}
    return [
        ForwardOut(_joined(parts), {i: taps[i][a:b] for i in c.taps})
        for c, parts, (a, b) in zip(calls, logit_parts, _spans(calls))
    ]


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """Row blocks one after another ([n_i, C] -> [sum n_i, C]); one block as it is."""
    return (
        parts[0]
        if len(parts) == 1
        else torch.from_numpy(np.concatenate([p.numpy() for p in parts]))
    )
