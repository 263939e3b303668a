"""What --spec auto learned, kept from one process to the next (speculative/auto_state.py): the
same numbers back in a new policy, nothing from a file of another key or a damaged one, and
greedy output unchanged whatever the state."""

from __future__ import annotations

import json

from thor_runtime.engine.generate import Runtime
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import SpecOptions, auto_state, build_speculation
from thor_runtime.speculative.budget import Cycle


def _auto(tiny, tmp_path):
    rt = Runtime(tiny.model, tiny.tokenizer, cost_cache=str(tmp_path))
    return rt, build_speculation(SpecOptions(method="auto"), tiny.model)


def _teach(sp):
    """Cycles in which the lookup arm drafted 6 and had 4 accepted, each 0.02 s besides its
    verify."""
    policy = sp.auto
    cls = policy.classes["free"]
    arm = next(a for a in cls.arms if a.proposer is not None)
    b = policy.pick(False, _flat(policy.rows), sp).budget
    st = b.start()
    for _ in range(40):
        b.cap(6, st)
        st = b.update(st, 6, 4, Cycle(7, 0, 0.01, 0.001, 0.0, 0.0, 1, 0.031, 5))
    return cls, arm


def _flat(rows):
    from thor_runtime.speculative.cost import CostCurve

    return CostCurve(tuple(1 + 0.05 * r for r in range(rows)), 0.01, "measured")


def test_a_new_process_starts_from_what_the_last_one_learned(tiny_llama, tmp_path):
    rt, sp = _auto(tiny_llama, tmp_path)
    cls, arm = _teach(sp)
    assert arm.tracks[1].sums[0] > 1 and cls.rest > 0.5
    path = auto_state.save(rt, sp)
    assert path is not None and path.exists() and path.parent == tmp_path / "costs"
    rt2, fresh = _auto(tiny_llama, tmp_path)
    cls2 = fresh.auto.classes["free"]
    arm2 = next(a for a in cls2.arms if a.name == arm.name)
    assert arm2.tracks[1].sums[0] == 0 and cls2.rest == 0
    assert auto_state.load(rt2, fresh) >= 1
    assert (
        arm2.tracks[1].sums == arm.tracks[1].sums and arm2.tracks[1].counts == arm.tracks[1].counts
    )
    assert arm2.draft == arm.draft and cls2.rest == cls.rest and fresh.auto.step_s == sp.auto.step_s
    # what it learned moves the choice of K, never the tokens
    prompt = tiny_llama.tokenizer.encode_chat(
        [{"role": "user", "content": "stack the red block on the blue one"}]
    )
    plain = rt2.generate(prompt, SamplingParams(max_tokens=24)).token_ids
    assert rt2.generate(prompt, SamplingParams(max_tokens=24), speculation=fresh).token_ids == plain


def test_a_file_of_another_key_or_a_damaged_one_is_ignored(tiny_llama, tmp_path):
    rt, sp = _auto(tiny_llama, tmp_path)
    _teach(sp)
    path = auto_state.save(rt, sp)
    doc = json.loads(path.read_text())
    for broken in (
        {**doc, "key": {**doc["key"], "format": -1}},  # another key
        {**doc, "state": {"classes": {"free": {"arms": {"ngram": {"tracks": [[[1], [2], 0.5]]}}}}}},
        "not json {",
    ):
        path.write_text(broken if isinstance(broken, str) else json.dumps(broken))
        rt2, fresh = _auto(tiny_llama, tmp_path)
        assert auto_state.load(rt2, fresh) == 0
        assert all(
            t.sums == [0.0] * len(t.sums)
            for c in fresh.auto.classes.values()
            for a in c.arms
            for t in a.tracks
        )
    # no cache directory ('' = keep nothing): nothing written, nothing read
    rt3 = Runtime(tiny_llama.model, tiny_llama.tokenizer, cost_cache="")
    assert auto_state.save(rt3, sp) is None and auto_state.load(rt3, sp) == 0
    # not --spec auto: nothing to keep
    assert (
        auto_state.save(rt, build_speculation(SpecOptions(method="ngram"), tiny_llama.model))
        is None
    )
