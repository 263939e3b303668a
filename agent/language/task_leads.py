"""Goal openings a task fixes in its own words (specialize.goal_schema takes them in place of its
usual leads): an order of things (``order_reading.Event``: "check the print, then lay it on the rack"),
a call with the task's numbers ("give the ink tin a shove 5 cm to the right", "read the
thermometer three times", "slide the bowl 3 cm to the right twice") and a set of things
(set_reading.py: "everything on the wheel onto the wedging bench")."""
from __future__ import annotations

from agent.language.amounts import angles, durations, lengths
from agent.schema.arg_schemas import _enum, _shape, allows, arg_schema
from agent.files.loader import SkillSet, World
from agent.symbolic.goals import MAX_TIMES
from agent.language.order_reading import Event
from agent.language.reading import TaskReading
from agent.language.set_reading import SET_CUES
from agent.symbolic.executor import states_by_object
from agent.language.wording import ORDER_WORDS, agent_nouns, phrases, said_spans, thing_words


def _times(branch: dict, n: int) -> dict:
    """A call's goal item done ``n`` times (as it is, once)."""
    return _shape({**branch["properties"], "times": {"const": n}}) if n > 1 else branch


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
                if not allows(arg, world, e.subject):
                    continue
                props = {arg.name: {"const": e.subject}}
                for o in s.args:       # an option the clause names ("with the lidar", "a camera scan")
                    said = _option_said(o, e.words)
                    if o is not arg and said:
                        props[o.name] = {"const": said}
                out.append(_shape({"do": {"const": s.name}, "args": _shape(props)}))
        if not out:
            key = "place_is" if place else "is"
            if key in kinds:
                out.append(_shape({"place" if place else "object": {"const": e.subject}, "is": {"const": "inspected"}}))
        return out
    if e.kind == "turn":
        return _turn_branches(e, world, skills)
    if e.kind == "go" and e.value:
        # "then dock back on your charger": the going by the skill the clause names; "then go and
        # charge" (the verb the charger is named for): that skill, or the robot there
        place = world.place(e.value)
        does = agent_nouns(thing_words(place)) if place else set()
        for s in skills.skills:
            arg = next((a for c in s.effects if c.kind == "robot_at" for a in s.args if c.value == f"${a.name}"), None)
            if arg is None or len(s.args) != 1 or not allows(arg, world, e.value):
                continue
            call = _shape({"do": {"const": s.name}, "args": _shape({arg.name: {"const": e.value}})})
            if s.name in e.words:
                return [call]
            if does & e.words:
                out.append(call)
    cond = _event_condition(e, kinds, states, where)
    return out + [cond] if cond else out


def _option_said(arg, said_words) -> str | None:
    """The one value of an enum argument the words say ("with the lidar": lidar); of several,
    the one that takes in the others ("lidar and camera both": both); None otherwise."""
    said = [v for v in (arg.values or ()) if arg.type == "enum" and v in said_words]
    if len(said) > 1:
        said = [v for v in said if v in ("both", "all")]
    return said[0] if len(said) == 1 else None


def _turn_branches(e, world: World, skills: SkillSet) -> list[dict]:
    """A turn by the angle the clause says: the one call with no lasting effect that takes an angle
    and, when the clause says what it turns over, that thing ("tip it thirty degrees over the
    polishing pad": pour onto the pad; "turn round 180 degrees": rotate)."""
    out = []
    for s in skills.skills:
        angle = [a for a in s.args if a.type in ("number", "integer") and a.unit == "deg"]
        things = [a for a in s.args if a.type in ("object", "place")]
        if s.effects or len(angle) != 1 or len(things) != (e.subject is not None):
            continue
        props = {angle[0].name: {"const": _plain(e.value)}} if e.value is not None else {}
        if things:
            if not allows(things[0], world, e.subject):
                continue
            props[things[0].name] = {"const": e.subject}
        out.append(_shape({"do": {"const": s.name}, "args": _shape({a.name: props[a.name] for a in s.args
                                                                      if a.name in props})}))
    return out if len(out) == 1 else []


def _event_condition(e, kinds: set[str], states: dict, where) -> dict | None:
    if e.kind == "state" and "is" in kinds and e.value in states.get(e.subject, ()):
        return _shape({"object": _enum([e.subject]), "is": _enum([e.value])})
    if e.kind == "at" and "at" in kinds:
        dest = [e.value] if e.value else list(where(e.subject))
        return _shape({"object": _enum([e.subject]), "at": _enum(dest)}) if dest else None
    if e.kind == "go" and "robot_at" in kinds and e.value:
        return _shape({"robot_at": _enum([e.value])})
    if e.kind == "hold" and "holding" in kinds:
        return _shape({"holding": _enum([e.subject])})
    return None


