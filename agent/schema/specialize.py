"""Per-request plan schema: the base schema narrowed to this world and this skill library.

What goes into the schema is *vocabulary*: which skills exist, each skill's argument names and
types, numeric ranges, which world names an object / place argument may take, and which goal
conditions (over which names) the plan may state. Limits that
depend on which object was chosen (its mass against the payload, whether it lies inside the
workspace, whether it can be grasped) are left to the safety gate on purpose: if the schema
removed the heavy pan from `pick`, a request to pick the pan would be silently rewritten into
picking something else; instead it is refused with a report (exit 3).

Shape choices that keep decoding fast and finite: one `anyOf` branch per skill, each fixing
`skill` to a const so the branch is decided a few tokens into a step; `additionalProperties:
false` and all-required properties in a fixed order (nothing for the model to choose); bounded
strings, arrays and step counts; numbers with `multipleOf` so their digits are bounded too.
"""

from __future__ import annotations

import copy

from agent.files.loader import SkillSet, World
from agent.schema.arg_schemas import _enum, _resolve, _shape, args_schema, step_schema
from agent.symbolic.executor import states_by_object
from agent.symbolic.goals import MAX_TIMES
from thor_runtime.errors import ThorError


def _object_branches(
    objs: list[str], kinds: set[str], places: list[str], states: dict, bases=None
) -> list[dict]:
    """Conditions about these objects: at a place, held, in a state their type can reach, or on
    another object (objects with the same choices share one branch, so the grammar stays small).
    bases: f(object) -> the objects an `on` may take."""

    def grouped(key: str, values) -> list[dict]:
        groups: dict[tuple[str, ...], list[str]] = {}
        for o in objs:
            vs = tuple(values(o))
            if vs:
                groups.setdefault(vs, []).append(o)
        return [_shape({"object": _enum(g), key: _enum(list(vs))}) for vs, g in groups.items()]

    out = []
    if "at" in kinds and objs:
        out += grouped("at", lambda o: places)
    if "holding" in kinds and objs:
        out.append(_shape({"holding": _enum(objs)}))
    if "is" in kinds:
        groups = {}
        for o in objs:
            st = tuple(states.get(o, ()))
            if st:
                groups.setdefault(st, []).append(o)
        out += [_shape({"object": _enum(g), "is": _enum(list(st))}) for st, g in groups.items()]
    if "on" in kinds and objs and bases is not None:
        out += grouped("on", bases)
    return out


def _place_branches(kinds: set[str], looked_at: list[str], visited: list[str]) -> list[dict]:
    """Conditions about places: one of ``looked_at`` inspected, the robot at one of ``visited``."""
    out = []
    if "place_is" in kinds and looked_at:
        out.append(_shape({"place": _enum(looked_at), "is": {"const": "inspected"}}))
    if "robot_at" in kinds and visited:
        out.append(_shape({"robot_at": _enum(visited)}))
    return out


def _do_branches(world: World, skills: SkillSet, objs: list[str] | None = None) -> list[dict]:
    """One `do` per skill: the objects and places it acts on, and any of its other arguments
    (those the task fixes; the solver picks safe values for the rest). With ``objs``, its
    object arguments only take those (the objects the task speaks of)."""
    out = []
    for s in skills.skills:
        args = args_schema(s, world)
        if args is None:
            continue
        # what it acts on is always said; the rest only where the task fixes it ("wait 5")
        args["required"] = [a.name for a in s.args if a.type in ("object", "place")]
        if objs is not None:
            for a in s.args:
                if a.type == "object":
                    keep = [n for n in args["properties"][a.name]["enum"] if n in objs]
                    args["properties"][a.name] = {"enum": keep}
            if any(not p.get("enum", True) for p in args["properties"].values()):
                continue
        # "times" is the one optional key: most calls are asked for once
        out.append(
            {
                **_shape(
                    {
                        "do": {"const": s.name},
                        "args": args,
                        "times": {"type": "integer", "minimum": 2, "maximum": MAX_TIMES},
                    }
                ),
                "required": ["do", "args"],
            }
        )
    return out


def _every_branches(world: World, kinds: set[str], states: dict, ref) -> list[dict]:
    """Sets of objects by type, by where they rest at the start, by whether the robot can carry
    them, and pairs of those: each member at a place, or in a state."""
    types = sorted({o.type for o in world.objects})
    homes = [p.name for p in world.places if any(o.at == p.name for o in world.objects)]
    tests = {
        "type": _enum(types),
        "at": _enum(homes) if homes else None,
        "carriable": {"const": True},
    }
    shapes = [
        ("type",),
        ("at",),
        ("carriable",),
        ("type", "carriable"),
        ("at", "carriable"),
        ("at", "type"),
    ]
    sel = ref(
        "goal_selector",
        {
            "anyOf": [
                _shape({k: tests[k] for k in ks})
                for ks in shapes
                if all(tests[k] is not None for k in ks)
            ]
        },
    )
    out = []
    if "at" in kinds and world.places:
        out.append(_shape({"every": sel, "at": _enum([p.name for p in world.places])}))
    reach = sorted({x for v in states.values() for x in v})
    if "is" in kinds and reach:
        out.append(_shape({"every": sel, "is": _enum(reach)}))
    return out


