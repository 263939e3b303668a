"""evals/external/virtualhome.py: the converter of the eai-eval VirtualHome tasks, run on two
entries invented here in the package's format (the package is not needed), and the set it wrote."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from agent.files.loader import AGENT_DIR, base_plan_schema
from agent.schema.specialize import specialize
from agent.symbolic.gate import check_plan
from agent.symbolic.solver import complete
from evals.evaluation import SETS_DIR, load_eval_set, score, unsafe_reasons
from evals.external import virtualhome as vh

SET = SETS_DIR / "23-external-virtualhome"

ROOMS = [
    {"id": 1, "class_name": "kitchen", "category": "Rooms"},
    {"id": 2, "class_name": "living_room", "category": "Rooms"},
]


def _node(i, cls, category, props=(), states=()):
    return {
        "id": i,
        "class_name": cls,
        "category": category,
        "properties": list(props),
        "states": list(states),
        "prefab_name": None,
        "bounding_box": None,
    }


def _graph():
    nodes = [_node(r["id"], r["class_name"], r["category"]) for r in ROOMS] + [
        _node(3, "character", "Characters"),
        _node(10, "mug", "placable_objects", ["GRABBABLE", "MOVABLE"], ["CLEAN"]),
        _node(11, "mug", "placable_objects", ["GRABBABLE", "MOVABLE"]),
        _node(20, "kitchen_table", "Furniture", ["SURFACES"]),
        _node(30, "cupboard", "Furniture", ["CAN_OPEN", "CONTAINERS"], ["CLOSED"]),
        _node(40, "radio", "Electronics", ["HAS_SWITCH"], ["OFF"]),
        _node(50, "floor", "Floors", ["SURFACES"]),
    ]
    edges = [
        (3, "INSIDE", 2),
        (10, "ON", 20),
        (10, "ON", 50),
        (10, "INSIDE", 1),
        (11, "ON", 20),
        (20, "INSIDE", 1),
        (30, "INSIDE", 1),
        (40, "INSIDE", 2),
        (3, "CLOSE", 40),
    ]
    edges = [{"from_id": a, "relation_type": r, "to_id": b} for a, r, b in edges]
    return {
        "init_graph": {"nodes": nodes, "edges": edges},
        "final_graph": {"nodes": [], "edges": []},
    }


PROGRAMS = {
    "7_1": (
        "Tidy a mug",
        "Take the mug from the table and shut it in the cupboard.",
        [
            "[WALK] <kitchen> (1.1)",
            "[FIND] <mug> (1.11)",
            "[GRAB] <mug> (1.10)",
            "[OPEN] <cupboard> (1.30)",
            "[PUTIN] <mug> (1.10) <cupboard> (1.30)",
            "[CLOSE] <cupboard> (1.30)",
        ],
    ),
    "12_2": (
        "Radio",
        "Switch the radio on.",
        ["[WALK] <living_room> (1.2)", "[SWITCHON] <radio> (1.40)"],
    ),
}
GOALS = {
    "scene_1": {
        "Tidy": {
            "7_1": {
                "vh_goal": {
                    "actions": ["GRAB"],
                    "goal": [
                        {"from_id": 10, "relation_type": "INSIDE", "to_id": 30},
                        {"id": 30, "class_name": "cupboard", "state": "CLOSED"},
                        {"from_id": 3, "relation_type": "INSIDE", "to_id": 1},
                    ],
                },
                "tl_goal": "(INSIDE(mug.10, cupboard.30) and CLOSED(cupboard.30))",
            }
        },
        "Radio": {
            "12_2": {
                "vh_goal": {
                    "actions": [],
                    "goal": [{"id": 40, "class_name": "radio", "state": "ON"}],
                },
                "tl_goal": "ON(radio.40)",
            }
        },
    }
}


@pytest.fixture
def package(tmp_path) -> Path:
    """A folder laid out like the eai-eval wheel, with the two entries above."""
    root = tmp_path / "pkg"
    goals = root / vh.GOALS
    goals.parent.mkdir(parents=True)
    goals.write_text(json.dumps(GOALS))
    for folder in (vh.PROGRAMS, vh.GRAPHS):
        (root / folder).mkdir(parents=True)
    for pid, (name, description, steps) in PROGRAMS.items():
        (root / vh.PROGRAMS / f"file{pid}.txt").write_text(
            "\n".join([name, description, "", "", *steps, ""])
        )
        (root / vh.GRAPHS / f"file{pid}.json").write_text(json.dumps(_graph()))
    return root


def _schema(name):
    return json.loads((AGENT_DIR / "schemas" / name).read_text())


def _check_set(out: Path):
    world_schema, skills_schema = _schema("world.schema.json"), _schema("skills.schema.json")
    jsonschema.validate(json.loads((out / "skills.json").read_text()), skills_schema)
    for p in sorted((out / "worlds").glob("*.json")):
        jsonschema.validate(json.loads(p.read_text()), world_schema)
    tasks, worlds = load_eval_set(out)
    for t in tasks:  # the solver reaches each reference goal, written as a goal
        w, s = worlds[t.world]
        plan = complete({"plan_id": "p1", "task": t.task, "goal": t.goal.raw, "steps": []}, w, s)
        assert plan is not None, t.id
        g = check_plan(plan, specialize(base_plan_schema(), w, s), w, s)
        res = SimpleNamespace(
            plan=plan,
            valid=g.valid,
            report=g.report(),
            attempts=1,
            stats={"plan_latency_s": 0.1},
            completed=True,
        )
        row = score(t, res, w, s)
        assert row["success"] and not unsafe_reasons(plan, w, s), (t.id, res.report)
    return tasks, worlds


def test_converts_what_the_skills_can_say_and_counts_the_rest(package, tmp_path):
    out = tmp_path / "set"
    counts = vh.convert(vh.Source(package, verify=False), out)
    assert counts == {"total": 2, "expressible": 1, "chosen": 1, "left_out": {"state ON": 1}}
    tasks, worlds = _check_set(out)
    assert [t.id for t in tasks] == ["vh-7_1"] and list(worlds) == ["vh_7_1"]
    doc = json.loads((out / "tasks.json").read_text())
    assert "1 of 2 tasks the skills can express" in doc["description"]
    assert doc["tasks"][0]["task"] == "Tidy a mug. " + PROGRAMS["7_1"][1]
    assert doc["tasks"][0]["goal"] == [
        {"object": "mug_1", "at": "cupboard_inside"},
        {"object": "cupboard", "is": "closed"},
        {"robot_at": "kitchen"},
        {"do": "pick", "args": {"object": "mug_1"}},
    ]
    w = json.loads((out / "worlds" / "vh_7_1.json").read_text())
    objects = {o["name"]: o for o in w["objects"]}
    assert objects["mug_1"]["at"] == "kitchen_table" and objects["mug_1"]["mass_kg"] <= 2.0
    assert objects["cupboard"]["state"] == "closed" and objects["cupboard"]["graspable"] is False
    assert {p["name"] for p in w["places"]} == {
        "kitchen",
        "living_room",
        "kitchen_table",
        "cupboard_inside",
    }
    assert w["robot"]["at"] == "living_room"
    skills = json.loads((out / "skills.json").read_text())
    opens = next(s for s in skills["skills"] if s["name"] == "open")
    assert opens["args"]["object"]["object_types"] == ["cupboard"]


def test_reads_the_wheel_as_a_zip_and_checks_its_hash(package, tmp_path):
    wheel = tmp_path / vh.WHEEL
    with zipfile.ZipFile(wheel, "w") as z:
        for p in sorted(package.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(package).as_posix())
    counts = vh.convert(vh.Source(wheel, verify=False), tmp_path / "set")
    assert counts["expressible"] == 1
    with pytest.raises(SystemExit, match="sha256"):
        vh.Source(wheel)
    with pytest.raises(SystemExit, match="wheel"):
        vh.Source(package)


def test_fixed_draw_of_at_most_the_limit(package, tmp_path):
    goals = json.loads((package / vh.GOALS).read_text())
    one = goals["scene_1"]["Tidy"]["7_1"]
    goals["scene_1"]["Tidy"] = {f"7_{k}": one for k in range(1, 6)}
    (package / vh.GOALS).write_text(json.dumps(goals))
    for k in range(2, 6):
        for folder, ext in ((vh.PROGRAMS, "txt"), (vh.GRAPHS, "json")):
            src = package / folder / f"file7_1.{ext}"
            (package / folder / f"file7_{k}.{ext}").write_bytes(src.read_bytes())
    ids = []
    for _ in range(2):
        out = tmp_path / f"set{len(ids)}"
        vh.convert(vh.Source(package, verify=False), out, limit=3, seed=5)
        ids.append([t.id for t in _check_set(out)[0]])
    assert ids[0] == ids[1] and len(ids[0]) == 3


@pytest.mark.skipif(not (SET / "tasks.json").is_file(), reason="the set is not generated")
def test_the_generated_set_loads_and_says_its_counts():
    tasks, worlds = _check_set(SET)
    src = json.loads((SET / "tasks.json").read_text())["source"]
    assert src["package"] == "eai-eval" and src["wheel_sha256"] == vh.WHEEL_SHA256
    assert len(tasks) == src["chosen"] <= vh.LIMIT and len(worlds) == len(tasks)
    assert src["expressible"] + sum(src["left_out"].values()) == src["tasks_in_collection"]
    assert all(t.goal for t in tasks)
