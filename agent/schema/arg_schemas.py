"""Schemas of one skill's arguments and steps over one world's names (specialize.py builds the
plan schema from them): number ranges with bounded digits, object and place enums, the compact
object shapes every goal branch uses."""

from __future__ import annotations

import copy

from agent.files.loader import ArgSpec, Skill, World
from thor_runtime.errors import ThorError

NUMBER_STEP = 0.001  # resolution of number args: 1 mm, 1 ms, 1 mN ...
TIMEOUT_STEP = 0.1
MAX_TIMEOUT_S = 600.0


def _resolve(schema: dict, node: dict) -> dict:
    """Follow a local ``#/$defs/...`` reference (one level is all the base schema uses)."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    if not ref:
        return node
    if not ref.startswith("#/"):
        raise ThorError(f"only local $ref is supported in a plan schema, got {ref!r}")
    target = schema
    for part in ref[2:].split("/"):
        if not isinstance(target, dict) or part not in target:
            raise ThorError(f"$ref {ref!r} does not resolve")
        target = target[part]
    return target


def _number(lo: float | None, hi: float | None, integer: bool) -> dict:
    out: dict = {"type": "integer" if integer else "number"}
    if lo is not None:
        out["minimum"] = int(lo) if integer else lo
    if hi is not None:
        out["maximum"] = int(hi) if integer else hi
    if not integer:
        out["multipleOf"] = NUMBER_STEP
    return out


def allows(arg: ArgSpec, world: World, name: str) -> bool:
    """This object or place argument can take ``name`` in this world."""
    allowed = arg_schema(arg, world)
    return allowed is not None and name in allowed.get("enum", ())


def arg_schema(arg: ArgSpec, world: World) -> dict | None:
    """JSON schema for one argument, or None when no value can satisfy it in this world."""
    t = arg.type
    if t in ("number", "integer"):
        hi = arg.max
        if arg.unit == "kg":  # a mass argument can never exceed what the robot can lift
            hi = world.robot.max_payload_kg if hi is None else min(hi, world.robot.max_payload_kg)
        return _number(arg.min, hi, t == "integer")
    if t == "string":
        return {"type": "string", "minLength": 1, "maxLength": arg.max_length}
    if t == "enum":
        return {"enum": list(arg.values)}
    if t == "object":
        names = [
            o.name for o in world.objects if not arg.object_types or o.type in arg.object_types
        ]
        return {"enum": names} if names else None
    if t == "place":
        names = [p.name for p in world.places]
        return {"enum": names} if names else None
    if t == "position":
        lo, hi = world.robot.workspace_min, world.robot.workspace_max
        return {
            "type": "array",
            "prefixItems": [_number(a, b, False) for a, b in zip(lo, hi)],
            "items": False,
            "minItems": 3,
            "maxItems": 3,
        }
    raise ThorError(f"arg {arg.name!r}: unknown type {t!r}")


def args_schema(skill: Skill, world: World) -> dict | None:
    props = {}
    for a in skill.args:
        s = arg_schema(a, world)
        if s is None:
            return None
        props[a.name] = s
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def step_schema(step_base: dict, skill: Skill, world: World) -> dict | None:
    args = args_schema(skill, world)
    if args is None:
        return None
    out = copy.deepcopy(step_base)
    props = dict(out.get("properties", {}))
    props["skill"] = {"const": skill.name}
    props["args"] = args
    limit = min(skill.timeout_s or MAX_TIMEOUT_S, MAX_TIMEOUT_S)
    props["timeout_s"] = {
        "type": "number",
        "minimum": TIMEOUT_STEP,
        "maximum": limit,
        "multipleOf": TIMEOUT_STEP,
    }
    # Key order is the generation order: keep the base's, append anything new at the end.
    out["properties"] = {
        k: props[k] for k in [*step_base.get("properties", {}), *props] if k in props
    }
    out["additionalProperties"] = False
    return out


def _enum(names: list[str]) -> dict:
    return {"enum": names}


def _shape(props: dict) -> dict:
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }
