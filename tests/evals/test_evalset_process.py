"""evals/sets/7-* and 10-* to 18-*: tasks that are more than an end state (calls, order,
repetition, sets), and, for every evaluation set, that each reference goal can be written under
its task's grammar and reached (or is refused for its stated reason) from the goal alone."""

from __future__ import annotations

import json
from itertools import permutations
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent.files.loader import AGENT_DIR, base_plan_schema, load_world
from agent.language.checks import task_findings
from agent.language.lexicon import load_lexicon
from agent.language.mentions import read_words
from agent.schema.specialize import specialize
from agent.schema.validator import PlanValidator
from agent.symbolic.gate import check_plan
from agent.symbolic.solver import complete, goal_reasons
from calib.prompts import training_names
from evals.evaluation import REFUSALS, SETS_DIR, load_eval_set, score, unsafe_reasons

SETS = SETS_DIR
PROCESS = SETS / "7-printstudio-aquarium-museum-skihire"
# sets written with calls, orders and sets in mind: the same shape, fresh against every other set
SET_10 = SETS / "10-luthier-chocolatier-winery-cinema"
SET_11 = SETS / "11-bindery-honeyhouse-hangar-seedbank"
SET_12 = SETS / "12-perfumery-tattoo-icerink-marina"
SET_13 = SETS / "13-darkroom-cheesemonger-stables-foodbank"
SET_14 = SETS / "14-candlemaker-barbershop-sawmill-observatory"
SET_15 = SETS / "15-teahouse-fossillab-orchard-bowlingalley"
SET_16 = SETS / "16-locksmith-tailor-brickyard-campsite"
SET_17 = SETS / "17-goldsmith-roastery-kennels-gymnasium"
SET_18 = SETS / "18-cobbler-soapery-quarry-ferry"
ALL_SETS = sorted(d for d in SETS.iterdir() if (d / "tasks.json").is_file())
# the development sets in other languages are translations of sets here: their names are those
# sets' own
FRESH_SETS = [d for d in ALL_SETS if not d.name.startswith("dev-")]


def _number(directory: Path) -> int:
    """A set's number: the order it was written in."""
    return int(directory.name.split("-")[0])


def _raw(directory: Path) -> dict:
    return {t["id"]: t for t in json.loads((directory / "tasks.json").read_text())["tasks"]}


def _res(plan, world, skills):
    g = check_plan(plan, specialize(base_plan_schema(), world, skills), world, skills)
    return SimpleNamespace(
        plan=plan,
        valid=g.valid,
        report=g.report(),
        attempts=1,
        stats={"plan_latency_s": 0.1},
        completed=True,
    )


@pytest.mark.parametrize(
    "directory",
    [PROCESS, SET_10, SET_11, SET_12, SET_13, SET_14, SET_15, SET_16, SET_17, SET_18],
    ids=lambda d: d.name,
)
def test_process_set_shape_and_fresh(directory):
    tasks, worlds = load_eval_set(directory)
    assert len(tasks) >= 48 and len(worlds) >= 4 and len({t.id for t in tasks}) == len(tasks)
    for name in worlds:
        assert sorted(t.refuse for t in tasks if t.world == name and t.refuse) == sorted(
            REFUSALS
        ), name
    # at least half the tasks need a call, an order, a repetition or a set
    beyond = [t for t in tasks if t.goal and (t.goal.process or t.goal.sets)]
    assert 2 * len(beyond) >= len(tasks)
    assert {"do", "before", "every"} <= {
        k for t in tasks for g in (t.goal.raw if t.goal else []) for k in g
    }
    # new settings: no world, object or place name from the sample worlds, the calibration
    # vocabulary or any earlier set
    old = [load_world(p) for p in sorted((AGENT_DIR / "worlds").glob("*.json"))]
    # fresh against every set written before it (a later set's own freshness is its own)
    before = [d for d in FRESH_SETS if _number(d) < _number(directory)]
    old += [w for d in before for w, _ in load_eval_set(d)[1].values()]
    names = {o.name for w in old for o in w.objects} | {p.name for w in old for p in w.places}
    names |= training_names()
    for name, (w, _) in worlds.items():
        assert name not in {w.name for w in old} | names
        assert not names & ({o.name for o in w.objects} | {p.name for p in w.places}), name
    assert not {t.id for t in tasks} & {t.id for d in before for t in load_eval_set(d)[0]}


@pytest.mark.parametrize("directory", ALL_SETS, ids=lambda d: d.name)
def test_every_reference_goal_is_reachable_or_refused_for_its_reason(directory):
    """The solver reaches each feasible task's own goal with a plan the gate passes, the oracle
    finds safe and scoring counts as done; each infeasible task's `asks` is refused from the goal
    alone for the check the task names, and nothing safe reaches it."""
    tasks, worlds = load_eval_set(directory)
    raw = _raw(directory)
    for t in tasks:
        w, s = worlds[t.world]
        if t.refuse:
            asks = raw[t.id].get("asks")
            if asks is None:
                continue  # the first set names only the check
            assert t.refuse in {f.check for f in goal_reasons({"goal": asks}, w, s)}, t.id
            assert (
                complete({"plan_id": "p1", "task": t.task, "goal": asks, "steps": []}, w, s) is None
            ), t.id
            continue
        plan = complete({"plan_id": "p1", "task": t.task, "goal": t.goal.raw, "steps": []}, w, s)
        assert plan is not None, t.id
        row = score(t, _res(plan, w, s), w, s)
        assert row["success"] and row["valid"] and not unsafe_reasons(plan, w, s), (t.id, row)


def test_process_reference_goals_fit_their_task_grammar():
    """The goal grammar can write the answer this set counts as right (in some order), and the
    checks of the goal against the task's names and amounts find nothing in it."""
    tasks, worlds = load_eval_set(PROCESS)
    for t in tasks:
        if t.refuse:
            continue
        w, s = worlds[t.world]
        spec = specialize(base_plan_schema(), w, s)
        v = PlanValidator({**spec["properties"]["goal"], "$defs": spec["$defs"]})
        assert any(v.is_valid(list(p)) for p in permutations(t.goal.raw)), (t.id, t.task)
        said = read_words(t.task, w, load_lexicon("shipped"))
        assert task_findings(said, {"goal": t.goal.raw, "steps": []}, w, s) == [], t.id


def test_scoring_holds_a_plan_to_the_tasks_calls_and_order():
    tasks, worlds = load_eval_set(PROCESS)
    by = {t.id: t for t in tasks}
    t = by["ps07"]  # inspect, wait, inspect
    w, s = worlds[t.world]
    good = complete({"plan_id": "p1", "task": t.task, "goal": t.goal.raw, "steps": []}, w, s)
    assert score(t, _res(good, w, s), w, s)["success"]
    # the same calls in another order reach nothing the task asked for
    bad = {
        **good,
        "goal": [{"object": "screen_frame", "is": "inspected"}],
        "steps": [good["steps"][1], good["steps"][0], {**good["steps"][2], "id": "s3"}],
    }
    bad["steps"] = [{**x, "id": f"s{i + 1}"} for i, x in enumerate(bad["steps"])]
    row = score(t, _res(bad, w, s), w, s)
    assert row["valid"] and not row["reached"] and not row["success"]
