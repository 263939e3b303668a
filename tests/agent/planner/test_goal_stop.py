"""A plan whose goal alone shows the task cannot be done ends at its goal: the grammar allows
only end-of-sequence once the steps open, so no steps are decoded toward the token budget."""

from __future__ import annotations

import json

import numpy as np
import torch

from agent.files.loader import base_plan_schema
from agent.schema.grammar import Grammar, GrammarTokenizer
from agent.schema.specialize import specialize
from agent.symbolic.solver import goal_stop
from tests.helpers.worlds import good_plan, world_and_skills

# one arm move, as the planner model looped it on "move the apple to the table"
ARM = {
    "id": "s1",
    "skill": "move_arm",
    "args": {"position": [-0.45, 0.4, 0.75], "speed": 0.05},
    "preconditions": [],
    "expected_effects": [],
    "timeout_s": 10,
    "on_failure": "retry",
}


def _walk(tok, gtok, grammar, plan, stop):
    """Commit the plan's tokens one by one; -> (constraint, tokens committed before the cut)."""
    c = grammar.constraint(stop=stop)
    ids = tok.encode(json.dumps(plan, separators=(",", ":")), add_special=False)
    for i, t in enumerate(ids):
        if c.cut:
            return c, i
        c.advance(t)
    return c, len(ids)


def test_an_infeasible_goal_ends_the_plan_before_its_steps(tiny_llama):
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    gtok = GrammarTokenizer(tok)
    grammar = Grammar(gtok, specialize(base_plan_schema(), w, s))
    stop = goal_stop(w, s)
    for goal in (
        [{"object": "cast_iron_pan", "at": "table"}],  # 3.2 kg > 2 kg
        [{"missing": "toaster"}],
        [{"every": {"type": "cup"}, "at": "top_shelf"}, {"do": "wait", "args": {"duration": 9}}],
    ):  # out of reach
        plan = {**good_plan(), "goal": goal}
        c, n = _walk(tok, gtok, grammar, plan, stop)
        text = json.dumps(plan, separators=(",", ":"))
        assert c.cut and n <= len(
            tok.encode(text[: text.index('"steps":[') + 12], add_special=False)
        ), goal
        # only EOS from here, in masks, drafts and forced tokens; and it ends the plan
        width = gtok.n_vocab
        rows = c.mask_rows(torch.zeros(2, width), [gtok.eos_ids[0]])
        assert set(np.flatnonzero(rows[0].isfinite().numpy())) == set(gtok.eos_ids)
        assert c.forced() == [] and c.valid_prefix([5, 6]) == 0 and c.is_accepting()
        c.advance(gtok.eos_ids[0])
        assert c.finished
    # a goal that can be done decodes its steps as before
    c, n = _walk(tok, gtok, grammar, good_plan(), stop)
    assert not c.cut and c.is_accepting()


def _opening(text: str, k: int) -> int:
    """Where the k-th step's first key (``"skill":``) starts in ``text``."""
    return [i for i in range(len(text)) if text.startswith('"skill":', i)][k - 1]


def _cut_at(tok, text: str, k: int, n: int) -> bool:
    """Whether ``n`` tokens end at the token that completes the k-th step's key, not before it."""
    at = _opening(text, k)
    return (
        len(tok.encode(text[: at + 7], add_special=False))
        <= n
        <= len(tok.encode(text[: at + 8], add_special=False))
    )


