"""A small symbolic planner over the skills' declared effects (the LLM+P split).

The model grounds the task into goal conditions over the world's names; when its own steps do
not reach that goal, breadth-first search over ground skill calls finds the shortest sequence
that does, and the result goes through the same schema, safety gate and symbolic execution as
any model plan. Only calls the safety gate would pass are ever searched (a heavy, fixed or
out-of-reach object is never picked), so a goal that needs one has no solution and the
model's refusal-worthy plan is reported as it is.

Why the search stays small: preconditions and effects only name the step's own arguments, so
the only objects worth touching are the goal's (plus names written literally in a skills file).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import product

from .conditions import Cond
from .files import ArgSpec, Skill, SkillSet, World
from .gate import _arg_findings
from .specialize import MAX_TIMEOUT_S
from .symbolic import apply, goal_limits, holds, initial_state, parse_goal, reaches, step_conds

MAX_STATES = 20_000
NOTE_CHARS = 60


@dataclass(frozen=True)
class Action:
    skill: Skill
    args: dict
    pre: tuple[Cond, ...]
    eff: tuple[Cond, ...]


def _default(a: ArgSpec, world: World, template: dict | None, name: str):
    """A value for a non-symbolic argument: the model's own, when the gate accepts it; else the
    middle of the allowed range (first enum value). None when nothing safe can be chosen."""
    if template is not None and name in template and not _arg_findings("x", name, a, template[name], world):
        return template[name]
    if a.type == "enum":
        v = a.values[0]
    elif a.type in ("number", "integer"):
        lo, hi = a.min, a.max
        if a.unit == "kg":
            hi = world.robot.max_payload_kg if hi is None else min(hi, world.robot.max_payload_kg)
        v = (lo + hi) / 2 if lo is not None and hi is not None else lo if lo is not None else hi if hi is not None else 0
        v = int(round(v)) if a.type == "integer" else round(v, 3)
    elif a.type == "string":
        v = "done"[: a.max_length]
    else:
        return None          # a position is the model's to choose
    return None if _arg_findings("x", name, a, v, world) else v


def ground_actions(world: World, skills: SkillSet, objects: set[str], templates: dict) -> list[Action]:
    out = []
    for skill in skills.skills:
        if not skill.effects:
            continue          # changes nothing the goal can ask for
        tmpl = templates.get(skill.name)
        fixed, domains = {}, {}
        for a in skill.args:
            if a.type == "object":
                domains[a.name] = [o for o in sorted(objects) if world.object(o) and not _arg_findings(
                    "x", a.name, a, o, world, a.name in skill.carries)]
            elif a.type == "place":
                domains[a.name] = [p.name for p in world.places if not _arg_findings("x", a.name, a, p.name, world)]
            else:
                fixed[a.name] = _default(a, world, tmpl.get("args") if tmpl else None, a.name)
        if any(v is None for v in fixed.values()):
            continue
        names = list(domains)
        for combo in product(*(domains[n] for n in names)):
            args = {a.name: fixed[a.name] if a.name in fixed else combo[names.index(a.name)] for a in skill.args}
            conds = step_conds(skill, args, world)
            if conds is not None:
                out.append(Action(skill, args, *conds))
    return out


def relevant(goal: tuple[Cond, ...], actions: list[Action]) -> list[Action]:
    """The actions that can change a kind of condition the goal or some precondition asks
    about. Any plan with one of the others still works without it and is shorter, so no
    shortest plan uses them; dropping them keeps the state space from multiplying by what
    they change (a scan of each of twelve places: 2^12 states)."""
    need = {c.kind for c in goal} | {c.kind for a in actions for c in a.pre}
    return [a for a in actions if any(c.kind in need for c in a.eff)]


def search(goal: tuple[Cond, ...], world: World, actions: list[Action], max_depth: int) -> list[Action] | None:
    """Shortest action sequence from the world's initial state that reaches the goal."""
    actions = relevant(goal, actions)
    start = initial_state(world)
    frontier, seen = deque([(start, [])]), {start.key()}
    while frontier:
        st, path = frontier.popleft()
        if reaches(goal, st):
            return path
        if len(path) >= max_depth:
            continue
        for act in actions:
            if any(holds(c, st)[0] is False for c in act.pre):
                continue
            if any(a.type == "object" and act.args[a.name] in st.dropped for a in act.skill.args):
                continue
            nxt = apply(act.eff, st, "")
            k = nxt.key()
            if k not in seen:
                if len(seen) >= MAX_STATES:
                    return None
                seen.add(k)
                frontier.append((nxt, path + [act]))
    return None


def _timeout(skill: Skill, tmpl: dict | None) -> float:
    limit = min(skill.timeout_s or MAX_TIMEOUT_S, MAX_TIMEOUT_S)
    t = tmpl.get("timeout_s") if tmpl else None
    if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= limit:
        return t
    return limit


def complete(plan, world: World, skills: SkillSet, max_steps: int = 10) -> dict | None:
    """-> a plan with the model's goal and solver-made steps, or None (no goal, a goal naming
    something missing, already reached, or unreachable with safe calls within ``max_steps``)."""
    goal, problems = parse_goal(plan, world)
    if goal is None or problems:
        return None
    steps = plan.get("steps") if isinstance(plan.get("steps"), list) else []
    templates = {}
    for s in steps:          # the model's own values (grasp, force, speed, timeout) win where safe
        if isinstance(s, dict) and isinstance(s.get("skill"), str) and isinstance(s.get("args"), dict):
            templates.setdefault(s["skill"], s)
    objects = {n for c in goal for n, kind in c.refs() if kind == "object"}
    objects |= {n for sk in skills.skills for c in sk.preconditions + sk.effects
                for n, kind in c.refs() if kind == "object" and not n.startswith("$")}
    path = search(goal, world, ground_actions(world, skills, objects, templates), max_steps)
    if not path:
        return None
    out_steps = []
    for i, act in enumerate(path):
        tmpl = templates.get(act.skill.name)
        out_steps.append({"id": f"s{i + 1}", "skill": act.skill.name, "args": act.args,
                          "preconditions": [c.text()[:NOTE_CHARS] for c in act.pre][:3],
                          "expected_effects": [c.text()[:NOTE_CHARS] for c in act.eff][:3],
                          "timeout_s": _timeout(act.skill, tmpl), "on_failure": "abort"})
    head = {k: plan[k] for k in ("plan_id", "task") if k in plan}
    return {**head, "goal": plan["goal"], "steps": out_steps}


def stated_goal(text: str) -> dict | None:
    """The head of a plan the token budget cut off: ``{"plan_id", "task", "goal", "steps": []}``.
    The grammar writes the goal before the steps, so a plan cut inside its steps (a small model
    repeating steps, say) has still stated its goal, and the solver can complete from it. None
    when the text is not a plan whose goal was written out in full."""
    import json

    cut = text.find('"steps"')
    if cut < 0:
        return None
    try:
        head = json.loads(text[:cut].rstrip().rstrip(",") + "}")
    except json.JSONDecodeError:
        return None
    if not isinstance(head, dict) or not isinstance(head.get("goal"), list):
        return None
    return {**head, "steps": []}


def goal_reasons(plan: dict, world: World) -> list:
    """Why a stated goal cannot be done here (a name this world lacks, a heavy, fixed or
    out-of-reach object, `missing`): the findings a refusal should name."""
    goal, problems = parse_goal(plan, world)
    return problems if goal is None or problems else goal_limits(goal, world)
