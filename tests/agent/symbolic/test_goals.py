"""Goals beyond an end state (agent/symbolic/goals.py): required calls (`do`), order (`before`)
and sets (`every`), through parsing, symbolic execution, the gate, the solver and the goal
grammar."""

from __future__ import annotations

import copy
import json

import pytest

from agent.files.loader import AGENT_DIR, base_plan_schema, skills_from_dict, world_from_dict
from agent.schema.grammar import check_schema
from agent.schema.specialize import specialize
from agent.schema.validator import PlanValidator
from agent.symbolic.executor import execute
from agent.symbolic.gate import check_plan
from agent.symbolic.goals import parse_goal_items
from agent.symbolic.solver import complete, goal_reasons
from thor_runtime.errors import ThorError

WORLD = {
    "name": "potting_bench",
    "objects": [
        {
            "name": "basil_pot",
            "type": "pot",
            "position": [0.2, 0.1, 0.9],
            "mass_kg": 0.6,
            "at": "bench",
        },
        {
            "name": "seed_tray",
            "type": "tray",
            "position": [0.1, -0.2, 0.9],
            "mass_kg": 0.4,
            "at": "bench",
        },
        {
            "name": "trowel",
            "type": "tool",
            "position": [-0.1, 0.2, 0.9],
            "mass_kg": 0.3,
            "at": "bench",
        },
        {
            "name": "shears",
            "type": "tool",
            "position": [-0.2, -0.1, 0.9],
            "mass_kg": 0.2,
            "at": "shelf",
        },
        {
            "name": "soil_sack",
            "type": "sack",
            "position": [0.3, -0.3, 0.9],
            "mass_kg": 12.0,
            "at": "bench",
        },
    ],
    "places": [
        {"name": "bench", "position": [0, 0, 0.9]},
        {"name": "shelf", "position": [0.4, 0.3, 1.2]},
        {"name": "tool_hook", "position": [-0.4, 0.3, 1.1]},
    ],
    "robot": {
        "workspace": {"min": [-0.6, -0.6, 0.6], "max": [0.6, 0.6, 1.4]},
        "max_payload_kg": 2.0,
    },
}
SKILLS = json.loads((AGENT_DIR / "skills" / "manipulation.json").read_text())
SKILLS["skills"].append(
    {
        "name": "push",
        "description": "slide an object along the surface",
        "timeout_s": 15,
        "args": {
            "object": {"type": "object"},
            "direction": {"type": "enum", "values": ["left", "right", "forward", "back"]},
            "distance": {"type": "number", "min": 0.01, "max": 0.3, "unit": "m"},
        },
        "preconditions": [{"hand": "empty"}],
        "unchanged": ["object"],
    }
)
W, S = world_from_dict(WORLD), skills_from_dict(SKILLS)
SCHEMA = specialize(base_plan_schema(), W, S)

INSPECT = {"do": "inspect", "args": {"object": "basil_pot"}}
WAIT = {"do": "wait", "args": {"duration": 10}}


def step(i, skill, **args):
    return {
        "id": f"s{i}",
        "skill": skill,
        "args": args,
        "preconditions": [],
        "expected_effects": [],
        "timeout_s": 10,
        "on_failure": "abort",
    }


def plan(goal, *steps):
    return {"plan_id": "p1", "task": "t", "goal": goal, "steps": list(steps)}


def checks(p):
    return sorted({f.check for f in check_plan(p, SCHEMA, W, S).findings})


def report(p):
    return " | ".join(f.message for f in check_plan(p, SCHEMA, W, S).findings)


def calls(p):
    return [(s["skill"], s["args"].get("object", s["args"].get("duration"))) for s in p["steps"]]


# ---- the language ------------------------------------------------------------------------------
def test_parse_calls_orders_and_sets():
    g = parse_goal_items(
        [
            {"object": "trowel", "at": "tool_hook"},
            {"do": "push", "args": {"object": "seed_tray"}},
            {"before": [INSPECT, WAIT, INSPECT]},
            {"every": {"type": "tool"}, "at": "tool_hook"},
        ],
        W,
        S,
    )
    assert [c.text() for c in g] == [
        "trowel at tool_hook",
        "shears at tool_hook",
    ]  # set members, once each
    assert [a.text() for a in g.acts] == ["push seed_tray"]
    assert [[i.text() for i in o] for o in g.orders] == [
        ["inspect basil_pot", "wait 10", "inspect basil_pot"]
    ]
    assert g.expansion() == ["every object that is a tool: trowel, shears"]
    assert bool(parse_goal_items([WAIT], W, S)) and len(parse_goal_items([WAIT], W, S)) == 0
    for bad, word in [
        ([{"do": "juggle", "args": {}}], "no skill 'juggle'"),
        ([{"do": "push", "args": {"speed": 1}}], "no argument 'speed'"),
        ([{"do": "wait", "args": {"duration": 1}, "times": 9}], "times must be"),
        ([{"before": [INSPECT]}], "list of 2"),
        ([{"before": [INSPECT, {"before": [WAIT, WAIT]}]}], "not a condition"),
        ([{"every": {"colour": "red"}, "at": "shelf"}], "selector"),
        ([{"every": {"at": "garage"}, "at": "shelf"}], "not a selector value"),
        ([{"every": {"type": "tool"}, "holding": "x"}], "`every` takes"),
    ]:
        with pytest.raises(ThorError, match=word):
            parse_goal_items(bad, W, S)


