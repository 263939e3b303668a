"""Losslessness gate: identical, numerical tie, or mismatch — judged by a fresh reference
forward."""

from __future__ import annotations

import pytest
import torch

from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative.lossless import first_divergence, judge, summarize


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], []) is None


@pytest.mark.parametrize("kv", ["fp32", "fp8"])
def test_judge_tie_and_mismatch(tiny_llama, kv):
    model, tok = tiny_llama.model, tiny_llama.tokenizer
    rt = Runtime(model, tok, kv_dtype=kv)
    ids = tok.encode("pick up the red cup and place it on the table")
    plain = rt.generate(ids, SamplingParams(max_tokens=12, ignore_eos=True)).token_ids
    assert judge(rt, ids, plain, list(plain)).status == "identical"

    j = 5
    # The gap between the top two tokens at position j, from a forward of our own.
    cache = rt.new_cache(len(ids) + j + 1)
    logits = model.forward(torch.tensor(ids + plain[:j]), cache).logits[-1]  # [V]
    top2 = logits.topk(2)
    assert int(top2.indices[0]) == plain[j]
    gap = float(top2.values[0] - top2.values[1])
    assert gap > 1e-3
    other = plain[:j] + [int(top2.indices[1])] + plain[j + 1 :]

    tie = judge(rt, ids, plain, other, tol=gap * 1.01)
    assert (tie.status, tie.position, tie.plain_token, tie.other_token) == (
        "tie",
        j,
        plain[j],
        other[j],
    )
    assert tie.regret == pytest.approx(gap, abs=1e-3) and tie.lossless
    bad = judge(rt, ids, plain, other, tol=gap * 0.5)
    assert bad.status == "mismatch" and not bad.lossless
    # A run that stops early is a stop decision, never a tie, whatever the tolerance.
    assert judge(rt, ids, plain, plain[:-1], tol=1e9).status == "mismatch"

    s = summarize([judge(rt, ids, plain, plain), tie, bad])
    assert s["gate"] == "mismatch" and s["lossless"] is False
    assert [d["prompt"] for d in s["divergences"]] == [1, 2]
    assert summarize([tie])["lossless"] is True


def test_judge_rejects_negative_tolerance(tiny_llama):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    with pytest.raises(ValueError, match="tolerance"):
        judge(rt, [1, 2], [3, 4], [3, 5], tol=-1)
