"""A goal's inputs read and checked before the model sees them: the task, the world and the skills.

The world comes from the goal (a world object as JSON, or a file), else from the latest message
on the node's world topic. The skills come from the goal (JSON or a file), else from the world
file's own ``skills`` entry, else from the node's ``skills`` parameter, else the default set.
An inline world's ``skills`` entry is not followed (it has no directory to be relative to): give
the skills in the goal. Every problem raises ThorError naming what is wrong; the node aborts the
goal with that message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from thor_runtime.errors import ThorError


@dataclass(frozen=True)
class Inputs:
    world: object  # agent.files.loader.World
    skills: object  # agent.files.loader.SkillSet
    skills_doc: dict  # the skills as JSON: their `ros` entries map skills to actions
    world_source: str  # "goal", "file PATH" or "topic"


def parse_json(text: str, what: str):
    try:
        doc = json.loads(text)
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError):
        raise ThorError(f"{what} is not valid JSON") from None
    except UnicodeEncodeError:
        raise ThorError(f"{what} holds a string that is not valid Unicode") from None
    if not isinstance(doc, dict):
        raise ThorError(f"{what} must be a JSON object")
    return doc


def read_world(world_json: str = "", world_file: str = "", latest: str | None = None):
    """-> (World, where it came from)."""
    from agent.files.loader import load_world, world_from_dict

    if world_json:
        doc = parse_json(world_json, "world_json")
        return (
            world_from_dict({k: v for k, v in doc.items() if k != "skills"}, "world_json"),
            "goal",
        )
    if world_file:
        return load_world(world_file), f"file {world_file}"
    if latest is not None:
        doc = parse_json(latest, "the world topic's latest message")
        return (
            world_from_dict({k: v for k, v in doc.items() if k != "skills"}, "world topic"),
            "topic",
        )
    raise ThorError(
        "no world: give world_json or world_file, or publish a world on the node's world topic"
    )


def read_skills(skills_json: str = "", skills_file: str = "", world=None, default: str = ""):
    """-> (SkillSet, its JSON)."""
    from agent.files.loader import DEFAULT_SKILLS, read_json, skills_from_dict

    if skills_json:
        doc = parse_json(skills_json, "skills_json")
        return skills_from_dict(doc, "skills_json"), doc
    if skills_file:
        path = Path(skills_file)
    elif world is not None and world.skills_ref:
        path = Path(world.skills_ref)
    else:
        path = Path(default) if default else DEFAULT_SKILLS
    doc = read_json(path, "skills")
    if not isinstance(doc, dict):
        raise ThorError(f"{path}: a skills file is a JSON object")
    return skills_from_dict(doc, str(path)), doc


def read_inputs(
    world_json: str = "",
    world_file: str = "",
    skills_json: str = "",
    skills_file: str = "",
    latest_world: str | None = None,
    default_skills: str = "",
) -> Inputs:
    world, source = read_world(world_json, world_file, latest_world)
    skills, doc = read_skills(skills_json, skills_file, world, default_skills)
    return Inputs(world, skills, doc, source)


def read_plan(plan_json: str) -> dict:
    """A plan to run, as JSON: its shape is checked against the plan schema by the gate."""
    if not plan_json:
        raise ThorError("plan_json is empty: give the plan to run")
    return parse_json(plan_json, "plan_json")


def check_task(task) -> str:
    if not isinstance(task, str) or not task.strip():
        raise ThorError("task must be a non-empty string")
    return task
