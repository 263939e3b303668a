"""A plan cut off by the token budget has still stated its goal (the grammar writes it before the
steps): the solver completes from it, and a refusal names the goal's own reason."""

from __future__ import annotations

import json

from agent.planner.planner import Planner
from agent.symbolic.solver import goal_reasons, stated_goal
from tests.helpers.runtimes import BudgetRuntime
from tests.helpers.worlds import good_plan, world_and_skills


def cut(plan: dict, keep_steps_chars: int = 40) -> str:
    """The plan's compact JSON, cut ``keep_steps_chars`` into its steps array."""
    text = json.dumps(plan, separators=(",", ":"))
    return text[: text.index('"steps"') + len('"steps":[') + keep_steps_chars]


def heavy_plan():
    p = good_plan()
    p["goal"] = [{"object": "cast_iron_pan", "at": "table"}]  # 3.2 kg; the kitchen robot lifts 2 kg
    return p


def test_stated_goal_reads_the_head_of_a_cut_plan():
    head = stated_goal(cut(good_plan()))
    assert head == {
        "plan_id": "p1",
        "task": "put the apple on the table",
        "goal": [{"object": "apple", "at": "table"}],
        "steps": [],
    }
    text = json.dumps(good_plan(), separators=(",", ":"))
    assert stated_goal(text[: text.index('"goal"') + 20]) is None  # cut inside the goal
    assert (
        stated_goal(text[: text.index('"steps"')]) is None
    )  # steps not begun: nothing to trust yet
    assert stated_goal('{"plan_id":"p1","task":"say \\"steps\\"","goal":[]}') is None
    assert stated_goal("not json") is None


def test_goal_reasons():
    w, _ = world_and_skills("kitchen")
    assert goal_reasons(good_plan(), w) == []
    assert [f.check for f in goal_reasons(heavy_plan(), w)] == ["payload"]
    missing = {**good_plan(), "goal": [{"missing": "orchid"}]}
    assert [f.check for f in goal_reasons(missing, w)] == ["object"]


def test_cut_plan_is_completed_from_its_goal(tiny_llama):
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    rt = BudgetRuntime(tok, [cut(good_plan())])
    res = Planner(rt, tok, attempts=0, thinking=False).plan("put the apple on the table", w, s)
    assert res.valid and res.completed and res.report == []
    assert res.plan["goal"] == good_plan()["goal"]
    assert [st["skill"] for st in res.plan["steps"]] == ["pick", "place"]
    # without the solver the cut plan stays refused, with the budget named
    rt = BudgetRuntime(tok, [cut(good_plan())])
    res = Planner(rt, tok, attempts=0, thinking=False, complete=False).plan(
        "put the apple on the table", w, s
    )
    assert not res.valid and {f["check"] for f in res.report} == {"json"}


def test_cut_plan_with_an_unsafe_goal_is_refused_naming_the_reason(tiny_llama):
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    rt = BudgetRuntime(tok, [cut(heavy_plan())] * 2)
    res = Planner(rt, tok, attempts=1, thinking=False).plan("put the pan on the table", w, s)
    assert not res.valid and res.plan is None and res.attempts == 2
    checks = {f["check"] for f in res.report}
    assert checks == {"json", "payload"}
    assert any("cast_iron_pan weighs 3.2 kg" in f["message"] for f in res.report)
    assert "cast_iron_pan weighs 3.2 kg" in rt.prompts[1]  # fed back to the repair
