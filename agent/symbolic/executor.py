"""Symbolic execution: run a plan's steps on the world's initial state, using the skills'
declared preconditions and effects, and check the plan's own stated goal on the final state.

The state is what the vocabulary in conditions.py can say: what the hand holds, at which place
(or on which object) each object rests, which things are open / closed / inspected, where the
robot base is. An object rests on another when its location is that object's name (names are one
namespace), so a block is clear when it is not held and no location names it. A fact
the world file does not state (a drawer with no `state`, a robot with no `at`) is *unknown*:
a skill precondition on an unknown fact passes (the file did not say otherwise), but a goal
condition is reached only by a known fact.

Findings (check names in findings.CHECKS): `hand_full` (pick while holding), `not_held` (place
without holding), `dropped` (an object used after the plan dropped it), `precondition` (any
other unmet precondition), `left_held` (an object still in the hand at the end that the goal
does not ask to hold), `goal` (a goal condition not reached, or a goal that is not well formed);
and `payload` / `graspable` / `workspace` / `object` for a goal no safe steps can reach (it
moves a heavy or fixed object, touches something out of reach, or names a missing thing).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from agent.files.loader import Skill, SkillSet, World
from agent.symbolic.conditions import Cond
from agent.symbolic.findings import Finding
from agent.symbolic.goals import (
    Goal,
    advance,
    done,
    empty_sets,
    parse_goal_items,
    progress_findings,
    start,
)
from agent.symbolic.limits import _arg_findings
from thor_runtime.errors import ThorError

HELD = "(held)"  # an object's location while the robot holds it


@dataclass(frozen=True)
class State:
    held: str | None = None
    loc: dict = field(default_factory=dict)  # object -> place | object under it | HELD | None
    status: dict = field(default_factory=dict)  # object -> "open" | "closed"
    inspected: frozenset = frozenset()
    robot_at: str | None = None
    dropped: frozenset = frozenset()  # objects this plan let go of at no place
    why: dict = field(default_factory=dict)  # object -> how it got where it is (for messages)

    def key(self) -> tuple:
        """What identifies a state for search (``why`` is only for messages)."""
        return (
            self.held,
            tuple(sorted(self.loc.items(), key=lambda kv: kv[0])),
            tuple(sorted(self.status.items())),
            self.inspected,
            self.robot_at,
            self.dropped,
        )


def initial_state(world: World) -> State:
    return State(
        loc={o.name: o.on or o.at for o in world.objects},
        status={o.name: o.state for o in world.objects if o.state is not None},
        robot_at=world.robot.at,
    )


def where(st: State, obj: str) -> str:
    """Where an object is, in words, with how it got there when the plan moved it."""
    at = st.loc.get(obj)
    # every object is a key of ``loc``: a location that is one is what the object rests on
    text = (
        "held"
        if at == HELD
        else (f"on {at}" if at in st.loc else f"at {at}")
        if at
        else "at no named place"
    )
    how = st.why.get(obj)
    return f"{obj} is {text}" + (f" ({how})" if how else "")


def holds(c: Cond, st: State) -> tuple[bool | None, str]:
    """-> (True / False / None for unknown, what actually is the case)."""
    k, s, v = c.kind, c.subject, c.value
    if k == "hand":
        full = st.held is not None
        ok = full if v == "full" else not full
        return ok, (f"the hand holds {st.held}" if full else "the hand is empty")
    if k == "holding":
        if st.held == s:
            return True, ""
        return False, (f"the hand holds {st.held}, not {s}" if st.held else where(st, s))
    if k in ("at", "on"):
        return st.loc.get(s) == v, where(st, s)
    if k == "clear":
        above = sorted(o for o, at in st.loc.items() if at == s)
        return (st.held != s and not above), (
            f"{s} is held"
            if st.held == s
            else f"{' and '.join(above)} {'is' if len(above) == 1 else 'are'} on {s}"
        )
    if k in ("is", "place_is"):
        if v == "inspected":
            return s in st.inspected, f"{s} was not inspected"
        now = st.status.get(s)
        return (None if now is None else now == v), f"{s} is {now or 'in an unknown state'}"
    if k == "robot_at":
        if st.robot_at is None:
            return None, "the robot's place is unknown"
        return st.robot_at == v, f"the robot is at {st.robot_at}"
    return False, c.text()  # "missing" never holds


def apply(effects, st: State, sid: str) -> State:
    held, loc, status = st.held, dict(st.loc), dict(st.status)
    inspected, robot_at, dropped, why = (
        set(st.inspected),
        st.robot_at,
        set(st.dropped),
        dict(st.why),
    )

    def drop(obj: str, how: str):
        loc[obj] = None
        dropped.add(obj)
        why[obj] = how

    for c in effects:
        k, s, v = c.kind, c.subject, c.value
        if k == "holding":
            if held is not None and held != s:
                drop(held, f"dropped when step {sid} took {s}")
            held, loc[s] = s, HELD
            dropped.discard(s)
            why[s] = f"picked up in step {sid}"
        elif k in ("at", "on"):
            loc[s] = v
            dropped.discard(s)
            why[s] = f"put {k} {v} in step {sid}"
            if held == s:
                held = None
        elif k == "hand":  # only "empty" is an effect: let go of whatever is held
            if held is not None:
                drop(held, f"let go of in step {sid}")
            held = None
        elif k == "is":
            if v == "inspected":
                inspected.add(s)
            else:
                status[s] = v
        elif k == "place_is":
            inspected.add(s)
        elif k == "robot_at":
            robot_at = v
    return replace(
        st,
        held=held,
        loc=loc,
        status=status,
        inspected=frozenset(inspected),
        robot_at=robot_at,
        dropped=frozenset(dropped),
        why=why,
    )


def step_conds(
    skill: Skill, args: dict, world: World
) -> tuple[tuple[Cond, ...], tuple[Cond, ...]] | None:
    """The step's grounded (preconditions, effects), or None when its object / place args are
    not world names (the safety gate reports those; execution cannot go past such a step)."""
    for a in skill.args:
        v = args.get(a.name)
        if a.type == "object" and not (isinstance(v, str) and world.object(v)):
            return None
        if a.type == "place" and not (isinstance(v, str) and world.place(v)):
            return None
    return (
        tuple(c.ground(args) for c in skill.preconditions),
        tuple(c.ground(args) for c in skill.effects),
    )


def _unmet(skill: Skill, c: Cond, actual: str, sid: str) -> Finding:
    if c.kind == "hand" and c.value == "empty":
        return Finding(
            sid, "hand_full", f"{skill.name} needs an empty hand, but {actual}; place it first"
        )
    if c.kind == "holding":
        return Finding(
            sid, "not_held", f"{skill.name} needs {c.subject} held, but {actual}; pick it first"
        )
    return Finding(sid, "precondition", f"{skill.name} needs {c.text()}, but {actual}")


def step_call(step, world: World, skills: SkillSet):
    """-> (skill, args, grounded (preconditions, effects)) of one plan step; the conditions are
    None when the step names no known skill, has no args object, or its names are not the
    world's."""
    skill = (
        skills.get(step.get("skill"))
        if isinstance(step, dict) and isinstance(step.get("skill"), str)
        else None
    )
    args = step.get("args") if isinstance(step, dict) else None
    return (
        skill,
        args,
        step_conds(skill, args, world) if skill is not None and isinstance(args, dict) else None,
    )


