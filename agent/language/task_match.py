"""Does the plan's goal talk about what the task talks about? A check on words, not on meaning.

Symbolic execution proves that the steps reach the plan's *own* goal; nothing so far held the
goal to the task. A small model that is asked for a thing the world lacks ("put the orchid on
the bench" in a greenhouse without one) tends to swap in a thing the world has and plan for it,
and a task naming two objects often gets a goal about the first only. Both leave a plan that
is valid, safe and wrong. These findings catch them, all from the task's reading (reading.py):

- ``object``: a goal condition is about an object the task never mentions (by a word of its
  name, or its type). The repair prompt then points at ``missing``; a model that insists is
  refused, which is the safe side of a plan about the wrong thing.
- ``goal``: the task refers to a world object and the goal says nothing about it; or the
  task's own verb ("open", "shut", "have a look", "keep it in your hand") asks for a condition
  of a referred object that can take it, and the goal does not state it; or the goal puts an
  object at a place the task does not say, when the task does say where ("from the supply
  room to bay 2": bay 2), or on an object the task does not say, when it says what it goes on
  ("the red block on the blue block"); or a task about places only (go, scan) says nothing of them;
  or the task orders things (``TaskReading.events``: "check the print, then lay it on the rack")
  and the goal has no `before`; or it fixes a call with its numbers ("a shove 5 cm to the
  right", "three times": task_leads.fixed_call) and the goal does not ask for it.
- ``object`` too: the task mentions no object of this world and is neither about the robot
  going somewhere nor about looking at a place ("bring the pallet", "the newspaper goes on the
  desk"), yet the goal says nothing is missing.

A place the task does not name is never held against the goal when the task names none.
"""
from __future__ import annotations

import json

from agent.symbolic.conditions import Cond
from agent.files.loader import World
from agent.symbolic.findings import Finding
from agent.symbolic.goals import Act, Goal
from agent.language.reading import TaskReading, read_task
from agent.language.task_leads import fixed_call, written_order
from agent.symbolic.executor import ParsedGoal, parse_goal, states_by_object

_OBJECT_KINDS = ("at", "is", "holding", "on")


def grounding_findings(task: str, plan, world: World, skills=None, parsed: ParsedGoal | None = None,
                       reading: TaskReading | None = None) -> list[Finding]:
    """Findings (see the module doc) for a plan whose goal parses; [] when there is no goal to
    hold to the task (the gate reports that) or the goal already says a thing is missing.
    With ``skills``, what the task's verbs ask is checked too, where a skill can make it true
    (an object's reachable states, the robot's place), as the goal schema asks it.
    ``parsed`` (the plan's parse_goal) and ``reading`` (the task's read_task), when the caller
    already has them: a planner reads its task once per request and parses a goal once per attempt."""
    goal, problems = parse_goal(plan, world, skills) if parsed is None else parsed
    if goal is None or problems or any(c.kind == "missing" for c in goal):
        return []
    r = read_task(task, world) if reading is None else reading
    if r.lacking:       # whatever else the goal says, the thing to carry is not here
        return [Finding(None, "object", f"the task asks for {' '.join(r.lacking)}, which is no object of this "
                                        f'world; the goal is [{{"missing": "{r.lacking[-1]}"}}]')]
    kinds = skills.kinds if skills is not None else set()
    reachable = reachable_conditions(world, skills) if skills is not None else (lambda name: set())
    out: list[Finding] = []
    # a call on an object, or an order naming it, is about it as much as a condition is; the
    # members of a set ("everything on the counter") are said by the set, not one by one
    in_goal = {c.subject for c in goal if c.kind in _OBJECT_KINDS} | goal.objects(world)
    members = {n for _, names in goal.sets for n in names}
    for c in [c for c in goal if c.subject not in members] + goal.all_acts() + goal.all_conds()[len(goal):]:
        for name in (c.objects(world) if c.kind == "do" else [n for n, k in c.refs() if k == "object"]
                     if c.kind in _OBJECT_KINDS else []):
            if name not in r.mentioned:
                out.append(Finding(None, "object", _unmentioned(c, name)))
    for name in r.referred:
        if name not in in_goal:
            out.append(Finding(None, "goal", f"the task names {name}, but the goal says nothing about it; "
                                             "state one condition for each object the task names"))
    if r.events and not goal.orders and (skills is None or written_order(r, world, skills)):
        # "scan the vault, wait 30 seconds, and scan it again": the goal grammar opens with it
        out.append(Finding(None, "goal", f"the task asks for {', then '.join(e.text() for e in r.events)} in that "
                                         'order; the goal states no {"before": [...]} with it'))
    want = fixed_call(r, world, skills) if skills is not None and not r.events else None
    if want is not None:
        # "give the ink tin a shove 5 cm to the right": the goal grammar opens with that call
        call = Act(want["do"], tuple(want["args"].items()), want.get("times", 1))
        if not any(call.matches(a.skill, a.arg_dict) and a.times == call.times for a in goal.all_acts()):
            out.append(Finding(None, "goal", f"the task asks for {call.text()}; the goal does not say so: "
                                             f"{json.dumps(want, separators=(',', ':'))}"))
    said = Goal(_said(goal, skills), goal.acts, goal.orders)
    return out + place_findings(r, said, kinds) + verb_findings(r, said, reachable, kinds)


def _said(goal, skills) -> list[Cond]:
    """What the goal says will hold at some point: its conditions, those in its orders, and the
    effects of the calls it asks for ("inspect the kit" as a call says the kit is inspected)."""
    out = list(goal.all_conds())
    for a in goal.all_acts():
        skill = skills.get(a.skill) if skills is not None else None
        for c in skill.effects if skill is not None else ():
            g = c.ground(a.arg_dict)
            if all(n is not None and not n.startswith("$") for n, _ in g.refs()):
                out.append(g)
    return out


def place_findings(r: TaskReading, goal, kinds: set[str]) -> list[Finding]:
    """Where the task says things go, and a task about places alone (when a skill can reach a
    condition about a place: ``kinds``, the skills' effect kinds)."""
    out = []
    for c in goal:
        dest = r.destinations(c.subject) if c.kind == "at" else ()
        if dest and c.value not in dest:
            out.append(Finding(None, "goal", f"goal {c.text()}: the task says where it goes: {' or '.join(dest)}"))
        base = r.supports.get(c.subject, ()) if c.kind == "on" else ()
        if base and c.value not in base:
            out.append(Finding(None, "goal", f"goal {c.text()}: the task says what it goes on: {' or '.join(base)}"))
    asked = r.place_kinds & kinds
    dest = r.about_places if asked else ()
    if dest and not any(c.subject in dest or c.value in dest for c in goal if c.kind in asked):
        what = {"place_is": "looked at", "robot_at": "gone to"}
        out.append(Finding(None, "goal", f"the task asks for {' or '.join(dest)} to be "
                                         f"{' or '.join(what[k] for k in sorted(asked))}; the goal does not say so"))
    return out


def verb_findings(r: TaskReading, goal, reachable, kinds: set[str]) -> list[Finding]:
    """The task's verbs against the goal: "open the cabinet" with no `cabinet open`.
    reachable(object name) -> the (kind, state) a skill can give it; kinds: the skills' effect
    kinds. A verb no referred object can take ("open the trowel") is left to the other checks."""
    out = []
    if not any(c.kind in _OBJECT_KINDS for c in goal) and not getattr(goal, "process", False) and r.only_missing:
        out.append(Finding(None, "object", "the task mentions no object of this world and asks for no place to be "
                                           'visited or looked at; if what it asks for is not here, the goal is '
                                           '[{"missing": "<it>"}]'))
    for name in r.referred:
        want = r.verbs_for(name) & (reachable(name) | {(k, None) for k in ("at", "on") if k in kinds})
        have = {(c.kind, c.value if c.kind == "is" else None) for c in goal if c.subject == name}
        if want and have and not want & have:      # (an object left out is said above)
            said = " or ".join(sorted(st or {"holding": "held", "on": "on " + " or ".join(r.supports.get(name, ()))}.get(
                k, "at " + " or ".join(r.destinations(name))) for k, st in want))
            out.append(Finding(None, "goal", f"the task asks for {name} {said}; the goal does not say so"))
        also = r.also_at(name) if "at" in kinds and want - {("holding", None), ("at", None)} else ()
        if also and not any(c.kind == "at" and c.subject == name and c.value in also for c in goal):
            out.append(Finding(None, "goal", f"the task also puts {name} at {' or '.join(also)}; "
                                             "the goal does not say so"))
    if r.go_to is not None and r.referred and "robot_at" in kinds and not any(c.kind == "robot_at" and (not r.go_to or c.value in r.go_to)
                                                      for c in goal):
        where = " or ".join(r.go_to) or "a place"
        out.append(Finding(None, "goal", f"the task sends the robot to {where} at the end; the goal does not say so"))
    return out


def reachable_conditions(world: World, skills):
    """-> f(object name) -> {(kind, state)} some skill can make true of it."""
    kinds = skills.kinds
    states = states_by_object(world, skills)
    held = {("holding", None)} if "holding" in kinds else set()
    return lambda name: held | {("is", st) for st in states.get(name, ())}


def _unmentioned(c: Cond, name: str) -> str:
    return (f"goal {c.text()}: the task does not mention {name}; if the task names a thing this "
            'world does not have, the goal is [{"missing": "<that thing>"}]')
