"""Skills' preconditions / effects, fail-closed safety, symbolic execution, goals, the solver.

Hand-written plans, good and bad, on the sample worlds; the "fertilizer" case from the field:
a skills file that forgets `payload: true` must never let an over-payload pick through."""

from __future__ import annotations

import copy
import json

import pytest

from agent.files.loader import (
    AGENT_DIR,
    base_plan_schema,
    load_skills,
    load_world,
    skills_from_dict,
    world_from_dict,
)
from agent.planner.planner import Planner
from agent.schema.specialize import specialize
from agent.schema.validator import PlanValidator
from agent.symbolic.conditions import Cond, parse_cond
from agent.symbolic.executor import execute, initial_state, symbolic_findings
from agent.symbolic.gate import check_plan, gate_findings
from agent.symbolic.solver import complete
from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import kitchen_dict, world_and_skills
from thor_app.cli import main
from thor_runtime.errors import ThorError


def step(sid, skill, **args):
    return {
        "id": sid,
        "skill": skill,
        "args": args,
        "preconditions": [],
        "expected_effects": [],
        "timeout_s": 10,
        "on_failure": "abort",
    }


def pick(sid, obj):
    return step(sid, "pick", object=obj, grasp="top", force=10)


def place(sid, obj, target):
    return step(sid, "place", object=obj, target=target)


def plan(goal, *steps):
    return {"plan_id": "p1", "task": "t", "goal": goal, "steps": list(steps)}


def checks_of(p, world="kitchen"):
    w, s = world_and_skills(world)
    r = check_plan(p, specialize(base_plan_schema(), w, s), w, s)
    return r, [(f.step, f.check) for f in r.findings]


# ---- vocabulary and files ------------------------------------------------------------------------
def test_conditions_parse_and_print():
    c = parse_cond({"object": "apple", "at": "table"}, ("at",), "goal")
    assert (
        c == Cond("at", "apple", "table")
        and c.text() == "apple at table"
        and c.to_dict() == {"object": "apple", "at": "table"}
    )
    assert Cond("holding", "$object").ground({"object": "cup"}) == Cond("holding", "cup")
    for bad, word in [
        ({"object": "a"}, "not a condition"),
        ({"hand": "half"}, "hand must be"),
        ({"object": "a", "is": "wet"}, "`is` must be"),
        ({"holding": 3}, "non-empty string"),
    ]:
        with pytest.raises(ThorError, match=word):
            parse_cond(bad, ("hand", "holding", "at", "is"), "goal[0]")


def test_world_initial_state_from_file():
    w, _ = world_and_skills("kitchen")
    st = initial_state(w)
    assert (
        st.loc["apple"] == "counter"
        and st.loc["spice_jar"] == "top_shelf"
        and st.status == {"drawer": "closed"}
    )
    assert st.held is None and st.robot_at is None
    assert initial_state(world_and_skills("warehouse")[0]).robot_at == "charging_station"
    d = kitchen_dict()
    d["objects"][0]["at"] = "garage"
    with pytest.raises(ThorError, match="'garage', which is not a place"):
        world_from_dict(d)
    old = kitchen_dict()  # files without `at` / `state` still load
    for o in old["objects"]:
        o.pop("at", None), o.pop("state", None)
    assert initial_state(world_from_dict(old)).loc["apple"] is None


@pytest.mark.parametrize(
    "skill, word",
    [
        (
            {"name": "pick", "description": "x", "args": {"object": {"type": "object"}}},
            "effect on object argument 'object'",
        ),
        (
            {
                "name": "pick",
                "description": "x",
                "args": {"object": {"type": "object"}},
                "effects": [{"holding": "$thing"}],
            },
            "'.thing' to be an argument of type object",
        ),
        (
            {
                "name": "go",
                "description": "x",
                "args": {"to": {"type": "place"}},
                "effects": [{"holding": "$to"}],
            },
            "type object",
        ),
        (
            {
                "name": "pick",
                "description": "x",
                "args": {"object": {"type": "object"}},
                "effects": [{"hand": "full"}],
                "unchanged": ["object"],
            },
            "only hand effect",
        ),
        (
            {
                "name": "pick",
                "description": "x",
                "args": {"object": {"type": "object"}},
                "effects": [{"holding": "$object", "at": "x"}],
            },
            "at top level|is not valid|condition",
        ),
    ],
)
def test_skills_file_is_refused_naming_the_skill(skill, word):
    with pytest.raises(ThorError, match=word) as e:
        skills_from_dict({"skills": [skill]}, "garden_skills.json")
    assert (
        "garden_skills.json" in str(e.value) and str(e.value).count(f"skill {skill['name']!r}") <= 1
    )