def _order_lead(r: TaskReading, world: World, skills: SkillSet, kinds: set[str], states: dict,
                where) -> tuple[list, int] | None:
    """A task that orders things (TaskReading.events) opens its goal with that `before`, one item
    per thing in the task's order, then the conditions that hold at the end (the last state of
    each thing and the robot's last place) -> (those openings, how many of them the goal must
    write: an end state the order's last call makes true, "then dock at the charging point", may
    be left out); None when the task orders nothing or a thing of it cannot be written here. A
    small model otherwise writes the first thing, or the things without their order."""
    if not r.events:
        return None
    items = [_event_branches(e, world, skills, kinds, states, where) for e in r.events]
    if not all(items):
        return None
    n = len(items)
    before = _shape({"before": {"type": "array", "prefixItems": [{"anyOf": b} for b in items], "items": False,
                                "minItems": n, "maxItems": n}})
    ends: dict = {}
    # nothing after a wait, a look or a turn moves a thing: an end state followed only by those
    # holds once the order is done ("go to the fuel berth and wait there")
    still = [k + 1 < len(r.events) and all(x.kind in ("wait", "look", "turn") for x in r.events[k + 1:])
             for k in range(len(r.events))]
    for k, (e, b) in enumerate(zip(r.events, items)):
        key = e.end_key()
        if e.kind == "at":
            ends.pop(("robot", None), None)      # carrying a thing on takes the robot away from where it went
        if key is not None:
            ends.pop(key, None)      # its last state, where that is said
            # an end state the order's own call makes true, or the hold a pour keeps, may be left out
            ends[key] = (_event_condition(e, kinds, states, where),
                         e.kind == "hold" or still[k] or any("do" in x["properties"] for x in b))
    if not all(c for c, _ in ends.values()):
        return None
    required = [c for c, by_call in ends.values() if not by_call]
    implied = [c for c, by_call in ends.values() if by_call]
    return [{"anyOf": [before]}] + [{"anyOf": [c]} for c in required + implied], 1 + len(required)


def _call_lead(r: TaskReading, world: World, skills: SkillSet) -> list | None:
    """A call the task fixes with its own numbers, about the one object (or place) it refers to:
    "read the thermometer three times" (the call that looks at it, ``times`` 3), "give the ink
    tin a shove 5 cm to the right" (the one call with no lasting effect that takes the object, a
    length and a word of the task's among its options: push right 0.05). None otherwise. A small
    model otherwise writes where the thing already is."""
    if r.events:
        return None
    turned = angles(list(r.toks))
    if turned and not r.referred and not r.places and r.length is None and r.times <= MAX_TIMES:
        # "turn 45 degrees, ... 3 turns in total": the one call that turns by an angle, repeated
        turn = _turn_branches(Event("turn", None, turned[0][1], r.words), world, skills)
        if turn:
            return [{"anyOf": [_times(turn[0], r.times)]}]
    waits = durations(list(r.toks))
    if waits and not turned and not r.referred and not r.places and r.length is None and r.times <= MAX_TIMES:
        # "just hold still for 20 seconds": the wait alone
        wait = _event_branches(Event("wait", value=waits[0][1], words=r.words), world, skills, set(), {}, lambda o: ())
        if len(wait) == 1:
            return [{"anyOf": [_times(wait[0], r.times)]}]
    things = list(r.referred) or list(r.about_places)
    if len(things) != 1:
        return None
    x = things[0]
    place = world.place(x) is not None
    if place and r.length is None and r.times == 1 and not r.referred:
        # "battery's low, go and dock at the charging station": the going by the skill it names
        # (a word of no place said: "scan the loading dock" docks nowhere)
        inside = said_spans(list(r.toks), [ph for p in r.places for ph in phrases(world.place(p))])
        named = {t for i, t in enumerate(r.toks) if i not in inside}
        going = _event_branches(Event("go", None, x, frozenset(named)), world, skills, set(), {}, lambda o: ())
        if going:
            return [{"anyOf": going}]
    if r.length is None and ("is", "inspected") in r.wanted and r.times <= MAX_TIMES:
        # "read the thermometer three times", "scan the germ lab - lidar and camera both": the
        # call that looks, repeated or with the option the words say
        looks = _event_branches(Event("look", x, None, r.words), world, skills, set(), {}, lambda o: ())
        looks = [b for b in looks if "do" in b["properties"]]
        if len(looks) == 1 and r.times > 1:
            return [{"anyOf": [_times(looks[0], r.times)]}]
        if len(looks) == 1 and len(looks[0]["properties"]["args"]["properties"]) > 1:
            return [{"anyOf": looks}]      # the option said: "sweep bay 3 with the lidar"
        return None
    if r.length is None or place or r.destinations(x) or r.times > MAX_TIMES:
        return None             # "put the cup back on the shelf, 5 cm from the edge" is no push
    out = []
    for s in skills.skills:
        if s.effects:
            continue
        obj = [a for a in s.args if a.type == "object"]
        size = [a for a in s.args if a.type == "number" and a.unit == "m"]
        opts = [a for a in s.args if a.type == "enum"]
        said = {a.name: _nearest(r, [v for v in a.values if v in r.words]) for a in opts}
        if len(obj) != 1 or len(size) != 1 or not opts or any(len(v) != 1 for v in said.values()):
            continue
        if not allows(obj[0], world, x):
            continue
        props = {obj[0].name: {"const": x}, **{k: {"const": v[0]} for k, v in said.items()},
                 size[0].name: {"const": _plain(r.length)}}
        call = {"do": {"const": s.name}, "args": _shape({a.name: props[a.name] for a in s.args if a.name in props})}
        out.append(_times(_shape(call), r.times))
    return [{"anyOf": out}] if len(out) == 1 else None