def test_steps_past_the_goal_or_twice_the_solvers_are_cut(tiny_llama):
    """A goal the solver reaches in n steps leaves the model max(2n, n + 2) steps, and none past
    the ones that already do the goal: a plan that repeats its steps after doing the goal ends
    as the next one opens, with the steps that did it kept; one whose steps never do it ends
    past the cap (the planner then takes the solver's steps, as for a plan the token budget
    cut); one within both decodes as before."""
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    gtok = GrammarTokenizer(tok)
    grammar = Grammar(gtok, specialize(base_plan_schema(), w, s))
    stop = goal_stop(w, s)
    plan = good_plan()
    c, _ = _walk(tok, gtok, grammar, plan, stop)
    assert stop.step_cap == 4 and not c.cut and c.is_accepting()  # pick, place: n = 2
    assert stop.done_steps is None
    pair = plan["steps"]
    runaway = {
        **plan,
        "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(pair * 4)],
    }  # 8 steps
    c, n = _walk(tok, gtok, grammar, runaway, stop)
    text = json.dumps(runaway, separators=(",", ":"))
    assert c.cut and c.steps == 3 and _cut_at(tok, text, 3, n)
    assert stop.done_steps == runaway["steps"][:2] and c.forced() == [] and c.is_accepting()
    assert stop.done_plan(text[: _opening(text, 3)]) == {**runaway, "steps": runaway["steps"][:2]}
    assert stop.done_plan(text.replace('"at":"table"', '"at":"sink"')) is None  # another goal
    # steps that put the apple back where it was never do the goal: the cap ends them
    back = [pair[0], {**pair[1], "args": {"object": "apple", "target": "counter"}}]
    loop = {**plan, "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(back * 4)]}
    c, n = _walk(tok, gtok, grammar, loop, stop)
    assert c.cut and c.steps == 5 and _cut_at(tok, json.dumps(loop, separators=(",", ":")), 5, n)
    assert stop.done_steps is None
    # the same call twice in a row: looping, ended as the third step opens (the solver's
    # steps are taken); the planner model wrote this one to the cap for "move the apple to the
    # table"
    spin = {**plan, "steps": [{**ARM, "id": f"s{i + 1}"} for i in range(6)]}
    c, n = _walk(tok, gtok, grammar, spin, stop)
    assert c.cut and c.steps == 3 and _cut_at(tok, json.dumps(spin, separators=(",", ":")), 3, n)
    assert stop.done_steps is None
    two = {
        **spin,
        "steps": [spin["steps"][0], {**spin["steps"][1], "args": {**ARM["args"], "speed": 0.1}}]
        * 3,
    }
    c, _ = _walk(tok, gtok, grammar, two, stop)
    assert c.cut and c.steps == 5  # alternating calls: the cap
    # a goal that asks for a call: its steps are its own to repeat (the cap still holds)
    scans = {**spin, "goal": [{"do": "move_arm", "args": {"position": [-0.45, 0.4, 0.75]}}]}
    c, _ = _walk(tok, gtok, grammar, scans, stop)
    assert (
        stop.step_cap is not None
        and c.cut
        and c.steps == stop.step_cap + 1
        and stop.done_steps is None
    )
    # a goal the solver cannot reach leaves the steps uncapped and unchecked
    stop = goal_stop(w, s, max_steps=1)
    c, _ = _walk(tok, gtok, grammar, runaway, stop)
    assert stop.step_cap is None and not c.cut


def _committed_rows(grammar, stop, ids, start, drafts, width):
    """-> (rows, n): row j the legal ids after committing ids[:start] + drafts[:j] one token at
    a time, as plain decoding meets them, up to the first draft a row refuses (or EOS); n the
    drafts legal in turn."""
    c = grammar.constraint(stop=stop)
    for t in ids[:start]:
        c.advance(t)
    rows = []
    for t in list(drafts) + [None]:
        rows.append(c._allowed(width))
        if t is None or not rows[-1][t]:
            break
        if t in c.eos:
            return rows, len(rows)
        c.advance(t)
    return rows, len(rows) - 1


def test_drafts_that_end_a_plan_mask_as_committing_them_does(tiny_llama):
    """Speculative output is plain decoding's only if the masks over a cycle's drafts are the
    masks committing those drafts one by one would meet. A draft that ends the plan (a refused
    goal, a step after the goal is done, a repeated call, the step cap) leaves only EOS legal
    in the rows after it, and walking the drafts changes nothing in the constraint or the
    check: every window of every plan, against a fresh constraint committing it."""
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    gtok = GrammarTokenizer(tok)
    grammar = Grammar(gtok, specialize(base_plan_schema(), w, s))
    plan = good_plan()
    done_then_more = {
        **plan,
        "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(plan["steps"] * 2)],
    }
    spin = {**plan, "steps": [{**ARM, "id": f"s{i + 1}"} for i in range(4)]}
    refused = {**plan, "goal": [{"missing": "toaster"}]}
    back = [
        plan["steps"][0],
        {**plan["steps"][1], "args": {"object": "apple", "target": "counter"}},
    ]
    capped = {**plan, "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(back * 3)]}
    width, window = gtok.n_vocab, 12
    for case in (done_then_more, spin, refused, capped):
        ids = tok.encode(json.dumps(case, separators=(",", ":")), add_special=False) + [
            gtok.eos_ids[0]
        ]
        stop = goal_stop(w, s)
        c = grammar.constraint(stop=stop)
        ended_in_walk = 0
        for start in range(len(ids)):
            drafts = ids[start : start + window]
            want, legal = _committed_rows(grammar, goal_stop(w, s), ids, start, drafts, width)
            before = (bytes(c.text), c.steps, c.step_cap, c.cut, stop.step_cap, stop.done_steps)
            got = c.allowed_rows(drafts, len(drafts) + 1, width)
            n = c.valid_prefix(drafts)
            assert n == legal, start
            for j, row in enumerate(want):
                assert (got[j] == row).all(), (start, j)
            assert (
                bytes(c.text),
                c.steps,
                c.step_cap,
                c.cut,
                stop.step_cap,
                stop.done_steps,
            ) == before
            ended_in_walk += not c.cut and any(
                set(np.flatnonzero(r)) == set(gtok.eos_ids) for r in want[1:]
            )
            if c.cut:
                break
            c.advance(ids[start])
        assert c.cut and ended_in_walk > 0, case["goal"]


def test_written_steps_read_before_the_opening_step():
    from agent.symbolic.solver import written_steps

    head = '{"plan_id":"p1","goal":[],"steps":[ {"id":"s1","skill":"pick"} , {"id":"s2","skill":'
    assert written_steps(head) == [{"id": "s1", "skill": "pick"}]
    assert (
        written_steps('{"plan_id":"p1","goal":[],"steps":[{"id":"s1","skill":') is None
    )  # none whole
    assert written_steps(
        '{"plan_id":"p1","goal":[],"steps":[{"id":"s{1","skill":"pick"},{"id":"s2","skill":'
    ) == [{"id": "s{1", "skill": "pick"}]
    # a brace in the opening step's own id: not read as its start (no early end, never a wrong one)
    assert (
        written_steps(
            '{"plan_id":"p1","goal":[],"steps":[{"id":"s1","skill":"pick"},{"id":"s{2","skill":'
        )
        is None
    )
    assert written_steps('{"plan_id":"p1","goal":[]') is None


def test_the_planner_ends_a_refused_goal_and_a_runaway_plan_early(tiny_llama):
    """Through the planner: a goal refused from itself ends the plan, and its report says so
    (not "cut off by the token budget") before the goal's own reason; a plan that repeats its
    steps after doing its goal ends there with the steps that did it, and one that never does
    it ends past the cap and the solver's steps complete it."""
    from agent.planner.planner import Planner
    from tests.helpers.runtimes import Decoding

    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    heavy = {
        **good_plan(),
        "task": "put the cast iron pan on the table",
        "goal": [{"object": "cast_iron_pan", "at": "table"}],
    }
    rt = Decoding(tok, [json.dumps(heavy, separators=(",", ":"))])
    res = Planner(rt, tok, attempts=0, thinking=False).plan(
        "put the cast iron pan on the table", w, s
    )
    assert not res.valid and [f["check"] for f in res.report] == ["json", "payload"]
    assert (
        "ends at its goal" in res.report[0]["message"]
        and "token budget" not in res.report[0]["message"]
    )
    plan = good_plan()
    runaway = {
        **plan,
        "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(plan["steps"] * 4)],
    }
    text = json.dumps(runaway, separators=(",", ":"))
    res = Planner(Decoding(tok, [text]), tok, attempts=0, thinking=False).plan(
        "put the apple on the table", w, s
    )
    assert (
        res.valid and not res.completed and res.plan["steps"] == runaway["steps"][:2]
    )  # the model's own
    assert (
        json.loads(res.history[0]["model_text"])["steps"] == runaway["steps"][:2]
    )  # as the model wrote them
    assert res.stats["generated_tokens"] < len(
        tok.encode(text[: _opening(text, 4)], add_special=False)
    )
    back = [
        plan["steps"][0],
        {**plan["steps"][1], "args": {"object": "apple", "target": "counter"}},
    ]
    loop = {**plan, "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(back * 4)]}
    text = json.dumps(loop, separators=(",", ":"))
    res = Planner(Decoding(tok, [text]), tok, attempts=0, thinking=False).plan(
        "put the apple on the table", w, s
    )
    assert (
        res.valid
        and res.completed
        and [st["skill"] for st in res.plan["steps"]] == ["pick", "place"]
    )
    assert res.plan["steps"][1]["args"]["target"] == "table"
    assert res.stats["generated_tokens"] < len(tok.encode(text, add_special=False))
    text = json.dumps(
        {**plan, "steps": [{**ARM, "id": f"s{i + 1}"} for i in range(6)]}, separators=(",", ":")
    )
    res = Planner(Decoding(tok, [text]), tok, attempts=0, thinking=False).plan(
        "put the apple on the table", w, s
    )
    assert (
        res.valid
        and res.completed
        and [st["skill"] for st in res.plan["steps"]] == ["pick", "place"]
    )
    assert res.stats["generated_tokens"] < len(
        tok.encode(text[: _opening(text, 4)], add_special=False)
    )