# ---- the fertilizer case ----------------------------------------------------------------------
GARDEN = {
    "name": "garden",
    "objects": [
        {
            "name": "fertilizer_bag",
            "type": "bag",
            "position": [0.3, 0.1, 0.5],
            "mass_kg": 10.0,
            "at": "bench",
        },
        {
            "name": "seed_tray",
            "type": "tray",
            "position": [0.2, -0.1, 0.5],
            "mass_kg": 0.4,
            "at": "bench",
        },
    ],
    "places": [
        {"name": "bench", "position": [0.3, 0.0, 0.5]},
        {"name": "potting_table", "position": [-0.3, 0.2, 0.6]},
    ],
    "robot": {
        "workspace": {"min": [-0.8, -0.8, 0.0], "max": [0.8, 0.8, 1.2]},
        "max_payload_kg": 2.5,
    },
}
NO_FLAG = {
    "skills": [
        {
            "name": "pick",
            "description": "grasp and lift",
            "args": {"object": {"type": "object"}},
            "preconditions": [{"hand": "empty"}],
            "effects": [{"holding": "$object"}],
        },
        {
            "name": "place",
            "description": "put down",
            "args": {"object": {"type": "object"}, "target": {"type": "place"}},
            "preconditions": [{"holding": "$object"}],
            "effects": [{"object": "$object", "at": "$target"}, {"hand": "empty"}],
        },
    ]
}
FERT_PLAN = plan(
    [{"object": "fertilizer_bag", "at": "potting_table"}],
    step("s1", "pick", object="fertilizer_bag"),
    step("s2", "place", object="fertilizer_bag", target="potting_table"),
)


def test_fertilizer_payload_checked_without_the_flag():
    w, s = world_from_dict(GARDEN), skills_from_dict(NO_FLAG)
    assert s.get("pick").carries == {"object"} and not s.get("pick").args[0].payload
    found = gate_findings(FERT_PLAN, w, s)
    assert [(f.step, f.check) for f in found] == [("s1", "payload"), ("s2", "payload")]
    assert "10 kg" in found[0].message and "2.5 kg" in found[0].message
    # the solver never picks it either: the model's goal has no safe solution
    assert complete(FERT_PLAN, w, s) is None


def test_fertilizer_cli_never_exit_0(tmp_path, capsys, tiny_llama, monkeypatch):
    """Without the flag: exit 3 with the payload finding. Without effects: exit 2 at load."""
    from thor_app.commands import plan as plan_cli

    (tmp_path / "garden.json").write_text(json.dumps(GARDEN))
    (tmp_path / "no_flag.json").write_text(json.dumps(NO_FLAG))
    no_effects = copy.deepcopy(NO_FLAG)
    no_effects["skills"][0].pop("effects")
    (tmp_path / "no_effects.json").write_text(json.dumps(no_effects))
    rt = ScriptedRuntime(tiny_llama.tokenizer, [json.dumps(FERT_PLAN)] * 3)
    from thor_app.assembly import assembled_with

    monkeypatch.setattr(
        plan_cli, "build_runtime", lambda config: assembled_with(config, tiny_llama, rt)
    )
    argv = [
        "plan",
        "Lift the fertilizer bag onto the potting table",
        "--world",
        str(tmp_path / "garden.json"),
        "--model",
        "default",
        "--spec",
        "none",
        "--no-thinking",
        "--json",
        "--attempts",
        "2",
        "--skills",
    ]
    rc = main(argv + [str(tmp_path / "no_flag.json")])
    cap = capsys.readouterr()
    assert rc == 3, cap.err
    obj = json.loads(cap.out)
    assert not obj["valid"] and "payload" in {f["check"] for f in obj["report"]}
    assert "10 kg" in cap.err
    rc = main(argv + [str(tmp_path / "no_effects.json")])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "" and "Traceback" not in cap.err
    assert (
        "skill 'pick'" in cap.err and "effect on object argument 'object' is not stated" in cap.err
    )


