"""The draft budget: few drafts while the proposer is rarely right, all K otherwise."""
from __future__ import annotations

import pytest

from thor_runtime.errors import ThorError
from thor_runtime.generate import Runtime
from thor_runtime.sampling import SamplingParams
from thor_runtime.spec.base import Proposer
from thor_runtime.spec.budget import DraftBudget


class _Scripted(Proposer):
    """Drafts the known continuation (oracle) or a token that is never right (wrong)."""

    def __init__(self, prompt_len: int, answer: list[int], wrong: bool):
        self.p, self.answer, self.wrong, self.asked = prompt_len, answer, wrong, []

    def propose(self, seq, k):
        self.asked.append(k)
        done = len(seq) - self.p
        if self.wrong:
            bad = next(t for t in range(1000) if t not in self.answer)
            return [bad] * k, None
        return self.answer[done:done + k], None


def test_budget_validation():
    for bad in (dict(low_k=0), dict(threshold=-1.0), dict(decay=0.0), dict(decay=1.5)):
        with pytest.raises(ThorError):
            DraftBudget(**bad)
    b = DraftBudget(low_k=2, threshold=0.5, decay=0.5)
    m = b.start(8)
    assert b.cap(8, m) == 8
    m = b.update(b.update(m, 0), 0)          # 8 -> 4 -> 2: still above the threshold
    assert b.cap(8, m) == 8
    m = b.update(b.update(b.update(b.update(m, 0), 0), 0), 0)
    assert m < 0.5 and b.cap(8, m) == 2 and b.cap(1, m) == 1
    assert b.cap(8, b.update(m, 2)) == 8     # a probe that is accepted lifts the cap again


@pytest.mark.parametrize("wrong", [True, False])
def test_budget_caps_a_wrong_proposer_only(tiny_llama, wrong):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ids = tiny_llama.tokenizer.encode("the robot picks up the cup and")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = rt.generate(ids, params).token_ids
    prop = _Scripted(len(ids), plain, wrong)
    res = rt.generate(ids, params, proposer=prop, k=8)
    assert res.token_ids == plain                           # drafts never change the output
    if wrong:
        assert res.stats.capped_cycles > 0 and max(prop.asked[-5:]) <= 2
        free = rt.generate(ids, params, proposer=_Scripted(len(ids), plain, True), k=8, draft_budget=None)
        assert free.token_ids == plain and free.stats.capped_cycles == 0
        assert free.stats.drafted > res.stats.drafted
    else:
        assert res.stats.capped_cycles == 0 and res.stats.accepted == res.stats.drafted
