"""Exact by construction, the comparison: one-row steps against one verify over the same ids,
compared bit for bit (logits, taps and the cache's K/V)."""

from __future__ import annotations

import torch

from thor_runtime.cache.kv_cache import KVCache

PROMPT = (
    "The robot picks up the red mug and places it in the dish rack, then it goes back to the "
    "dock and"
)


def steps_vs_verify(model, ids, split, kv, taps=()):
    """(one-row steps, one verify) over ids[split:], each after the same prefill."""
    runs = []
    for one_row in (True, False):
        cache = KVCache(model.cfg, len(ids) + 4, kv, model.dtype)
        model.prefill(ids[:split], cache)
        if one_row:
            outs = [model.verify(ids[j : j + 1], cache, taps) for j in range(split, len(ids))]
            logits = torch.cat([o.logits for o in outs])
            tap = {i: torch.cat([o.taps[i] for o in outs]) for i in taps}
        else:
            o = model.verify(ids[split:], cache, taps)
            logits, tap = o.logits, o.taps
        runs.append((logits, tap, cache))
    return runs


def assert_same(a, b):
    (la, ta, ca), (lb, tb, cb) = a, b
    assert torch.equal(la, lb)
    assert ta.keys() == tb.keys() and all(torch.equal(ta[i], tb[i]) for i in ta)
    n = ca.length
    assert cb.length == n
    assert torch.equal(ca.k[:, :, :n], cb.k[:, :, :n])
    assert torch.equal(ca.v[:, :, :n], cb.v[:, :, :n])