# ---- symbolic execution: good and bad plans ---------------------------------------------------
def test_good_plans_execute_and_reach_their_goal():
    r, found = checks_of(
        plan(
            [{"object": "apple", "at": "table"}], pick("s1", "apple"), place("s2", "apple", "table")
        )
    )
    assert r.valid, found
    r, found = checks_of(
        plan(
            [{"object": "drawer", "is": "open"}, {"object": "red_cup", "at": "sink"}],
            step("s1", "open", object="drawer", distance=0.2),
            pick("s2", "red_cup"),
            place("s3", "red_cup", "sink"),
        )
    )
    assert r.valid, found
    r, found = checks_of(
        plan([{"holding": "apple"}], pick("s1", "apple"))
    )  # the goal asks to hold it
    assert r.valid, found
    wh = plan(
        [{"object": "box_a", "at": "dock_1"}, {"place": "aisle_3", "is": "inspected"}],
        step("s1", "scan", area="aisle_3", mode="lidar"),
        step("s2", "load", object="box_a"),
        step("s3", "navigate_to", target="dock_1", speed=1.0),
        step("s4", "unload", object="box_a", target="dock_1"),
    )
    r, found = checks_of(wh, "warehouse")
    assert r.valid, found


@pytest.mark.parametrize(
    "name, p, expected",
    [
        (
            "pick_only",
            plan([{"object": "apple", "at": "table"}], pick("s1", "apple")),
            [("s1", "left_held"), (None, "goal")],
        ),
        (
            "place_without_pick",
            plan([{"object": "apple", "at": "table"}], place("s1", "apple", "table")),
            [("s1", "not_held")],
        ),
        (
            "pick_while_holding",
            plan(
                [{"object": "apple", "at": "table"}],
                pick("s1", "red_cup"),
                pick("s2", "apple"),
                place("s3", "apple", "table"),
            ),
            [("s2", "hand_full")],
        ),
        (
            "used_after_dropped",
            plan(
                [{"object": "red_cup", "at": "sink"}],
                pick("s1", "red_cup"),
                pick("s2", "apple"),
                place("s3", "apple", "table"),
                place("s4", "red_cup", "sink"),
            ),
            [("s2", "hand_full"), ("s4", "dropped"), ("s4", "not_held")],
        ),
        (
            "placed_elsewhere_then_placed_again",
            plan(
                [{"object": "apple", "at": "sink"}],
                pick("s1", "apple"),
                place("s2", "apple", "table"),
                place("s3", "apple", "sink"),
            ),
            [("s3", "not_held")],
        ),
        (
            "precondition_open_twice",
            plan(
                [{"object": "drawer", "is": "open"}],
                step("s1", "open", object="drawer", distance=0.2),
                step("s2", "open", object="drawer", distance=0.2),
            ),
            [("s2", "precondition")],
        ),
        (
            "goal_not_reached",
            plan(
                [{"object": "apple", "at": "sink"}],
                pick("s1", "apple"),
                place("s2", "apple", "table"),
            ),
            [(None, "goal")],
        ),
        (
            "goal_missing_thing",
            plan(
                [{"missing": "golden_statue"}], pick("s1", "apple"), place("s2", "apple", "table")
            ),
            [(None, "object")],
        ),
        (
            "goal_missing_but_present",
            plan([{"missing": "apple"}], pick("s1", "apple"), place("s2", "apple", "table")),
            [(None, "goal")],
        ),
    ],
)
def test_each_symbolic_finding(name, p, expected):
    w, s = world_and_skills("kitchen")
    found = [(f.step, f.check) for f in symbolic_findings(p, w, s)]
    assert found == expected, (name, symbolic_findings(p, w, s))
    r, _ = checks_of(p)
    assert not r.valid