def test_sets_expand_against_the_initial_state():
    by = lambda sel: [c.subject for c in parse_goal_items([{"every": sel, "at": "shelf"}], W, S)]  # noqa: E731
    assert by({"at": "bench"}) == ["basil_pot", "seed_tray", "trowel", "soil_sack"]
    assert by({"at": "bench", "carriable": True}) == [
        "basil_pot",
        "seed_tray",
        "trowel",
    ]  # not the 12 kg sack
    assert by({"type": "tool", "carriable": True}) == ["trowel", "shears"]
    # nothing picked: refused from the goal alone, saying what is not here
    for sel, words in [
        ({"type": "hose"}, "nothing in this world is a hose"),
        ({"at": "tool_hook"}, "nothing in this world is at tool_hook"),
    ]:
        f = goal_reasons({"goal": [{"every": sel, "at": "shelf"}]}, W, S)
        assert [x.check for x in f] == ["object"] and words in f[0].message
    # a world that says where nothing rests: `at` picks nothing, and the refusal says why
    bare = world_from_dict(
        {**WORLD, "objects": [{k: v for k, v in o.items() if k != "at"} for o in WORLD["objects"]]}
    )
    f = goal_reasons({"goal": [{"every": {"at": "bench"}, "at": "shelf"}]}, bare, S)
    assert [x.check for x in f] == ["object"] and "`at`" in f[0].message
    assert [
        c.subject for c in parse_goal_items([{"every": {"type": "tool"}, "at": "shelf"}], bare, S)
    ] == ["trowel", "shears"]  # type still works without `at`
    # a set that takes in something the robot cannot lift is refused for it, not trimmed
    f = goal_reasons({"goal": [{"every": {"at": "bench"}, "at": "shelf"}]}, W, S)
    assert [x.check for x in f] == ["payload"] and "soil_sack" in f[0].message


# ---- symbolic execution and the gate -----------------------------------------------------------
def test_execution_records_calls_in_order():
    ex = execute(
        [
            step(1, "inspect", object="basil_pot"),
            step(2, "wait", duration=10),
            step(3, "push", object="seed_tray", direction="left", distance=0.1),
        ],
        W,
        S,
    )
    assert [(sid, skill) for sid, skill, *_ in ex.calls] == [
        ("s1", "inspect"),
        ("s2", "wait"),
        ("s3", "push"),
    ]
    assert ex.calls[0][3].inspected == frozenset() and "basil_pot" in ex.calls[0][4].inspected


def test_gate_names_an_unmet_do():
    goal = [
        {"do": "push", "args": {"object": "seed_tray", "direction": "forward", "distance": 0.05}}
    ]
    good = plan(goal, step(1, "push", object="seed_tray", direction="forward", distance=0.05))
    assert checks(good) == []
    wrong = plan(goal, step(1, "push", object="seed_tray", direction="left", distance=0.05))
    assert checks(wrong) == ["action"] and "push seed_tray forward 0.05; no step does it" in report(
        wrong
    )
    twice = plan([{**WAIT, "times": 2}], step(1, "wait", duration=10))
    assert checks(twice) == ["action"] and "wait 10 x2; the steps do it 1 time" in report(twice)
    assert (
        checks(
            plan([{**WAIT, "times": 2}], step(1, "wait", duration=10), step(2, "wait", duration=10))
        )
        == []
    )


def test_gate_names_an_unmet_order():
    goal = [{"before": [INSPECT, WAIT, INSPECT]}]
    good = plan(
        goal,
        step(1, "inspect", object="basil_pot"),
        step(2, "wait", duration=10),
        step(3, "inspect", object="basil_pot"),
    )
    assert checks(good) == []
    # every call is there, but not inspect-wait-inspect
    bad = plan(
        goal,
        step(1, "wait", duration=10),
        step(2, "inspect", object="basil_pot"),
        step(3, "wait", duration=10),
    )
    assert checks(bad) == ["order"]
    assert "inspect basil_pot, then wait 10, then inspect basil_pot in that order" in report(bad)
    assert "not inspect basil_pot after it" in report(bad)
    # a condition in an order is the moment it becomes true: inspect, then place
    goal = [
        {
            "before": [
                {"do": "inspect", "args": {"object": "trowel"}},
                {"object": "trowel", "at": "tool_hook"},
            ]
        },
        {"object": "trowel", "at": "tool_hook"},
    ]
    first = [
        step(1, "inspect", object="trowel"),
        step(2, "pick", object="trowel", grasp="top", force=10),
        step(3, "place", object="trowel", target="tool_hook"),
    ]
    assert checks(plan(goal, *first)) == []
    late = [
        step(1, "pick", object="trowel", grasp="top", force=10),
        step(2, "place", object="trowel", target="tool_hook"),
        step(3, "inspect", object="trowel"),
    ]
    assert checks(plan(goal, *late)) == ["order"] and "never reach" not in report(plan(goal, *late))


