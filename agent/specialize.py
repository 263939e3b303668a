"""Per-request plan schema: the base schema narrowed to this world, this skill library and (for
the goal) this task.

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
from decimal import Decimal

import jsonschema

from thor_runtime.errors import ThorError

from .files import ArgSpec, Skill, SkillSet, World
from .goals import MAX_TIMES
from .reading import Event, TaskReading, read_task
from .symbolic import states_by_object

NUMBER_STEP = 0.001     # resolution of number args: 1 mm, 1 ms, 1 mN ...
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


def arg_schema(arg: ArgSpec, world: World) -> dict | None:
    """JSON schema for one argument, or None when no value can satisfy it in this world."""
    t = arg.type
    if t in ("number", "integer"):
        hi = arg.max
        if arg.unit == "kg":   # a mass argument can never exceed what the robot can lift
            hi = world.robot.max_payload_kg if hi is None else min(hi, world.robot.max_payload_kg)
        return _number(arg.min, hi, t == "integer")
    if t == "string":
        return {"type": "string", "minLength": 1, "maxLength": arg.max_length}
    if t == "enum":
        return {"enum": list(arg.values)}
    if t == "object":
        names = [o.name for o in world.objects if not arg.object_types or o.type in arg.object_types]
        return {"enum": names} if names else None
    if t == "place":
        names = [p.name for p in world.places]
        return {"enum": names} if names else None
    if t == "position":
        lo, hi = world.robot.workspace_min, world.robot.workspace_max
        return {"type": "array", "prefixItems": [_number(a, b, False) for a, b in zip(lo, hi)],
                "items": False, "minItems": 3, "maxItems": 3}
    raise ThorError(f"arg {arg.name!r}: unknown type {t!r}")


def args_schema(skill: Skill, world: World) -> dict | None:
    props = {}
    for a in skill.args:
        s = arg_schema(a, world)
        if s is None:
            return None
        props[a.name] = s
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def step_schema(step_base: dict, skill: Skill, world: World) -> dict | None:
    args = args_schema(skill, world)
    if args is None:
        return None
    out = copy.deepcopy(step_base)
    props = dict(out.get("properties", {}))
    props["skill"] = {"const": skill.name}
    props["args"] = args
    limit = min(skill.timeout_s or MAX_TIMEOUT_S, MAX_TIMEOUT_S)
    props["timeout_s"] = {"type": "number", "minimum": TIMEOUT_STEP, "maximum": limit, "multipleOf": TIMEOUT_STEP}
    # Key order is the generation order: keep the base's, append anything new at the end.
    out["properties"] = {k: props[k] for k in [*step_base.get("properties", {}), *props] if k in props}
    out["additionalProperties"] = False
    return out


def _enum(names: list[str]) -> dict:
    return {"enum": names}


def _shape(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _object_branches(objs: list[str], kinds: set[str], places, states: dict,
                     only: set | None = None, bases=None) -> list[dict]:
    """Conditions about these objects: at a place, held, in a state their type can reach, or on
    another object (objects with the same choices share one branch, so the grammar stays small).
    places: the names an `at` may take, or f(object) -> them; only: {(kind, state)} to keep
    (the task's verbs), None for all; bases: f(object) -> the objects an `on` may take."""
    def keep(kind: str, st: str | None = None) -> bool:
        return only is None or (kind, st) in only

    def grouped(key: str, values) -> list[dict]:
        groups: dict[tuple[str, ...], list[str]] = {}
        for o in objs:
            vs = tuple(values(o))
            if vs:
                groups.setdefault(vs, []).append(o)
        return [_shape({"object": _enum(g), key: _enum(list(vs))}) for vs, g in groups.items()]

    out = []
    if "at" in kinds and objs and keep("at"):
        out += grouped("at", places if callable(places) else (lambda o: places))
    if "holding" in kinds and objs and keep("holding"):
        out.append(_shape({"holding": _enum(objs)}))
    if "is" in kinds:
        groups = {}
        for o in objs:
            st = tuple(x for x in states.get(o, ()) if keep("is", x))
            if st:
                groups.setdefault(st, []).append(o)
        out += [_shape({"object": _enum(g), "is": _enum(list(st))}) for st, g in groups.items()]
    if "on" in kinds and objs and keep("on") and bases is not None:
        out += grouped("on", bases)
    return out


def _lead(name: str, kinds: set[str], places, states: dict, verbs: set, bases=None) -> list[dict]:
    """The goal's condition about an object the task names: the kind its verb asks for when
    the object can take it ("open the cabinet": cabinet open), else any."""
    return (_object_branches([name], kinds, places, states, verbs, bases)
            or _object_branches([name], kinds, places, states, None, bases))


def _stacked_over(obj: str, supports: dict) -> set[str]:
    """The objects the task puts above ``obj``, directly or on one another."""
    out, todo = set(), [obj]
    while todo:
        below = todo.pop()
        for top, bases in supports.items():
            if below in bases and top not in out:
                out.add(top)
                todo.append(top)
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
        out.append({**_shape({"do": {"const": s.name}, "args": args,
                              "times": {"type": "integer", "minimum": 2, "maximum": MAX_TIMES}}),
                    "required": ["do", "args"]})
    return out


def _every_branches(world: World, kinds: set[str], states: dict, ref) -> list[dict]:
    """Sets of objects by type, by where they rest at the start, by whether the robot can carry
    them, and pairs of those: each member at a place, or in a state."""
    types = sorted({o.type for o in world.objects})
    homes = [p.name for p in world.places if any(o.at == p.name for o in world.objects)]
    tests = {"type": _enum(types), "at": _enum(homes) if homes else None, "carriable": {"const": True}}
    shapes = [("type",), ("at",), ("carriable",), ("type", "carriable"), ("at", "carriable"), ("at", "type")]
    sel = ref("goal_selector", {"anyOf": [_shape({k: tests[k] for k in ks}) for ks in shapes
                                          if all(tests[k] is not None for k in ks)]})
    out = []
    if "at" in kinds and world.places:
        out.append(_shape({"every": sel, "at": _enum([p.name for p in world.places])}))
    reach = sorted({x for v in states.values() for x in v})
    if "is" in kinds and reach:
        out.append(_shape({"every": sel, "is": _enum(reach)}))
    return out


def _process_branches(world: World, skills: SkillSet, kinds: set[str], states: dict, conds: list[dict],
                      objs: list[str] | None, ref, sets: bool = True) -> list[dict]:
    """What a task asks beyond an end state (goals.py): a call, an order of calls and
    conditions (``conds``: the condition branches), a set of things. ``ref(name, schema)``
    -> a schema standing for it (a ``$ref`` into the plan's ``$defs``, so the branches a goal
    item and an order item share are written once)."""
    acts = _do_branches(world, skills, objs)
    events = [ref("goal_event", {"anyOf": acts + conds})] if acts + conds else []
    order = [_shape({"before": {"type": "array", "minItems": 2, "maxItems": 3, "items": events[0]}})] if events else []
    return acts + order + (_every_branches(world, kinds, states, ref) if sets else [])


def _plain(v: float):
    return int(v) if float(v).is_integer() else v


def _event_branches(e, world: World, skills: SkillSet, kinds: set[str], states: dict, where) -> list[dict]:
    """The goal items one thing of an ordered task may be written as (reading.Event): a wait of
    the time it says, a call that looks at what it says (an option the clause names fixed:
    "with the lidar"), or the condition it makes true."""
    out = []
    if e.kind == "wait":
        for s in skills.skills:
            if not s.effects and len(s.args) == 1 and s.args[0].type in ("number", "integer") and s.args[0].unit == "s":
                a = s.args[0]
                dur = {"const": _plain(e.value)} if e.value is not None else arg_schema(a, world)
                out.append(_shape({"do": {"const": s.name}, "args": _shape({a.name: dur})}))
        return out
    if e.kind == "look":
        place = world.place(e.subject) is not None
        for s in skills.skills:
            for c in s.effects:
                arg = next((a for a in s.args if c.subject == f"${a.name}"), None)
                if arg is None or c.value != "inspected" or c.kind != ("place_is" if place else "is"):
                    continue
                allowed = arg_schema(arg, world)
                if allowed is None or e.subject not in allowed.get("enum", ()):
                    continue
                props = {arg.name: {"const": e.subject}}
                for o in s.args:       # an option the clause names ("with the lidar", "a camera scan")
                    said = [v for v in (o.values or ()) if o.type == "enum" and v in e.words]
                    if o is not arg and said:
                        props[o.name] = {"const": said[0]}
                out.append(_shape({"do": {"const": s.name}, "args": _shape(props)}))
        if not out:
            key = "place_is" if place else "is"
            if key in kinds:
                out.append(_shape({"place" if place else "object": {"const": e.subject}, "is": {"const": "inspected"}}))
        return out
    cond = _event_condition(e, kinds, states, where)
    return [cond] if cond else []


def _event_condition(e, kinds: set[str], states: dict, where) -> dict | None:
    if e.kind == "state" and "is" in kinds and e.value in states.get(e.subject, ()):
        return _shape({"object": _enum([e.subject]), "is": _enum([e.value])})
    if e.kind == "at" and "at" in kinds:
        dest = [e.value] if e.value else list(where(e.subject))
        return _shape({"object": _enum([e.subject]), "at": _enum(dest)}) if dest else None
    if e.kind == "go" and "robot_at" in kinds and e.value:
        return _shape({"robot_at": _enum([e.value])})
    return None


def _order_lead(r: TaskReading, world: World, skills: SkillSet, kinds: set[str], states: dict, where) -> list | None:
    """A task that orders things (TaskReading.events) opens its goal with that `before`, one item
    per thing in the task's order, then the conditions that hold at the end (the last state of
    each thing and the robot's last place); None when the task orders nothing or a thing of it
    cannot be written here. A small model otherwise writes the first thing, or the things without
    their order."""
    if not r.events:
        return None
    items = [_event_branches(e, world, skills, kinds, states, where) for e in r.events]
    if not all(items):
        return None
    n = len(items)
    before = _shape({"before": {"type": "array", "prefixItems": [{"anyOf": b} for b in items], "items": False,
                                "minItems": n, "maxItems": n}})
    ends: dict = {}
    for e in r.events:
        key = {"state": ("is", e.subject), "at": ("at", e.subject), "go": ("robot", None)}.get(e.kind)
        if key is not None:
            ends.pop(key, None)      # its last state, where that is said
            ends[key] = _event_condition(e, kinds, states, where)
    return [{"anyOf": [before]}] + [{"anyOf": [c]} for c in ends.values()]


def _call_lead(r: TaskReading, world: World, skills: SkillSet) -> list | None:
    """A call the task fixes with its own numbers, about the one object (or place) it refers to:
    "read the thermometer three times" (the call that looks at it, ``times`` 3), "give the ink
    tin a shove 5 cm to the right" (the one call with no lasting effect that takes the object, a
    length and a word of the task's among its options: push right 0.05). None otherwise. A small
    model otherwise writes where the thing already is."""
    if r.events:
        return None
    things = list(r.referred) or list(r.about_places)
    if len(things) != 1:
        return None
    x = things[0]
    place = world.place(x) is not None
    if r.times > 1 and r.length is None and ("is", "inspected") in r.wanted and 2 <= r.times <= MAX_TIMES:
        looks = _event_branches(Event("look", x, None, r.words), world, skills, set(), {}, lambda o: ())
        looks = [b for b in looks if "do" in b["properties"]]
        if len(looks) == 1:
            b = looks[0]
            return [{"anyOf": [_shape({**b["properties"], "times": {"const": r.times}})]}]
        return None
    if r.length is None or place or r.times > 1 or r.destinations(x):
        return None             # "put the cup back on the shelf, 5 cm from the edge" is no push
    out = []
    for s in skills.skills:
        if s.effects:
            continue
        obj = [a for a in s.args if a.type == "object"]
        size = [a for a in s.args if a.type == "number" and a.unit == "m"]
        opts = [a for a in s.args if a.type == "enum"]
        said = {a.name: [v for v in a.values if v in r.words] for a in opts}
        if len(obj) != 1 or len(size) != 1 or not opts or any(len(v) != 1 for v in said.values()):
            continue
        allowed = arg_schema(obj[0], world)
        if allowed is None or x not in allowed.get("enum", ()):
            continue
        props = {obj[0].name: {"const": x}, **{k: {"const": v[0]} for k, v in said.items()},
                 size[0].name: {"const": _plain(r.length)}}
        out.append(_shape({"do": {"const": s.name}, "args": _shape({a.name: props[a.name] for a in s.args
                                                                      if a.name in props})}))
    return [{"anyOf": out}] if len(out) == 1 else None


def fixed_call(r: TaskReading, world: World, skills: SkillSet) -> dict | None:
    """The goal item of a call the task fixes (``_call_lead``), as the grammar writes it, or
    None: ``{"do": "push", "args": {"object": "ink_tin", "direction": "right", "distance": 0.05}}``.
    The gate holds a goal decoded under another grammar to it (grounding.py)."""
    lead = None if r.only_missing or r.lacking else _call_lead(r, world, skills)
    if not lead:
        return None

    def value(node):
        if "const" in node:
            return node["const"]
        return {k: value(v) for k, v in node["properties"].items()}
    return value(lead[0]["anyOf"][0])


def goal_schema(world: World, skills: SkillSet, task: str | None = None, base: dict | None = None,
                reading: TaskReading | None = None, defs: dict | None = None) -> dict:
    """The goal array over this world's names: only the kinds some skill can make true (nothing
    else could be reached), each object only in the states its type can reach, plus `missing`,
    the plan's way to say the task names a thing this world does not have.

    With the ``task``, the goal is focused on its reading (reading.py): its conditions are
    about objects the task mentions, and it opens with one condition about each object the task
    refers to, in the task's order. A small model otherwise states half of a two-object task,
    or plans for a thing the world has in place of one it lacks. A referred object's opening
    condition is of the kind the task's verb asks for, when it can take it ("open the cabinet":
    cabinet open, not cabinet at some place); when the task says where things go, `at` takes
    only those places; a task about places alone (go, scan) opens with a condition about one
    of them; a task that mentions no world object and asks for no place can only say
    `missing`. The gate checks the same reading, so a plan decoded under another schema is
    held to it too. ``reading``: the task's reading when the caller already has it (read once
    per request), else it is read here. ``defs``: the plan schema's ``$defs``, where parts
    the goal uses more than once are put (None: written inline)."""
    base = dict(base or {"type": "array", "minItems": 1, "maxItems": 4})
    kinds = {c.kind for s in skills.skills for c in s.effects}
    objs, places = [o.name for o in world.objects], [p.name for p in world.places]
    states = states_by_object(world, skills)
    lead: list[dict] = []
    where, looked_at = places, places
    # objects as places (a skill puts one object on another): on any other object of the task's
    bases = (lambda o: [n for n in objs if n != o]) if "on" in kinds else None
    only_missing = False
    r = reading if reading is not None or task is None else read_task(task, world)
    if r is not None:
        only_missing = r.only_missing
        # a thing to carry that is not here ("put a sunflower in with the roses"): nothing else
        objs = [] if only_missing else list(r.mentioned)
        where = lambda o: list(r.destinations(o)) or places
        if bases is not None:       # on what the task says it goes on, else on another it mentions
            bases = lambda o: list(r.supports.get(o, ())) or [n for n in objs if n != o]
        # an object said only as what another goes on is no lead of its own ("... on the blue block")
        for n in [n for n in ([] if only_missing else r.referred) if bases is None or n not in r.under]:
            verbs = r.verbs_for(n)
            bs = _lead(n, kinds, where, states, verbs, bases)
            lead += [{"anyOf": bs}] if bs else []
            said = verbs - {("holding", None), ("at", None)}
            if said and _object_branches([n], kinds, places, states, said) and r.also_at(n) and "at" in kinds:
                # "check the lens, then leave it on the desk": its state, then its place
                lead.append({"anyOf": [_shape({"object": _enum([n]), "at": _enum(list(r.also_at(n)))})]})
        if r.go_to is not None and "robot_at" in kinds and not only_missing:
            # "..., then head back to the charger": the robot's own end place last
            lead.append({"anyOf": [_shape({"robot_at": _enum(list(r.go_to) or places)})]})
        dest = list(r.about_places)
        if dest:
            # a task about places alone: go there, or look at it, by its verbs
            pk = r.place_kinds
            pb = _place_branches(kinds, dest if "place_is" in pk else [], dest if "robot_at" in pk else [])
            lead = [{"anyOf": pb}] if pb else []
            looked_at = dest
    tail, tail_bases = objs, bases
    if bases is not None and r is not None and r.supports:
        # a stacking task: a block rests in one spot and holds up one block, so what follows the
        # leads neither moves a block they place, nor puts another where one of them goes, nor
        # puts a block onto one the task stacks above it (a loop)
        placed = {n for n in r.referred if n not in r.under}
        taken = {x for xs in r.supports.values() for x in xs}
        tail = [o for o in objs if o not in placed]
        tail_bases = lambda o: [n for n in bases(o) if n not in taken and n not in _stacked_over(o, r.supports)]
    branches = _object_branches(tail, kinds, where, states, None, tail_bases)
    if not only_missing:
        branches += _place_branches(kinds, looked_at, places)

    def ref(name: str, schema: dict) -> dict:
        if defs is None:
            return schema
        defs[name] = schema
        return {"$ref": f"#/$defs/{name}"}

    # a task about no object of this world may still ask for a call on none ("turn round
    # 180 degrees", "wait ten seconds"); its object calls and sets are for tasks about things.
    # A set needs a word of one ("all", "everything", "anything": a closed class of words):
    # a small model otherwise copies the `every` form onto "scan the loading dock"
    lacking = r is not None and bool(r.lacking)          # a thing to carry that is not here: nothing else
    sets = not only_missing and (r is None or r.sets)
    process = [] if lacking else _process_branches(world, skills, kinds, states, list(branches),
                                                   objs if r is not None else None, ref, sets=sets)
    branches += process
    # an object the task names may open the goal with a call on it or an order too
    more = [ref("goal_process", {"anyOf": process})] if lead and process else []
    lead = [{"anyOf": x["anyOf"] + more} for x in lead]
    # "check the print, then lay it on the rack": the order first, then what must hold at the end,
    # and nothing else (the order takes in every thing and place the task speaks of); "shove the
    # tin 5 cm to the right": that call alone
    fixed = None if r is None or only_missing or lacking else (
        _order_lead(r, world, skills, kinds, states, where) or _call_lead(r, world, skills))
    if fixed and len(fixed) <= int(base.get("maxItems", len(fixed))):
        lead = fixed
        base["maxItems"] = len(fixed)
    # `missing` names a thing the task says and the world lacks, never a world name
    unknown = list(r.unknown) if r is not None else []
    branches.append(_shape({"missing": _enum(unknown) if unknown else
                            {"type": "string", "minLength": 1, "maxLength": 40}}))
    out = {k: v for k, v in base.items() if k not in ("items", "prefixItems")}
    out["items"] = {"anyOf": branches}
    cap = out.get("maxItems")
    lead = lead[:cap] if isinstance(cap, int) else lead
    if lead:
        out["prefixItems"] = lead
        out["minItems"] = max(int(out.get("minItems", 0)), len(lead))
    return out


def specialize(base: dict, world: World, skills: SkillSet, max_steps: int | None = None,
               task: str | None = None, reading: TaskReading | None = None) -> dict:
    """-> a new schema; ``base`` is not modified. A base without ``properties.steps`` (a custom
    schema for something else) comes back unchanged. ``reading``: the task's, when the caller
    has read it already (goal_schema)."""
    schema = copy.deepcopy(base)
    steps = schema.get("properties", {}).get("steps") if isinstance(schema.get("properties"), dict) else None
    if not isinstance(steps, dict) or "items" not in steps:
        return schema
    step_base = _resolve(schema, steps["items"])
    defs = schema.setdefault("$defs", {})
    branches = []
    for skill in skills.skills:
        s = step_schema(step_base, skill, world)
        if s is not None:   # e.g. `open` in a world with nothing openable
            defs[f"step_{skill.name}"] = s
            branches.append({"$ref": f"#/$defs/step_{skill.name}"})
    if not branches:
        raise ThorError(f"no skill from {skills.source} can be used in world {world.name!r} "
                        "(every skill needs an object or place the world lacks)")
    steps["items"] = branches[0] if len(branches) == 1 else {"anyOf": branches}
    goal = schema["properties"].get("goal")
    if isinstance(goal, dict) and "items" in goal:
        schema["properties"]["goal"] = goal_schema(world, skills, task, goal, reading, defs)
        _drop_unused(schema, ("condition", "action", "selector"))
    if skills.max_steps is not None:      # a library of finer skills takes more steps per task
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


# ---- validation with exact decimal multipleOf -------------------------------------------------
def _multiple_of(validator, m, instance, schema):
    """jsonschema's float multipleOf says 1.001 is not a multiple of 0.001 (binary rounding);
    the grammar counts decimal digits. Compare as decimals so both agree."""
    if not validator.is_type(instance, "number"):
        return
    q = Decimal(str(instance)) / Decimal(str(m))
    if q != q.to_integral_value():
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {m}")


PlanValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"multipleOf": _multiple_of})