def test_findings_explain_what_happened():
    w, s = world_and_skills("kitchen")
    msgs = {
        f.check: f.message
        for f in symbolic_findings(
            plan(
                [{"object": "apple", "at": "sink"}],
                pick("s1", "apple"),
                place("s2", "apple", "table"),
                place("s3", "apple", "sink"),
            ),
            w,
            s,
        )
    }
    assert (
        msgs["not_held"]
        == "place needs apple held, but apple is at table (put at table in step s2); pick it first"
    )
    ex = execute([pick("s1", "red_cup"), pick("s2", "apple")], w, s)
    assert ex.complete and ex.state.held == "apple" and ex.state.loc["red_cup"] is None
    assert "dropped when step s2 took apple" in ex.state.why["red_cup"]


def test_execution_stops_at_a_step_the_gate_refuses_by_name():
    w, s = world_and_skills("kitchen")
    p = plan(
        [{"object": "apple", "at": "table"}], pick("s1", "banana"), place("s2", "apple", "table")
    )
    assert symbolic_findings(p, w, s) == []  # the gate names banana; no guessed state after it
    assert {f.check for f in gate_findings(p, w, s)} == {"object"}


def test_goal_schema_is_specialized_and_first():
    w, s = world_and_skills("kitchen")
    spec = specialize(base_plan_schema(), w, s)
    assert list(spec["properties"])[:4] == ["plan_id", "task", "goal", "steps"]
    branches = spec["properties"]["goal"]["items"]["anyOf"]
    assert branches[0]["properties"]["object"]["enum"] == [o.name for o in w.objects]
    assert branches[0]["properties"]["at"]["enum"] == [p.name for p in w.places]
    assert not any(
        "robot_at" in b["properties"] for b in branches
    )  # no kitchen skill moves the base
    v = PlanValidator(spec)
    good = plan(
        [{"object": "apple", "at": "table"}], pick("s1", "apple"), place("s2", "apple", "table")
    )
    assert v.is_valid(good)
    assert not v.is_valid({**good, "goal": [{"object": "apple", "at": "garage"}]})
    assert not v.is_valid({k: x for k, x in good.items() if k != "goal"})
    wh, ws = world_and_skills("warehouse")
    assert any(
        "robot_at" in b["properties"]
        for b in specialize(base_plan_schema(), wh, ws)["properties"]["goal"]["items"]["anyOf"]
    )


# ---- solver (goal -> steps) -------------------------------------------------------------------
def test_solver_completes_steps_from_the_goal():
    w, s = world_and_skills("kitchen")
    schema = specialize(base_plan_schema(), w, s)
    model = plan(
        [{"object": "red_cup", "at": "dish_rack"}], pick("s1", "red_cup")
    )  # picks and stops
    done = complete(model, w, s)
    assert [
        (x["skill"], x["args"].get("object"), x["args"].get("target")) for x in done["steps"]
    ] == [("pick", "red_cup", None), ("place", "red_cup", "dish_rack")]
    assert done["steps"][0]["args"]["force"] == 10  # the model's own values kept
    assert check_plan(done, schema, w, s).valid
    for unreachable in (
        [{"object": "cast_iron_pan", "at": "table"}],  # over payload
        [{"object": "spice_jar", "at": "table"}],  # outside the workspace
        [{"object": "apple", "at": "top_shelf"}],  # place outside the workspace
        [{"missing": "unicorn"}],
    ):
        assert complete(plan(unreachable, pick("s1", "apple")), w, s) is None, unreachable


