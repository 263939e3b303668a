"""The draft budget: few drafts while the proposer is rarely right, all K otherwise."""

from __future__ import annotations

import pytest

from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import Speculation
from thor_runtime.speculative.base import Proposer
from thor_runtime.speculative.budget import DraftBudget


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
        return self.answer[done : done + k], None


def test_budget_validation_and_schedule():
    for bad in (
        dict(low_k=0),
        dict(probe_every=0),
        dict(threshold=-1.0),
        dict(decay=0.0),
        dict(decay=1.5),
        dict(initial=-1.0),
    ):
        with pytest.raises(ThorError):
            DraftBudget(**bad)
    b = DraftBudget(low_k=2, threshold=0.5, decay=0.5, probe_every=3, initial=2.0, ramp=0.0)
    s = b.start()
    assert b.cap(8, s) == 8
    caps = []
    for _ in range(9):  # the proposer is never right
        caps.append(b.cap(8, s))
        s = b.update(s, caps[-1], 0)
    # three full cycles (mean 2 -> 1 -> 0.5 -> 0.25), then a probe of 2 drafts every third cycle
    assert caps == [8, 8, 8, 0, 0, 2, 0, 0, 2]
    assert b.cap(1, s) in (0, 1)
    s = b.update(s, 0, 0)  # a cycle without drafts leaves the mean alone
    assert s[0] < 0.5
    assert b.cap(8, b.update(s, 2, 1)) == 8  # one accepted probe lifts the pause


def test_budget_ramp_and_probe_backoff():
    b = DraftBudget(
        low_k=2, threshold=0.5, decay=0.25, probe_every=4, initial=4.0, ramp=3.0, max_gap=32
    )
    s = b.start()
    caps = []
    for _ in range(200):  # never right: low_k drafts until the pause, then rarer probes
        caps.append(b.cap(15, s))
        s = b.update(s, caps[-1], 0)
    assert caps[:8] == [2] * 8 and caps[8] == 0
    probes = [i for i, c in enumerate(caps) if c and i > 10]
    gaps = [j - i for i, j in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and max(gaps) <= 33 and len(probes) < 200 // 8
    s, caps = b.start(), []
    for _ in range(4):  # right every time: 2 -> 8 -> 15 drafts
        caps.append(b.cap(15, s))
        s = b.update(s, caps[-1], caps[-1])
    assert caps == [2, 8, 15, 15]
    with pytest.raises(ThorError):
        DraftBudget(ramp=-1.0)


@pytest.mark.parametrize("wrong", [True, False])
def test_budget_caps_a_wrong_proposer_only(tiny_llama, wrong):
    rt = Runtime(tiny_llama.model, tiny_llama.tokenizer)
    ids = tiny_llama.tokenizer.encode("the robot picks up the cup and")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = rt.generate(ids, params).token_ids
    prop = _Scripted(len(ids), plain, wrong)
    res = rt.generate(ids, params, speculation=Speculation(prop, 8, DraftBudget()))
    assert res.token_ids == plain  # drafts never change the output
    if wrong:
        # after the pause starts the proposer is asked on one cycle in four, for 2 drafts
        assert res.stats.capped_cycles > res.stats.cycles // 2 and max(prop.asked[-3:]) <= 2
        assert len(prop.asked) < res.stats.cycles // 2
        free = rt.generate(
            ids, params, speculation=Speculation(_Scripted(len(ids), plain, True), 8)
        )
        assert free.token_ids == plain and free.stats.capped_cycles == 0
        assert free.stats.drafted > res.stats.drafted
    else:
        # a right proposer is capped only while the request starts (2, then 2 + 3 * 2 drafts)
        assert res.stats.capped_cycles <= 2 and res.stats.accepted == res.stats.drafted