def test_goal_calls_out_of_bounds_are_refused_from_the_goal():
    f = goal_reasons({"goal": [{"do": "wait", "args": {"duration": 300}}]}, W, S)
    assert [x.check for x in f] == ["bounds"] and "goal wait 300" in f[0].message
    f = goal_reasons({"goal": [{"do": "pick", "args": {"object": "soil_sack"}}]}, W, S)
    assert "payload" in [x.check for x in f]


# ---- the solver --------------------------------------------------------------------------------
def test_solver_inserts_required_calls_in_order_with_preconditions():
    # push needs an empty hand: the trowel goes on the hook first, then the push, then the wait
    goal = [
        {"object": "trowel", "at": "tool_hook"},
        {
            "before": [
                {"object": "trowel", "at": "tool_hook"},
                {
                    "do": "push",
                    "args": {"object": "seed_tray", "direction": "left", "distance": 0.1},
                },
                WAIT,
            ]
        },
    ]
    p = complete(plan(goal), W, S)
    assert calls(p) == [
        ("pick", "trowel"),
        ("place", "trowel"),
        ("push", "seed_tray"),
        ("wait", 10),
    ]
    assert checks(p) == []
    p = complete(plan([{"before": [INSPECT, WAIT, INSPECT]}]), W, S)
    assert (
        calls(p) == [("inspect", "basil_pot"), ("wait", 10), ("inspect", "basil_pot")]
        and checks(p) == []
    )
    p = complete(plan([{**WAIT, "times": 3}]), W, S)
    assert calls(p) == [("wait", 10)] * 3
    # a free argument gets a safe value; the task's own values are kept
    p = complete(plan([{"do": "push", "args": {"object": "seed_tray"}}]), W, S)
    assert (
        p["steps"][0]["args"]["direction"] in ("left", "right", "forward", "back")
        and checks(p) == []
    )


def test_solver_plans_a_set_and_refuses_what_it_cannot():
    p = complete(plan([{"every": {"type": "tool", "carriable": True}, "at": "tool_hook"}]), W, S)
    assert (
        sorted(o for s, o in calls(p) if s == "place") == ["shears", "trowel"] and checks(p) == []
    )
    assert complete(plan([{"every": {"at": "bench"}, "at": "shelf"}]), W, S) is None  # the sack
    assert complete(plan([{"do": "wait", "args": {"duration": 300}}]), W, S) is None


# ---- the grammar -------------------------------------------------------------------------------
def test_goal_grammar_writes_the_new_forms():
    """The same goal grammar for every task: every form the skills allow is open to the model."""
    spec = specialize(base_plan_schema(), W, S)
    check_schema(spec)  # llguidance compiles it
    v = PlanValidator(spec)
    good = plan([], step(1, "wait", duration=1))
    for goal in (
        [{"before": [INSPECT, {"do": "wait", "args": {"duration": 10}}, INSPECT]}],
        [{"do": "push", "args": {"object": "seed_tray", "direction": "forward", "distance": 0.05}}],
        [{"every": {"type": "tool"}, "at": "tool_hook"}],
        [{"every": {"type": "tool", "carriable": True}, "at": "tool_hook"}],
    ):
        assert v.is_valid({**good, "goal": goal}), goal
    assert not v.is_valid({**good, "goal": [{"do": "juggle", "args": {}}]})
    assert not v.is_valid({**good, "goal": [{"every": {"type": "hose"}, "at": "shelf"}]})


def test_base_schema_takes_the_new_forms():
    v = PlanValidator(base_plan_schema())
    good = plan(
        [
            {"before": [INSPECT, {"object": "trowel", "at": "shelf"}]},
            WAIT,
            {"every": {"at": "bench", "carriable": True}, "at": "shelf"},
        ],
        step(1, "wait", duration=1),
    )
    assert v.is_valid(good)
    assert not v.is_valid(copy.deepcopy({**good, "goal": [{"every": {}, "at": "shelf"}]}))


def test_every_goal_form_the_prompt_shows_is_a_goal_the_plan_schema_takes():
    """The prompt's examples are what a small model copies: each must be a goal the grammar
    allows."""
    from agent.planner.prompt import _GOAL_EXAMPLES, _PROCESS_EXAMPLES

    v = PlanValidator(base_plan_schema())
    good = plan([], step(1, "wait", duration=1))
    forms = [g for _, g in _GOAL_EXAMPLES.values()] + [g for _, _, g in _PROCESS_EXAMPLES]
    for g in forms:
        if '"on":' in g:  # objects on objects: only a stacking library's schema has it
            continue
        assert v.is_valid({**good, "goal": json.loads(f"[{g}]")}), g
    assert len(forms) >= 10