def _nearest(r: TaskReading, values: list[str]) -> list[str]:
    """Of the option words a task says, the one said nearest its length ("5 cm to the left - it's
    right on the edge": left); all of them when the words do not place the length."""
    toks = list(r.toks)
    units = [i for i, t in enumerate(toks) if lengths(toks[max(0, i - 3):i + 1])]
    if len(values) < 2 or not units:
        return values
    dist = {v: min(abs(i - units[0]) for i, t in enumerate(toks) if t == v) for v in values if v in toks}
    return [min(dist, key=dist.get)] if dist else values


def _set_lead(r: TaskReading, kinds: set[str]) -> list | None:
    """A set of things the task asks about (set_reading.py), with where its members go or, when
    it says no place, the state its verb asks of them ("close all the drawers"); None otherwise.
    A small model otherwise lists the members it guesses, or none."""
    if r.every is None:
        return None
    sel = _shape({k: {"const": v} for k, v in r.every.selector})
    if r.every.to and "at" in kinds:
        return [{"anyOf": [_shape({"every": sel, "at": _enum(list(r.every.to))})]}]
    states = sorted(v for k, v in r.wanted if k == "is")
    if not r.every.to and "is" in kinds and len(states) == 1:
        return [{"anyOf": [_shape({"every": sel, "is": {"const": states[0]}})]}]
    return None


def asks_calls(r: TaskReading, skills: SkillSet) -> bool:
    """The words may ask for a call, an order or a set, not only end states: a word of order or
    of a set, a skill's name ("dock", "push", "scan"), a look, a time, a length, a count. Without
    one, "grab the tyre levers and just hang on to them" is about the levers held, and a goal that
    opens with a pick-then-place about them is the small model's guess, not the task."""
    # a skill whose effect is a thing's state, place or grip ("open", "place", "pick") is said by
    # a condition; one with none, or one about the robot or a place ("push", "dock", "scan"), by a call
    names = {s.name for s in skills.skills if not any(c.kind in ("is", "at", "holding", "on") for c in s.effects)}
    looks = any(k == "is" and v == "inspected" for k, v in r.wanted)
    return bool(r.words & (ORDER_WORDS | SET_CUES | names) or looks or r.length is not None or r.times > 1
                or durations(list(r.toks)))


def written_order(r: TaskReading, world: World, skills: SkillSet) -> bool:
    """The task orders things and every one of them can be written with these skills (the
    grammar then opens with the order, and the gate holds a goal to it): an arm is never asked
    for the "..., then head back to bay 3" it cannot drive."""
    if not r.events or r.only_missing or r.lacking:
        return False
    kinds = skills.kinds
    places = [p.name for p in world.places]
    return _order_lead(r, world, skills, kinds, states_by_object(world, skills),
                       lambda o: list(r.destinations(o)) or places) is not None


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