@dataclass(frozen=True)
class Execution:
    findings: tuple[Finding, ...]
    state: State  # after the last step that could be run
    complete: bool  # every step could be interpreted
    # what happened, in order: (step id, skill name, args, state before, state after) per step run
    calls: tuple = ()


def execute(steps, world: World, skills: SkillSet, state: State | None = None) -> Execution:
    st = initial_state(world) if state is None else state
    out: list[Finding] = []
    calls: list = []
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        sid = (
            step.get("id")
            if isinstance(step, dict) and isinstance(step.get("id"), str)
            else f"#{i + 1}"
        )
        skill, args, conds = step_call(step, world, skills)
        if conds is None:
            return Execution(tuple(out), st, False, tuple(calls))
        for a in skill.args:
            if a.type == "object" and args[a.name] in st.dropped:
                out.append(
                    Finding(
                        sid,
                        "dropped",
                        f"{skill.name} uses {args[a.name]}, but "
                        f"{where(st, args[a.name])}: its place is unknown",
                    )
                )
        for c in conds[0]:
            ok, actual = holds(c, st)
            if ok is False:
                out.append(_unmet(skill, c, actual, sid))
        nxt = apply(conds[1], st, sid)
        calls.append((sid, skill.name, args, st, nxt))
        st = nxt
    return Execution(tuple(out), st, True, tuple(calls))