def _process_branches(
    world: World,
    skills: SkillSet,
    kinds: set[str],
    states: dict,
    conds: list[dict],
    objs: list[str] | None,
    ref,
    sets: bool = True,
) -> list[dict]:
    """What a task asks beyond an end state (goals.py): a call, an order of calls and
    conditions (``conds``: the condition branches), a set of things. ``ref(name, schema)``
    -> a schema standing for it (a ``$ref`` into the plan's ``$defs``, so the branches a goal
    item and an order item share are written once)."""
    acts = _do_branches(world, skills, objs)
    events = [ref("goal_event", {"anyOf": acts + conds})] if acts + conds else []
    order = (
        [_shape({"before": {"type": "array", "minItems": 2, "maxItems": 3, "items": events[0]}})]
        if events
        else []
    )
    return acts + order + (_every_branches(world, kinds, states, ref) if sets else [])


def goal_schema(
    world: World, skills: SkillSet, base: dict | None = None, defs: dict | None = None
) -> dict:
    """The goal array over this world's names, the same for every task: only the kinds some skill
    can make true (nothing else could be reached), each object only in the states its type can
    reach; the calls, orders and sets the skills allow (goals.py); and `missing`, the plan's way
    to say the task names a thing this world does not have. Which of these a task asks for is
    the model's to say: no reading of the task's words narrows it (the checks of
    agent/language/checks.py hold the goal to the things and amounts the task names).
    ``defs``: the plan schema's ``$defs``, where parts the goal uses more than once are put
    (None: written inline)."""
    base = dict(base or {"type": "array", "minItems": 1, "maxItems": 4})
    kinds = skills.kinds
    objs, places = [o.name for o in world.objects], [p.name for p in world.places]
    states = states_by_object(world, skills)
    # objects as places (a skill puts one object on another): on any other object
    bases = (lambda o: [n for n in objs if n != o]) if "on" in kinds else None
    branches = _object_branches(objs, kinds, places, states, bases)
    conds = list(branches)
    at_places = _place_branches(kinds, places, places)
    branches += at_places
    conds += at_places

    def ref(name: str, schema: dict) -> dict:
        if defs is None:
            return schema
        defs[name] = schema
        return {"$ref": f"#/$defs/{name}"}

    branches += _process_branches(world, skills, kinds, states, conds, None, ref)
    branches.append(_shape({"missing": {"type": "string", "minLength": 1, "maxLength": 40}}))
    out = {k: v for k, v in base.items() if k not in ("items", "prefixItems")}
    out["items"] = {"anyOf": branches}
    return out


def specialize(base: dict, world: World, skills: SkillSet, max_steps: int | None = None) -> dict:
    """-> a new schema; ``base`` is not modified. A base without ``properties.steps`` (a custom
    schema for something else) comes back unchanged."""
    schema = copy.deepcopy(base)
    steps = (
        schema.get("properties", {}).get("steps")
        if isinstance(schema.get("properties"), dict)
        else None
    )
    if not isinstance(steps, dict) or "items" not in steps:
        return schema
    step_base = _resolve(schema, steps["items"])
    defs = schema.setdefault("$defs", {})
    branches = []
    for skill in skills.skills:
        s = step_schema(step_base, skill, world)
        if s is not None:  # e.g. `open` in a world with nothing openable
            defs[f"step_{skill.name}"] = s
            branches.append({"$ref": f"#/$defs/step_{skill.name}"})
    if not branches:
        raise ThorError(
            f"no skill from {skills.source} can be used in world {world.name!r} "
            "(every skill needs an object or place the world lacks)"
        )
    steps["items"] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    goal = schema["properties"].get("goal")
    if isinstance(goal, dict) and "items" in goal:
        schema["properties"]["goal"] = goal_schema(world, skills, goal, defs)
        _drop_unused(schema, ("condition", "action", "selector"))
    if skills.max_steps is not None:  # a library of finer skills takes more steps per task
        steps["maxItems"] = skills.max_steps
    if max_steps is not None:
        steps["maxItems"] = min(int(max_steps), int(steps.get("maxItems", max_steps)))
    return schema


def _drop_unused(schema: dict, names) -> None:
    """The base's own goal vocabulary, once the goal is specialized and nothing refers to it:
    the grammar compiles every definition, used or not."""
    import json

    for name in names:
        defs = schema.get("$defs", {})
        rest = {k: v for k, v in defs.items() if k != name}
        if name in defs and f"#/$defs/{name}" not in json.dumps([schema.get("properties"), rest]):
            del defs[name]
