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

import jsonschema

from thor_runtime.errors import ThorError

from agent.schema.validator import PlanValidator  # noqa: F401  (re-exported)
from agent.schema.arg_schemas import _enum, _resolve, _shape, args_schema, step_schema
from agent.files.loader import SkillSet, World
from agent.symbolic.goals import MAX_TIMES
from agent.language.reading import TaskReading, read_task
from agent.symbolic.executor import states_by_object
from agent.language.task_leads import _call_lead, _order_lead, _set_lead, asks_calls

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
    kinds = skills.kinds
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
    # a state the task's verb asks of a thing it names is that thing's one end state where the
    # words ask for no call or order: "close the door or the pots will dry out" is never the door
    # closed and open ("open it, wait, and shut it again" is)
    calls = r is None or asks_calls(r, skills)        # the words may ask for a call, an order or a set
    said = {n: {v for k, v in r.verbs_for(n) if k == "is"} for n in (r.referred if not calls else ())}
    tail_states = {o: tuple(x for x in v if not said.get(o) or x in said[o]) for o, v in states.items()}
    branches = _object_branches(tail, kinds, where, tail_states, None, tail_bases)
    # an order may still pass through another state ("open it, wait, and shut it again")
    conds = _object_branches(tail, kinds, where, states, None, tail_bases) if said else list(branches)
    if not only_missing:
        at_places = _place_branches(kinds, looked_at, places)
        branches += at_places
        conds += at_places

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
    # "where's the sponge got to? put it by the sink": a thing to carry that is not here, and no
    # word that may ask for a call ("hang on thirty seconds, then ..."): nothing else
    lacking |= only_missing and r is not None and r.carry and not calls
    process = [] if lacking else _process_branches(world, skills, kinds, states, conds,
                                                   objs if r is not None else None, ref, sets=sets)
    branches += process
    # an object the task names may open the goal with a call on it or an order too
    more = [ref("goal_process", {"anyOf": process})] if lead and process and calls else []
    lead = [{"anyOf": x["anyOf"] + more} for x in lead]
    # "check the print, then lay it on the rack": the order first, then what must hold at the end,
    # and nothing else (the order takes in every thing and place the task speaks of); "shove the
    # tin 5 cm to the right": that call alone
    fixed, need = None, None       # need: how many of the fixed openings the goal must write
    if r is not None and not only_missing and not lacking:
        fixed, need = _order_lead(r, world, skills, kinds, states, where) or (
            _call_lead(r, world, skills) or _set_lead(r, kinds), None)
    if fixed and len(fixed) <= int(base.get("maxItems", len(fixed))):
        lead = fixed
        base["maxItems"] = len(fixed)
    else:
        need = None
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
        out["minItems"] = max(int(out.get("minItems", 0)), len(lead) if need is None else need)
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
