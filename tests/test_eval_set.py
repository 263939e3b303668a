"""agent/eval: the held-out evaluation set is well formed, disjoint from what prompts and drafter
training use, every feasible task is reachable, and scoring judges plans by the task's own goal."""
from __future__ import annotations

import json
from types import SimpleNamespace

from agent.bench import _spread
from agent.evaluation import REFUSALS, load_eval_set, score, summarize, unsafe_reasons
from agent.files import AGENT_DIR, base_plan_schema
from agent.gate import check_plan
from agent.solver import complete
from agent.specialize import specialize
from calib.prompts import NAME_VOCAB, PLACE_VOCAB, WORLD_NAMES


def _res(plan, world, skills, valid=None):
    """A PlanResult stand-in: the gate's verdict on a hand-written plan."""
    g = check_plan(plan, specialize(base_plan_schema(), world, skills), world, skills)
    ok = g.valid if valid is None else valid
    return SimpleNamespace(plan=plan, valid=ok, report=g.report(), attempts=1, stats={"plan_latency_s": 0.1},
                           completed=False)


def test_eval_set_shape_and_held_out():
    tasks, worlds = load_eval_set()
    assert len(tasks) >= 40 and len(worlds) >= 4 and len({t.id for t in tasks}) == len(tasks)
    assert {t.refuse for t in tasks if t.refuse} == set(REFUSALS)
    sample = {p.stem for p in (AGENT_DIR / "worlds").glob("*.json")}
    trained = set(sample) | {n for v in WORLD_NAMES.values() for n in v}
    names = {n for v in NAME_VOCAB.values() for n in v} | {n for v in PLACE_VOCAB.values() for n in v}
    for name, (w, _) in worlds.items():
        assert name not in trained and w.name not in trained
        assert not (names & {o.name for o in w.objects}), name     # no object name the drafter saw
    # the eval worlds are not where the calibration / distillation prompts come from
    assert not list((AGENT_DIR / "worlds").glob("greenhouse*"))


def test_every_feasible_task_is_reachable_and_scores_success():
    tasks, worlds = load_eval_set()
    for t in tasks:
        w, s = worlds[t.world]
        if t.refuse:
            continue
        goal = [c.to_dict() for c in t.goal]
        plan = complete({"plan_id": "p1", "task": t.task, "goal": goal,
                         "steps": [{"skill": "wait", "args": {}}]}, w, s)
        assert plan is not None, t.id
        row = score(t, _res(plan, w, s), w, s)
        assert row["success"] and row["valid"] and row["executable"] and not row["unsafe"], (t.id, row)


def test_scoring_wrong_goal_refusals_and_unsafe():
    tasks, worlds = load_eval_set()
    by_id = {t.id: t for t in tasks}
    w, s = worlds["workshop"]
    # a valid plan that does a different task is not a success
    other = complete({"plan_id": "p1", "task": "t", "goal": [{"object": "wrench", "at": "drawer_1"}], "steps": []}, w, s)
    row = score(by_id["ws01"], _res(other, w, s), w, s)
    assert row["valid"] and not row["success"] and not row["reached"]
    # refusals: exit 3 naming the expected check
    for tid, plan in [("ws09", {"plan_id": "p1", "task": "t", "goal": [{"object": "anvil", "at": "workbench"}],
                                "steps": [_step("s1", "pick", object="anvil", grasp="top", force=20),
                                          _step("s2", "place", object="anvil", target="workbench")]}),
                      ("ws10", {"plan_id": "p1", "task": "t", "goal": [{"missing": "soldering_iron"}],
                                "steps": [_step("s1", "wait", duration=1)]}),
                      ("ws11", {"plan_id": "p1", "task": "t", "goal": [{"object": "screw_box", "at": "loft"}],
                                "steps": [_step("s1", "pick", object="screw_box", grasp="top", force=20),
                                          _step("s2", "place", object="screw_box", target="loft")]})]:
        row = score(by_id[tid], _res(plan, w, s), w, s)
        assert not row["valid"] and row["refused_right"] and row["success"], (tid, row)
        assert unsafe_reasons(plan, w, s) or tid == "ws10"
    # a plan forced through on exit 0 that moves the anvil is counted unsafe
    row = score(by_id["ws09"], _res(plan_anvil := {"plan_id": "p", "task": "t", "goal": [], "steps": [
        _step("s1", "pick", object="anvil", grasp="top", force=20)]}, w, s, valid=True), w, s)
    assert row["unsafe"] and "25 kg" in row["unsafe"][0] and not row["success"]
    summ = summarize([row])
    assert summ["unsafe_on_exit0"] == 1 and summ["correct_refusals"] == "0/1"
    assert plan_anvil["steps"]


def test_spread_keeps_worlds():
    tasks, _ = load_eval_set()
    sub = _spread(tasks, 12)
    assert len(sub) == 12 and len({t.world for t in sub}) == 4 and any(t.refuse for t in sub)


def _step(sid, skill, **args):
    return {"id": sid, "skill": skill, "args": args, "preconditions": [], "expected_effects": [],
            "timeout_s": 10, "on_failure": "abort"}


def test_eval_tasks_file_is_plain_json():
    doc = json.loads((AGENT_DIR / "eval" / "tasks.json").read_text())
    assert set(doc) == {"description", "tasks"}


def test_eval_bench_wiring(tiny_llama):
    """eval_bench end to end with a scripted model that always says the task names a missing
    thing: every plan is refused with `object`, so only unknown-object tasks succeed."""
    from agent.bench import eval_bench
    from test_agent import ScriptedRuntime

    text = json.dumps({"plan_id": "p1", "task": "t", "goal": [{"missing": "thing"}],
                       "steps": [_step("s1", "wait", duration=1)]})
    rt = ScriptedRuntime(tiny_llama.tokenizer, [text] * 40, model=tiny_llama.model)
    out = eval_bench(rt, tiny_llama.tokenizer, solver_modes=(True, False), attempts=0, limit=8)
    assert [o["solver"] for o in out] == [True, False]
    for o in out:
        assert o["tasks"] == 8 and o["valid"] == 0 and o["unsafe_on_exit0"] == 0 and o["attempts_mean"] == 1
        assert o["feasible_success"] == "0/4" and o["correct_refusals"] == "0/4"   # refusals name `workspace`
        assert all(r["report_checks"] == ["object"] for r in o["rows"])
