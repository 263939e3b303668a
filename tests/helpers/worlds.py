"""The sample worlds and skill sets, a good plan on the kitchen and ways to spoil it, and small
worlds written inline for the task's reading."""

from __future__ import annotations

import json

from agent.files.loader import AGENT_DIR, load_skills, load_world, resolve_skills_path

WORLDS = {n: AGENT_DIR / "worlds" / f"{n}.json" for n in ("kitchen", "warehouse", "lab_bench")}


def world_and_skills(name):
    w = load_world(WORLDS[name])
    return w, load_skills(resolve_skills_path(w, None))


def kitchen_dict():
    return json.loads(WORLDS["kitchen"].read_text())


def good_plan():
    return {
        "plan_id": "p1",
        "task": "put the apple on the table",
        "goal": [{"object": "apple", "at": "table"}],
        "steps": [
            {
                "id": "s1",
                "skill": "pick",
                "args": {"object": "apple", "grasp": "top", "force": 10},
                "preconditions": ["gripper empty"],
                "expected_effects": ["apple held"],
                "timeout_s": 10,
                "on_failure": "retry",
            },
            {
                "id": "s2",
                "skill": "place",
                "args": {"object": "apple", "target": "table"},
                "preconditions": [],
                "expected_effects": ["apple on table"],
                "timeout_s": 12.5,
                "on_failure": "s1",
            },
        ],
    }


def mutated_plan(fn):
    p = good_plan()
    fn(p)
    return p


def with_goal(*conds) -> dict:
    return {**good_plan(), "goal": list(conds)}


def checks(findings) -> list[str]:
    return [f.check for f in findings]


def small_world(objects, places, robot_at=None):
    from agent.files.loader import world_from_dict

    return world_from_dict(
        {
            "name": "t",
            "objects": [{"position": [0.1, 0.0, 0.9], "mass_kg": 0.5, **o} for o in objects],
            "places": [{"name": p, "position": [0.2, 0.1, 0.9]} for p in places],
            "robot": {"workspace": {"min": [-1, -1, 0], "max": [1, 1, 2]}, "max_payload_kg": 3.0},
        }
    )


# a library and a ward
LIB = small_world(
    [
        {"name": "mystery_paperback", "type": "book", "at": "returns_desk"},
        {"name": "picture_book", "type": "book", "at": "returns_desk"},
        {"name": "audiobook_set", "type": "box", "at": "drop_box"},
        {"name": "patient_hoist", "type": "hoist", "at": "bay_2"},
    ],
    ["returns_desk", "drop_box", "book_cart", "hold_shelf", "bay_2", "bay_3", "damaged_bin"],
)


def arm_and_mobile_skills():
    from agent.files.loader import skills_from_dict

    _, arm = world_and_skills("kitchen")
    mobile = json.loads((AGENT_DIR / "skills" / "mobile.json").read_text())
    return arm, skills_from_dict(mobile)