# what parse_goal answers: (the goal or None, the findings about it)
ParsedGoal = tuple[Goal | None, list[Finding]]


def parse_goal(plan, world: World, skills: SkillSet | None = None) -> ParsedGoal:
    """The plan's `goal` as a Goal over world names (goals.py: conditions, required calls,
    orders, sets expanded against the world); (None, []) when the plan has none. With
    ``skills``, a `do` is held to them (a skill and arguments of this library)."""
    if not isinstance(plan, dict) or "goal" not in plan:
        return None, []
    raw = plan["goal"]
    if isinstance(raw, list) and not raw:
        return None, [
            Finding(None, "goal", "the goal is empty; state what holds when the task is done")
        ]
    try:
        goal = parse_goal_items(raw, world, skills)
    except ThorError as e:
        return None, [Finding(None, "goal", str(e))]
    out = empty_sets(goal)
    for c in goal.all_conds():
        if c.kind == "missing":
            if world.object(c.subject) or world.place(c.subject):
                out.append(
                    Finding(
                        None,
                        "goal",
                        f"{c.subject!r} is in this world; name it in a condition instead",
                    )
                )
            else:  # the one way a plan says "this task cannot be done here"
                out.append(
                    Finding(
                        None, "object", f"the task needs {c.subject!r}, which is not in this world"
                    )
                )
            continue
        for name, kind in c.refs():
            ok = world.object(name) if kind == "object" else world.place(name)
            if not ok:
                out.append(
                    Finding(
                        None, "goal", f"goal {c.text()}: {name!r} is not a {kind} of this world"
                    )
                )
    return goal, out


def goal_limits(
    goal: tuple[Cond, ...], world: World, skills: SkillSet | None = None
) -> list[Finding]:
    """What the goal itself asks beyond the robot: moving or holding an object that is too heavy,
    fixed or out of reach, or reaching a place outside the workspace. No steps can make such a
    goal safe, so the report names the reason rather than only the steps' symptoms."""
    r, out = world.robot, []
    for c in goal.all_conds() if isinstance(goal, Goal) else goal:
        o = (
            world.object(c.subject)
            if c.kind in ("at", "holding", "is", "on") and c.subject
            else None
        )
        if o is not None and (
            c.kind == "holding"
            or (c.kind == "at" and c.value != o.at)
            or (c.kind == "on" and c.value != o.on)
        ):
            if o.mass_kg > r.max_payload_kg:
                out.append(
                    Finding(
                        None,
                        "payload",
                        f"goal {c.text()}: {o.name} weighs {o.mass_kg:g} kg, above "
                        f"the max payload {r.max_payload_kg:g} kg",
                    )
                )
            if not o.graspable:
                out.append(
                    Finding(None, "graspable", f"goal {c.text()}: {o.name} cannot be grasped")
                )
        if o is not None and not r.inside(o.position):
            out.append(
                Finding(
                    None,
                    "workspace",
                    f"goal {c.text()}: {o.name} at {list(o.position)} is outside the workspace",
                )
            )
        p = world.place(c.value) if c.kind in ("at", "robot_at") and c.value else None
        if p is not None and not r.inside(p.position):
            out.append(
                Finding(
                    None,
                    "workspace",
                    f"goal {c.text()}: place {p.name} at {list(p.position)} "
                    "is outside the workspace",
                )
            )
        u = world.object(c.value) if c.kind == "on" and c.value else None
        if u is not None and not r.inside(u.position):  # what it goes on must be in reach too
            out.append(
                Finding(
                    None,
                    "workspace",
                    f"goal {c.text()}: {u.name} at {list(u.position)} is outside the workspace",
                )
            )
    return out + (
        act_limits(goal, world, skills) if isinstance(goal, Goal) and skills is not None else []
    )


