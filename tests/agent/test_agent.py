"""agent/: world + skills files, schema specialization, safety gate, prompt, planner (repair loop).

The CLI, the end-to-end plan on the default model and the task sweep are in test_agent_cli.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from agent.files.loader import (
    AGENT_DIR,
    base_plan_schema,
    load_world,
    resolve_skills_path,
    skills_from_dict,
    world_from_dict,
)
from agent.planner.planner import Planner
from agent.planner.prompt import build_messages
from agent.schema.specialize import specialize
from agent.schema.validator import PlanValidator
from agent.symbolic.gate import CHECKS, check_plan, gate_findings
from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import WORLDS, good_plan, kitchen_dict, mutated_plan, world_and_skills
from thor_runtime.errors import ThorError


# ---- files -----------------------------------------------------------------------------------
def test_sample_files_load():
    for name in WORLDS:
        w, s = world_and_skills(name)
        assert w.objects and w.places and s.skills
        assert Path(s.source).name == (
            "mobile.json" if name == "warehouse" else "manipulation.json"
        )
    w = load_world(WORLDS["kitchen"])
    assert resolve_skills_path(w, "x.json") == Path("x.json")
    no_ref = {k: v for k, v in kitchen_dict().items() if k != "skills"}
    assert resolve_skills_path(world_from_dict(no_ref), None).name == "manipulation.json"


@pytest.mark.parametrize(
    "mutate, words",
    [
        (
            lambda d: d["objects"][1].update(position=[0.1, 0.2]),
            ["objects/1/position", "too short"],
        ),
        (lambda d: d["objects"][0].pop("mass_kg"), ["objects/0", "mass_kg"]),
        (
            lambda d: d["places"].append({"name": "apple", "position": [0, 0, 0]}),
            ["'apple'", "twice"],
        ),
        (lambda d: d["robot"]["workspace"].update(min=[1, 0, 0]), ["workspace", "min x=1"]),
        (lambda d: d["robot"].update(max_payload_kg=0), ["max_payload_kg"]),
    ],
)
def test_world_errors_name_file_and_problem(tmp_path, mutate, words):
    d = kitchen_dict()
    mutate(d)
    p = tmp_path / "bad_world.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ThorError) as e:
        load_world(p)
    assert "bad_world.json" in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(ThorError, match="world file not found"):
        load_world(tmp_path / "nope.json")
    (tmp_path / "broken.json").write_text("{objects: [")
    with pytest.raises(ThorError, match="broken.json: not valid JSON"):
        load_world(tmp_path / "broken.json")
    base = json.loads((AGENT_DIR / "skills" / "manipulation.json").read_text())
    for mutate, word in [
        (
            lambda d: d["skills"][1]["args"]["grasp"].pop("values"),
            "enum needs a non-empty `values`",
        ),
        (lambda d: d["skills"][0]["args"]["speed"].update(type="float"), "float"),
        (lambda d: d["skills"][0]["args"]["speed"].update(min=2, max=1), "above max"),
        (lambda d: d["skills"].append(copy.deepcopy(d["skills"][0])), "defined twice"),
        (lambda d: d["skills"][2]["args"]["target"].update(min=0), "only for number"),
    ]:
        d = copy.deepcopy(base)
        mutate(d)
        with pytest.raises(ThorError, match=word) as e:
            skills_from_dict(d, "my_skills.json")
        assert "my_skills.json" in str(e.value)


# ---- specialization ----------------------------------------------------------------------------
def test_specialized_schema_is_small_typed_and_bounded():
    w, s = world_and_skills("kitchen")
    base = base_plan_schema()
    spec = specialize(base, w, s)
    assert base == base_plan_schema()  # input untouched
    assert len(json.dumps(spec)) < 20_000  # ~6k of it: the goal's calls, orders and sets
    branches = spec["properties"]["steps"]["items"]["anyOf"]
    assert len(branches) == len(s.skills)
    pick = spec["$defs"]["step_pick"]
    assert list(pick["properties"]) == [
        "id",
        "skill",
        "args",
        "preconditions",
        "expected_effects",
        "timeout_s",
        "on_failure",
    ]
    assert pick["properties"]["skill"] == {"const": "pick"}
    args = pick["properties"]["args"]
    assert args["additionalProperties"] is False and args["required"] == [
        "object",
        "grasp",
        "force",
    ]
    assert args["properties"]["object"]["enum"] == [o.name for o in w.objects]
    assert args["properties"]["force"]["maximum"] == 40
    assert pick["properties"]["timeout_s"]["maximum"] == 20
    pos = spec["$defs"]["step_move_arm"]["properties"]["args"]["properties"]["position"]
    assert [p["minimum"] for p in pos["prefixItems"]] == list(w.robot.workspace_min)
    assert spec["$defs"]["step_open"]["properties"]["args"]["properties"]["object"]["enum"] == [
        "drawer"
    ]
    v = PlanValidator(spec)
    assert v.is_valid(good_plan())
    bad = good_plan()
    bad["steps"][0]["args"]["object"] = "banana"
    assert not v.is_valid(bad)


def test_specialize_edge_cases():
    w, s = world_and_skills("kitchen")
    custom = {"type": "object", "properties": {"answer": {"type": "string"}}}
    assert specialize(custom, w, s) == custom  # not a plan schema: used verbatim
    d = kitchen_dict()
    d["objects"] = [o for o in d["objects"] if o["type"] != "drawer"]
    spec = specialize(base_plan_schema(), world_from_dict(d), s)
    assert "step_open" not in spec["$defs"] and "step_pick" in spec["$defs"]  # nothing to open
    kg = skills_from_dict(
        {
            "skills": [
                {
                    "name": "lift",
                    "description": "lift a load",
                    "args": {"load": {"type": "number", "min": 0, "max": 50, "unit": "kg"}},
                }
            ]
        }
    )
    spec = specialize(base_plan_schema(), w, kg, max_steps=3)
    assert spec["$defs"]["step_lift"]["properties"]["args"]["properties"]["load"]["maximum"] == 2.0
    assert spec["properties"]["steps"]["maxItems"] == 3
    d = kitchen_dict()
    d["objects"] = []
    only_pick = skills_from_dict(
        {
            "skills": [
                {
                    "name": "pick",
                    "description": "x",
                    "args": {"object": {"type": "object"}},
                    "effects": [{"holding": "$object"}],
                }
            ]
        }
    )
    with pytest.raises(ThorError, match="no skill"):
        specialize(base_plan_schema(), world_from_dict(d), only_pick)


# ---- gate --------------------------------------------------------------------------------------
def _gate(plan, world="kitchen", schema=None):
    w, s = world_and_skills(world)
    schema = specialize(base_plan_schema(), w, s) if schema is None else schema
    r = check_plan(plan if isinstance(plan, str) else json.dumps(plan), schema, w, s)
    return r, {f.check for f in r.findings}


GATE_CASES = [
    ("json", '{"plan_id": "p1", "steps": ['),
    ("structure", mutated_plan(lambda p: p.update(steps=[]))),
    ("step_ids", mutated_plan(lambda p: p["steps"][1].update(id="s1"))),
    ("skill", mutated_plan(lambda p: p["steps"][0].update(skill="fly"))),
    ("args", mutated_plan(lambda p: p["steps"][0]["args"].pop("grasp"))),
    ("args", mutated_plan(lambda p: p["steps"][0]["args"].update(speed=1))),
    ("bounds", mutated_plan(lambda p: p["steps"][0]["args"].update(force=55))),
    ("bounds", mutated_plan(lambda p: p["steps"][0]["args"].update(grasp="diagonal"))),
    ("object", mutated_plan(lambda p: p["steps"][0]["args"].update(object="banana"))),
    (
        "object",
        mutated_plan(
            lambda p: p["steps"].append(
                {**p["steps"][0], "id": "s3", "skill": "close", "args": {"object": "apple"}}
            )
        ),
    ),
    ("place", mutated_plan(lambda p: p["steps"][1]["args"].update(target="garage"))),
    ("workspace", mutated_plan(lambda p: p["steps"][0]["args"].update(object="spice_jar"))),
    ("workspace", mutated_plan(lambda p: p["steps"][1]["args"].update(target="top_shelf"))),
    (
        "workspace",
        mutated_plan(
            lambda p: p["steps"].append(
                {
                    **p["steps"][0],
                    "id": "s3",
                    "skill": "move_arm",
                    "args": {"position": [0, 0, 2.0], "speed": 0.1},
                }
            )
        ),
    ),
    ("payload", mutated_plan(lambda p: p["steps"][0]["args"].update(object="cast_iron_pan"))),
    ("graspable", mutated_plan(lambda p: p["steps"][0]["args"].update(object="drawer"))),
    ("timeout", mutated_plan(lambda p: p["steps"][0].update(timeout_s=25))),
    ("timeout", mutated_plan(lambda p: p["steps"][0].update(timeout_s=0))),
    ("on_failure", mutated_plan(lambda p: p["steps"][0].update(on_failure="s9"))),
    ("on_failure", mutated_plan(lambda p: p["steps"][1].update(on_failure="s2"))),
]


def test_gate_accepts_good_plan():
    r, checks = _gate(good_plan())
    assert r.valid and not checks and r.report() == []


@pytest.mark.parametrize(
    "check, plan", GATE_CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(GATE_CASES)]
)
def test_gate_each_check(check, plan):
    r, checks = _gate(plan)
    assert not r.valid
    assert check in checks, r.report()
    for f in r.report():
        assert set(f) == {"step", "check", "message"} and f["check"] in CHECKS and f["message"]


def test_gate_is_independent_of_the_schema():
    """Even with a permissive schema, the gate alone refuses unsafe plans (units in messages)."""
    w, s = world_and_skills("kitchen")
    bad = mutated_plan(lambda p: p["steps"][0]["args"].update(force=55, object="cast_iron_pan"))
    found = gate_findings(bad, w, s)
    assert {f.check for f in found} == {"bounds", "payload"}
    msg = " ".join(f.message for f in found)
    assert "55 N" in msg and "40 N" in msg and "3.2 kg" in msg
    assert all(f.step == "s1" for f in found)
    r, checks = _gate(bad, schema={})
    # plus symbolic execution: s2 places the apple while the hand holds the pan
    assert checks == {"bounds", "payload", "not_held"}


def test_gate_mass_argument_and_warehouse():
    w, _ = world_and_skills("kitchen")
    kg = skills_from_dict(
        {
            "skills": [
                {
                    "name": "lift",
                    "description": "lift",
                    "timeout_s": 5,
                    "args": {"load": {"type": "number", "min": 0, "max": 50, "unit": "kg"}},
                }
            ]
        }
    )
    plan = {
        "plan_id": "p",
        "task": "t",
        "steps": [
            {
                "id": "s1",
                "skill": "lift",
                "args": {"load": 3},
                "preconditions": [],
                "expected_effects": [],
                "timeout_s": 1,
                "on_failure": "abort",
            }
        ],
    }
    assert {f.check for f in gate_findings(plan, w, kg)} == {"payload"}
    wh = {
        "plan_id": "w1",
        "task": "move box b",
        "steps": [
            {
                "id": "s1",
                "skill": "navigate_to",
                "args": {"target": "mezzanine", "speed": 0.5},
                "preconditions": [],
                "expected_effects": [],
                "timeout_s": 60,
                "on_failure": "abort",
            },
            {
                "id": "s2",
                "skill": "load",
                "args": {"object": "box_b"},
                "preconditions": [],
                "expected_effects": [],
                "timeout_s": 30,
                "on_failure": "abort",
            },
        ],
    }
    r, checks = _gate(wh, "warehouse")
    assert checks >= {"workspace", "payload"}


# ---- prompt ------------------------------------------------------------------------------------
def test_prompt_is_pure_compact_and_carries_errors(default_model):
    w, s = world_and_skills("kitchen")
    a = build_messages("put the apple on the table", w, s)
    assert a == build_messages("put the apple on the table", w, s)
    text = a[0]["content"]
    for name in (
        [o.name for o in w.objects] + [p.name for p in w.places] + [k.name for k in s.skills]
    ):
        assert name in text
    assert "force: 5..40 N" in text and "max payload 2 kg" in text
    assert len(default_model.tokenizer.encode_chat(a)) < 1100  # ~110 of it: a call, an order, a set
    errs = [{"step": "s1", "check": "payload", "message": "too heavy"}]
    r = build_messages("t", w, s, errors=errs, previous='{"plan_id":"p"}')
    assert [m["role"] for m in r] == ["system", "user", "assistant", "user"]
    assert "step s1: too heavy [payload]" in r[-1]["content"]


# ---- planner with a scripted runtime (repair loop, no model) ------------------------------------
def test_planner_repairs_with_gate_errors(tiny_llama):
    tok = tiny_llama.tokenizer
    heavy = mutated_plan(lambda p: p["steps"][0]["args"].update(object="cast_iron_pan"))
    rt = ScriptedRuntime(tok, [json.dumps(heavy), json.dumps(good_plan())])
    pl = Planner(rt, tok, attempts=2, thinking=False, complete=False)  # the repair loop alone
    w, s = world_and_skills("kitchen")
    res = pl.plan("put the apple on the table", w, s)
    assert res.valid and res.attempts == 2 and res.plan == good_plan() and res.report == []
    assert "cast_iron_pan" in rt.prompts[1] and "payload" in rt.prompts[1]
    assert res.stats["attempts"] == 2 and "jump_forward_tokens" in res.stats
    rt = ScriptedRuntime(tok, [json.dumps(heavy)] * 3)
    res = Planner(rt, tok, attempts=2, thinking=False, complete=False).plan(
        "put the apple on the table", w, s
    )
    assert not res.valid and res.attempts == 3 and res.report[0]["check"] == "payload"


def test_a_set_in_the_goal_is_reported_as_the_things_it_takes(tiny_llama):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    cups = {
        "plan_id": "p1",
        "task": "put all the cups in the sink",
        "goal": [{"every": {"type": "cup"}, "at": "sink"}],
        "steps": [],
    }
    res = Planner(ScriptedRuntime(tok, [json.dumps(cups)]), tok, attempts=0, thinking=False).plan(
        "put all the cups in the sink", w, s
    )
    assert res.valid and res.expansion == ("every object that is a cup: red_cup, blue_mug",)
    assert res.document()["expansion"] == ["every object that is a cup: red_cup, blue_mug"]
    # a goal of plain conditions expands to nothing
    res = Planner(
        ScriptedRuntime(tok, [json.dumps(good_plan())]),
        tok,
        attempts=0,
        thinking=False,
        complete=False,
    ).plan("put the apple on the table", w, s)
    assert res.valid and res.expansion == () and res.document()["expansion"] == []


def test_planner_thinking_span_is_kept_out_of_the_plan(tiny_qwen3):
    tok = tiny_qwen3.tokenizer
    rt = ScriptedRuntime(
        tok, ["<think>pick first, then place {not json}</think>\n" + json.dumps(good_plan())]
    )
    pl = Planner(rt, tok, attempts=0)
    assert pl.thinking  # auto: the tokenizer has <think> / </think>
    w, s = world_and_skills("kitchen")
    assert pl.prepare(w, s).grammar.thinking
    res = pl.plan("put the apple on the table", w, s)
    assert res.valid and res.plan == good_plan() and res.text.startswith("{")
    assert not Planner(rt, tok, thinking=False).prepare(w, s).grammar.thinking


def test_planner_refuses_bad_schema_before_generating(tiny_llama):
    rt = ScriptedRuntime(tiny_llama.tokenizer, [])
    pl = Planner(rt, tiny_llama.tokenizer)
    w, s = world_and_skills("kitchen")
    bad = base_plan_schema()
    bad["properties"]["steps"]["uniqueItems"] = True
    with pytest.raises(ThorError, match="uniqueItems"):
        pl.plan("t", w, s, schema=bad)
    assert rt.prompts == []