def test_planner_completes_from_the_goal_and_says_so(tiny_llama):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    picks_and_stops = plan([{"object": "red_cup", "at": "dish_rack"}], pick("s1", "red_cup"))
    res = Planner(
        ScriptedRuntime(tok, [json.dumps(picks_and_stops)]), tok, attempts=0, thinking=False
    ).plan("put the red cup in the dish rack", w, s)
    assert res.valid and res.completed and res.stats["completed"] and len(res.plan["steps"]) == 2
    rt = ScriptedRuntime(tok, [json.dumps(picks_and_stops)])
    res = Planner(rt, tok, attempts=0, thinking=False, complete=False).plan(
        "put the red cup in the dish rack", w, s
    )
    assert (
        not res.valid
        and not res.completed
        and {f["check"] for f in res.report} == {"left_held", "goal"}
    )
    heavy = plan(
        [{"object": "cast_iron_pan", "at": "table"}],
        pick("s1", "cast_iron_pan"),
        place("s2", "cast_iron_pan", "table"),
    )
    rt = ScriptedRuntime(tok, [json.dumps(heavy)] * 2)
    res = Planner(rt, tok, attempts=1, thinking=False).plan(
        "put the cast iron pan on the table", w, s
    )
    assert not res.valid and "payload" in {f["check"] for f in res.report}
    assert "is not reached" not in rt.prompts[1] and "payload" in rt.prompts[1]  # findings fed back
    assert (
        "goal cast_iron_pan at table: cast_iron_pan weighs 3.2 kg" in rt.prompts[1]
    )  # the goal's own reason


def test_demo_world_plan_does_its_task():
    """`make demo`: the kitchen's red cup into the dish rack is a two-step plan the gate accepts."""
    w = load_world(AGENT_DIR / "worlds" / "kitchen.json")
    s = load_skills(AGENT_DIR / "skills" / "manipulation.json")
    r, found = checks_of(
        plan(
            [{"object": "red_cup", "at": "dish_rack"}],
            pick("s1", "red_cup"),
            place("s2", "red_cup", "dish_rack"),
        )
    )
    assert r.valid, found
    assert w.object("red_cup").at == "counter" and s.get("place").carries == {"object"}


def test_goal_beyond_the_robot_names_the_reason():
    w, s = world_and_skills("kitchen")
    for goal, check in [
        ([{"object": "cast_iron_pan", "at": "table"}], "payload"),
        ([{"holding": "cast_iron_pan"}], "payload"),
        ([{"object": "drawer", "at": "table"}], "graspable"),
        ([{"object": "spice_jar", "at": "table"}], "workspace"),
        ([{"object": "apple", "at": "top_shelf"}], "workspace"),
    ]:
        p = plan(goal, step("s1", "wait", duration=1))  # the steps do not even try
        found = {(f.step, f.check) for f in symbolic_findings(p, w, s)}
        assert (None, check) in found, (goal, found)
    # already where the goal wants it: nothing to lift, no payload finding
    p = plan([{"object": "cast_iron_pan", "at": "counter"}], step("s1", "wait", duration=1))
    assert symbolic_findings(p, w, s) == []


def test_solver_ignores_what_no_goal_or_precondition_asks_about():
    """Scans of a dozen places multiplied the states past the search's limit: a two-object
    task in a twelve-place mobile world found no plan. Actions whose effects nothing asks
    about are left out, and the plan is found at once (without a step the goal does not need)."""
    places = [{"name": f"room_{i}", "position": [float(i), 1.0, 0.0]} for i in range(12)]
    w = world_from_dict(
        {
            "name": "t",
            "skills": str(AGENT_DIR / "skills" / "mobile.json"),
            "objects": [
                {
                    "name": n,
                    "type": "bag",
                    "position": [0.0, 1.0, 0.0],
                    "mass_kg": 2,
                    "at": "room_0",
                }
                for n in ("red_bag", "blue_bag")
            ],
            "places": places,
            "robot": {"workspace": {"min": [-1, -1, 0], "max": [20, 5, 2]}, "max_payload_kg": 20},
        }
    )
    s = load_skills(AGENT_DIR / "skills" / "mobile.json")
    goal = [{"object": "red_bag", "at": "room_7"}, {"object": "blue_bag", "at": "room_7"}]
    out = complete({"plan_id": "p", "task": "t", "goal": goal, "steps": []}, w, s)
    assert out is not None and [st["skill"] for st in out["steps"]] == [
        "load",
        "unload",
        "load",
        "unload",
    ]
    # what the goal asks about still gets its steps
    out = complete(
        {"plan_id": "p", "task": "t", "goal": goal + [{"robot_at": "room_3"}], "steps": []}, w, s
    )
    assert [st["skill"] for st in out["steps"]].count("navigate_to") + [
        st["skill"] for st in out["steps"]
    ].count("dock") == 1