def act_limits(goal: Goal, world: World, skills: SkillSet) -> list[Finding]:
    """A required call no step may make: its fixed arguments break a bound, the payload or the
    workspace (the gate's own argument checks), named by the goal, before any step."""
    out = []
    for a in goal.all_acts():
        skill = skills.get(a.skill)
        specs = {x.name: x for x in skill.args} if skill is not None else {}
        for name, v in a.args:
            for f in _arg_findings(None, name, specs[name], v, world, name in skill.carries):
                out.append(Finding(None, f.check, f"goal {a.text()}: {f.message}"))
    return out


def goal_findings(goal: tuple[Cond, ...], st: State, last_step: str | None) -> list[Finding]:
    out = []
    for c in goal:
        if c.kind == "missing":
            continue
        ok, actual = holds(c, st)
        if ok is not True:
            after = f" after step {last_step}" if last_step else ""
            out.append(Finding(None, "goal", f"goal {c.text()} is not reached{after}: {actual}"))
    return out


def reaches(goal: tuple[Cond, ...], st: State) -> bool:
    """Every goal condition is known to hold, and nothing is left in the hand the goal does not ask
    for."""
    if any(holds(c, st)[0] is not True for c in goal):
        return False
    return st.held is None or any(c.kind == "holding" and c.subject == st.held for c in goal)


def run_progress(goal: Goal, calls, start_state: State):
    """The goal's process parts (goals.Progress) after these executed calls."""
    p = start(goal, start_state, holds)
    for _, skill, args, before, after in calls:
        p = advance(goal, p, skill, args, before, after, holds)
    return p


def achieves(goal: Goal, ex: "Execution", world: World) -> bool:
    """The run reached every end condition and did every required call in every order."""
    return reaches(goal, ex.state) and done(
        goal, run_progress(goal, ex.calls, initial_state(world))
    )


def process_done(goal: Goal, plan, world: World, skills: SkillSet) -> bool:
    """The plan's steps, run, make every required call in every order of ``goal``."""
    ex = execute(plan.get("steps") if isinstance(plan, dict) else None, world, skills)
    return done(goal, run_progress(goal, ex.calls, initial_state(world)))


def symbolic_findings(
    plan: dict, world: World, skills: SkillSet, parsed: ParsedGoal | None = None
) -> list[Finding]:
    """Executability by step, then the goal. Nothing is said past a step the gate already
    refused by name (unknown skill / object / place): the state after it would be a guess.
    ``parsed``: ``parse_goal(plan, world, skills)`` when the caller already has it."""
    goal, problems = parse_goal(plan, world, skills) if parsed is None else parsed
    out = list(problems)  # the caller's parse is shared by its other checks: not extended in place
    if goal is not None and not out:
        out += goal_limits(goal, world, skills)
    steps = plan.get("steps") if isinstance(plan, dict) else None
    ex = execute(steps, world, skills)
    out = list(ex.findings) + out
    if not ex.complete:
        return out
    last = steps[-1].get("id") if steps and isinstance(steps[-1], dict) else None
    asked = {c.subject for c in goal or () if c.kind == "holding"}
    if ex.state.held is not None and ex.state.held not in asked:
        out.append(
            Finding(
                last,
                "left_held",
                f"{ex.state.held} is still held at the end of the plan; put it down at a place",
            )
        )
    if goal is not None and not any(f.check == "goal" for f in out):
        out += goal_findings(goal, ex.state, last)
        out += progress_findings(goal, run_progress(goal, ex.calls, initial_state(world)))
    return out


def states_by_object(world: World, skills: SkillSet) -> dict[str, tuple[str, ...]]:
    """object -> the `is` states some skill can give it: a skill's effect on ``$arg`` reaches
    only objects of a type that argument accepts (vocabulary, like an argument's types)."""
    out: dict[str, set[str]] = {o.name: set() for o in world.objects}
    for s in skills.skills:
        specs = {a.name: a for a in s.args}
        for c in s.effects:
            if c.kind != "is" or not c.subject:
                continue
            a = specs.get(c.subject[1:]) if c.subject.startswith("$") else None
            for o in world.objects:
                if (
                    a is not None
                    and a.type == "object"
                    and (not a.object_types or o.type in a.object_types)
                ) or c.subject == o.name:
                    out[o.name].add(c.value)
    return {k: tuple(sorted(v)) for k, v in out.items()}
