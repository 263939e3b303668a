"""POST /v1/plan: the request's task, world and skills (inline, or by name from the configured
directories), checked before it is queued.

A name is a bare file stem (``kitchen``), never a path: a request cannot make the server read
a file outside the directories its operator configured. For the same reason an inline world's
own ``skills`` reference is not followed; pass ``skills`` (a name or an object) instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from thor_app.server.config import skills_path, worlds_path
from thor_app.server.errors import bad_request
from thor_app.server.inputs import PLAN_PRIORITY, check_schema_shape, priority
from thor_runtime.config import PlannerSettings
from thor_runtime.errors import ThorError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class PlanRequest:
    task: str
    world: object  # agent.files.loader.World
    skills: object  # agent.files.loader.SkillSet
    schema: dict | None
    max_tokens: int
    attempts: int
    max_steps: int | None
    priority: int = PLAN_PRIORITY  # queue order: higher first


def _by_name(directory: Path, name: str, what: str) -> Path:
    stem = name[:-5] if name.endswith(".json") else name
    if not _NAME.match(stem) or ".." in stem:
        raise bad_request(
            f"{what} name {name!r} is not a plain name (letters, digits, _ . -)", param=what
        )
    p = directory / f"{stem}.json"
    if not p.is_file():
        raise bad_request(
            f"no {what} named {stem!r} in the configured {what.removesuffix('s')}s directory",
            code=f"{what}_not_found",
            param=what,
        )
    return p


def _int_field(body: dict, key: str, default, lo: int, hi: int):
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise bad_request(f"{key} must be an integer in [{lo}, {hi}]", param=key)
    return v


def parse_plan(body, cfg: PlannerSettings) -> PlanRequest:
    """Reads world/skills files (small JSON): call it off the event loop."""
    from agent.files.loader import (
        DEFAULT_SKILLS,
        load_skills,
        load_world,
        resolve_skills_path,
        skills_from_dict,
        world_from_dict,
    )
    from agent.schema.grammar import check_schema

    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    task = body.get("task")
    if not isinstance(task, str) or not task.strip():
        raise bad_request("task must be a non-empty string", param="task")
    w, s, schema = body.get("world"), body.get("skills"), body.get("schema")
    try:
        if isinstance(w, str):
            world = load_world(_by_name(worlds_path(cfg), w, "world"))
        elif isinstance(w, dict):
            world = world_from_dict({k: v for k, v in w.items() if k != "skills"}, "request world")
        else:
            raise bad_request(
                "world must be a world object or the name of a configured world", param="world"
            )
        if isinstance(s, str):
            skills = load_skills(_by_name(skills_path(cfg), s, "skills"))
        elif isinstance(s, dict):
            skills = skills_from_dict(s, "request skills")
        elif s is None:
            skills = load_skills(
                resolve_skills_path(world, None) if isinstance(w, str) else DEFAULT_SKILLS
            )
        else:
            raise bad_request(
                "skills must be a skills object, the name of a configured skill set, or absent",
                param="skills",
            )
        if schema is not None:
            if not isinstance(schema, dict):
                raise bad_request("schema must be a JSON Schema object", param="schema")
            check_schema_shape(schema, "schema")
            check_schema(schema)
    except ThorError as e:
        raise bad_request(str(e)) from None
    return PlanRequest(
        task,
        world,
        skills,
        schema,
        _int_field(body, "max_tokens", cfg.max_tokens, 16, cfg.max_tokens),
        _int_field(body, "attempts", cfg.attempts, 0, cfg.attempts),
        _int_field(body, "max_steps", cfg.max_steps or None, 1, 256),
        priority(body, PLAN_PRIORITY),
    )
