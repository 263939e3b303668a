"""A small symbolic planner over the skills' declared effects (the LLM+P split).

The model grounds the task into goal conditions over the world's names; when its own steps do
not reach that goal, breadth-first search over ground skill calls finds the shortest sequence
that does, and the result goes through the same schema, safety gate and symbolic execution as
any model plan. Only calls the safety gate would pass are ever searched (a heavy, fixed or
out-of-reach object is never picked), so a goal that needs one has no solution and the
model's refusal-worthy plan is reported as it is.

Why the search stays small: preconditions and effects only name the step's own arguments, so
the only objects worth touching are the goal's (plus names written literally in a skills file).

A goal's required calls (`do`, goals.py) are searched as calls of their own, with the task's
fixed arguments and safe values for the rest, and a search state carries how far each `do` and
`before` has got, so the shortest plan found does every call, in every order, with every
precondition met (a `wait` that changes nothing is still inserted where the order puts it).

A goal that stacks objects on objects (`on`) is solved move by move instead (stacking.py): the
breadth-first search over every block of a tower grows too fast, and the classic tower strategy
is complete for it. Each move is still found by this search, so the skills' own preconditions
and effects decide which calls make it.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from itertools import product

from agent.files.loader import ArgSpec, Skill, SkillSet, World
from agent.schema.arg_schemas import MAX_TIMEOUT_S
from agent.symbolic import stacking
from agent.symbolic.conditions import Cond
from agent.symbolic.executor import (
    ParsedGoal,
    State,
    achieves,
    apply,
    execute,
    goal_limits,
    holds,
    initial_state,
    parse_goal,
    reaches,
    step_conds,
)
from agent.symbolic.goals import Act, Goal, advance, done, start
from agent.symbolic.limits import _arg_findings

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
    if (
        template is not None
        and name in template
        and not _arg_findings("x", name, a, template[name], world)
    ):
        return template[name]
    if a.type == "enum":
        v = a.values[0]
    elif a.type in ("number", "integer"):
        lo, hi = a.min, a.max
        if a.unit == "kg":
            hi = world.robot.max_payload_kg if hi is None else min(hi, world.robot.max_payload_kg)
        v = (
            (lo + hi) / 2
            if lo is not None and hi is not None
            else lo
            if lo is not None
            else hi
            if hi is not None
            else 0
        )
        v = int(round(v)) if a.type == "integer" else round(v, 3)
    elif a.type == "string":
        v = "done"[: a.max_length]
    else:
        return None  # a position is the model's to choose
    return None if _arg_findings("x", name, a, v, world) else v


def ground_actions(
    world: World,
    skills: SkillSet,
    objects: set[str],
    templates: dict,
    required: tuple[Act, ...] = (),
) -> list[Action]:
    """Calls of skills with effects over ``objects``, and the ``required`` calls of the goal
    (their fixed arguments as given, when safe; a fixed argument that is not gives no call)."""
    out, seen = [], set()
    todo = [(s, {}) for s in skills.skills if s.effects]  # no effect: nothing a condition asks
    todo += [(skills.get(a.skill), a.arg_dict) for a in required if skills.get(a.skill) is not None]
    for skill, given in todo:
        tmpl = templates.get(skill.name)
        fixed, domains = {}, {}
        for a in skill.args:
            if a.name in given:
                v = given[a.name]
                ok = not _arg_findings("x", a.name, a, v, world, a.name in skill.carries)
                fixed[a.name] = v if ok else None
            elif a.type == "object":
                domains[a.name] = [
                    o
                    for o in sorted(objects)
                    if world.object(o)
                    and not _arg_findings("x", a.name, a, o, world, a.name in skill.carries)
                ]
            elif a.type == "place":
                domains[a.name] = [
                    p.name for p in world.places if not _arg_findings("x", a.name, a, p.name, world)
                ]
            else:
                fixed[a.name] = _default(a, world, tmpl.get("args") if tmpl else None, a.name)
        if any(v is None for v in fixed.values()):
            continue
        names = list(domains)
        for combo in product(*(domains[n] for n in names)):
            args = {
                a.name: fixed[a.name] if a.name in fixed else combo[names.index(a.name)]
                for a in skill.args
            }
            conds = step_conds(skill, args, world)
            key = (skill.name, repr(sorted(args.items())))
            if conds is not None and key not in seen:
                seen.add(key)
                out.append(Action(skill, args, *conds))
    return out


def relevant(goal: tuple[Cond, ...], actions: list[Action]) -> list[Action]:
    """The actions that can change a kind of condition the goal or some precondition asks
    about. Any plan with one of the others still works without it and is shorter, so no
    shortest plan uses them; dropping them keeps the state space from multiplying by what
    they change (a scan of each of twelve places: 2^12 states)."""
    conds = goal.all_conds() if isinstance(goal, Goal) else goal
    need = {c.kind for c in conds} | {c.kind for a in actions for c in a.pre}
    acts = goal.all_acts() if isinstance(goal, Goal) else []
    return [
        a
        for a in actions
        if any(c.kind in need for c in a.eff) or any(r.matches(a.skill.name, a.args) for r in acts)
    ]


def search(
    goal: tuple[Cond, ...],
    world: World,
    actions: list[Action],
    max_depth: int,
    state: State | None = None,
) -> list[Action] | None:
    """Shortest action sequence from ``state`` (the world's initial state) that reaches the goal."""
    actions = relevant(goal, actions)
    first = initial_state(world) if state is None else state
    g = goal if isinstance(goal, Goal) else Goal(goal)
    p0 = start(g, first, holds)
    frontier, seen = deque([(first, p0, [])]), {(first.key(), p0)}
    while frontier:
        st, prog, path = frontier.popleft()
        if reaches(goal, st) and done(g, prog):
            return path
        if len(path) >= max_depth:
            continue
        for act in actions:
            if any(holds(c, st)[0] is False for c in act.pre):
                continue
            if any(a.type == "object" and act.args[a.name] in st.dropped for a in act.skill.args):
                continue
            nxt = apply(act.eff, st, "")
            np = advance(g, prog, act.skill.name, act.args, st, nxt, holds) if g.process else prog
            k = (nxt.key(), np)
            if k not in seen:
                if len(seen) >= MAX_STATES:
                    return None
                seen.add(k)
                frontier.append((nxt, np, path + [act]))
    return None


def _timeout(skill: Skill, tmpl: dict | None) -> float:
    limit = min(skill.timeout_s or MAX_TIMEOUT_S, MAX_TIMEOUT_S)
    t = tmpl.get("timeout_s") if tmpl else None
    if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t <= limit:
        return t
    return limit


def complete(
    plan,
    world: World,
    skills: SkillSet,
    max_steps: int | None = None,
    parsed: ParsedGoal | None = None,
) -> dict | None:
    """-> a plan with the model's goal and solver-made steps, or None (no goal, a goal naming
    something missing, already reached, or unreachable with safe calls within ``max_steps``:
    the library's own cap, else 10). ``parsed``: ``parse_goal(plan, world, skills)`` when the
    caller already has it."""
    max_steps = max_steps if max_steps is not None else skills.max_steps or 10
    goal, problems = parse_goal(plan, world, skills) if parsed is None else parsed
    if goal is None or problems:
        return None
    steps = plan.get("steps") if isinstance(plan.get("steps"), list) else []
    templates = {}
    for s in steps:  # the model's own values (grasp, force, speed, timeout) win where safe
        if (
            isinstance(s, dict)
            and isinstance(s.get("skill"), str)
            and isinstance(s.get("args"), dict)
        ):
            templates.setdefault(s["skill"], s)
    objects = goal.objects(world)
    objects |= {
        n
        for sk in skills.skills
        for c in sk.preconditions + sk.effects
        for n, kind in c.refs()
        if kind == "object" and not n.startswith("$")
    }
    if stacking.applies(goal):
        objects |= stacking.towers_of(objects, world)
    actions = ground_actions(world, skills, objects, templates, tuple(goal.all_acts()))
    path = (
        stacking.plan(goal, world, actions, max_steps, search)
        if stacking.applies(goal)
        else search(goal, world, actions, max_steps)
    )
    if not path:
        return None
    out_steps = []
    for i, act in enumerate(path):
        tmpl = templates.get(act.skill.name)
        out_steps.append(
            {
                "id": f"s{i + 1}",
                "skill": act.skill.name,
                "args": act.args,
                "preconditions": [c.text()[:NOTE_CHARS] for c in act.pre][:3],
                "expected_effects": [c.text()[:NOTE_CHARS] for c in act.eff][:3],
                "timeout_s": _timeout(act.skill, tmpl),
                "on_failure": "abort",
            }
        )
    head = {k: plan[k] for k in ("plan_id", "task") if k in plan}
    return {**head, "goal": plan["goal"], "steps": out_steps}


def stated_goal(text: str) -> dict | None:
    """The head of a plan the token budget cut off: ``{"plan_id", "task", "goal", "steps": []}``.
    The grammar writes the goal before the steps, so a plan cut inside its steps (a small model
    repeating steps, say) has still stated its goal, and the solver can complete from it. None
    when the text is not a plan whose goal was written out in full."""
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


def written_steps(text: str) -> list | None:
    """The whole step objects a plan's text holds before the step it is opening (the text ends
    inside that step's first key). None when there are none or they do not read as JSON."""
    at = text.rfind('"steps"')
    opened = text.rfind("{")
    open_list = text.find("[", at) if at >= 0 else -1
    if open_list < 0 or opened < open_list:
        return None
    try:
        steps = json.loads("[" + text[open_list + 1 : opened].rstrip().rstrip(",") + "]")
    except json.JSONDecodeError:
        return None
    return steps if steps and all(isinstance(st, dict) for st in steps) else None


def _call(step: dict) -> tuple[str, str]:
    """What a step does: its skill and arguments (not its id or notes)."""
    return repr(step.get("skill")), json.dumps(step.get("args"), sort_keys=True)


def goal_reasons(
    plan: dict, world: World, skills: SkillSet | None = None, parsed: ParsedGoal | None = None
) -> list:
    """Why a stated goal cannot be done here (a name this world lacks, a heavy, fixed or
    out-of-reach object, `missing`, a set that picks nothing, a required call out of bounds):
    the findings a refusal should name. ``parsed``: the plan's parse_goal, when the caller has
    it."""
    goal, problems = parse_goal(plan, world, skills) if parsed is None else parsed
    return problems if goal is None or problems else goal_limits(goal, world, skills)


class GoalStop:
    """stop(text) for Grammar.constraint, asked when the plan's goal is written: True when that
    goal is refused from the goal alone (goal_reasons), so no steps are decoded for it.

    For a goal the solver reaches, it also sets ``step_cap``: the most steps the model may write
    before its plan is cut and the solver's steps are taken (``complete``, as for a plan the
    token budget cut). A small model sometimes repeats one step to the budget; twice the
    solver's count (at least that count plus two) leaves room for every plan that does more
    than the shortest one, and stops a runaway within a few steps instead of at the budget.

    And as each further step opens, ``step_opened`` ends the plan before the cap where more
    steps can only be thrown away:
    - the steps written already do the goal: run from the world's state they meet every
      precondition and end in it, with every required call made in order (symbolic.achieves,
      the gate's own test). Those steps are the plan (``done_steps``).
    - the last two are the same call (skill and arguments): the model is looping. Asked to
      "move the apple to the table", the planner model wrote one `move_arm` call four times
      over until the cap cut it and the solver's pick and place were taken: 271 tokens, where
      this ends it after 2 steps. The solver's steps are taken as at the cap.
    Neither applies to a goal that asks for calls (`do`, `before`): asked to "camera-scan the
    tool container three times", the planner model wrote a goal of one scan and then the three
    scans the task asked for, which the goal being done after the first would have cut.

    The check parses the goal the decoding wrote; the attempt's plan carries that same goal, so
    the planner takes this parse (``parsed_for``) rather than parsing it a second time."""

    def __init__(self, world: World, skills: SkillSet | None = None, max_steps: int | None = None):
        self.world, self.skills, self.max_steps = world, skills, max_steps
        self.goal, self.parsed = None, None  # the last goal read, as written and as parsed
        self.step_cap: int | None = None
        self.ended = False  # True: this check ended the plan at its goal
        self.done_steps: list | None = None  # the written steps that did the goal (step_opened)
        # Each check is a pure function of the text, asked with keep=False for drafts (the
        # grammar's masks must foresee an end exactly where committing the same tokens would
        # make it) and again with keep=True as they commit: the answers are kept per text.
        self._reads: dict[str, tuple] = {}

    def __call__(self, text: str, keep: bool = True) -> bool:
        """True when the goal ``text`` states is refused; with ``keep`` the check's state
        (``goal``, ``parsed``, ``step_cap``, ``ended``) becomes this goal's."""
        goal, parsed, cap, refused = self._goal_in(text)
        if keep:
            self.goal, self.parsed, self.step_cap, self.ended, self.done_steps = (
                goal,
                parsed,
                cap,
                refused,
                None,
            )
        return refused

    def step_cap_for(self, text: str) -> int | None:
        """The most steps the model may write after the goal ``text`` states (None: no cap)."""
        return self._goal_in(text)[2]

    def _goal_in(self, text: str) -> tuple:
        """(goal, parsed, step_cap, refused) of the goal ``text`` states, read once per head."""
        start = max(text.rfind('{"plan_id"'), 0)
        end = text.find('"steps"', start)
        head = text[start:end] if end >= 0 else text[start:]
        return self._read(("goal", head), lambda: self._read_goal(text[start:]))

    def _read_goal(self, text: str) -> tuple:
        head = stated_goal(text)
        if head is None:
            return None, None, None, False
        parsed = parse_goal(head, self.world, self.skills)
        if goal_reasons(head, self.world, self.skills, parsed):
            return head["goal"], parsed, None, True
        cap = None
        if self.skills is not None:
            solved = complete(head, self.world, self.skills, self.max_steps, parsed)
            if solved is not None:
                n = len(solved["steps"])
                cap = max(2 * n, n + 2)
        return head["goal"], parsed, cap, False

    def step_opened(self, text: str, keep: bool = True) -> bool:
        """Whether the plan ends before the step ``text`` opens: the steps before it already do
        the goal the text states (then kept as ``done_steps`` with ``keep``), or repeat their
        last call."""
        ends, done = self._read(("step", text), lambda: self._read_steps(text))
        if keep and done is not None:
            self.done_steps = done
        return ends

    def _read_steps(self, text: str) -> tuple[bool, list | None]:
        parsed = self._goal_in(text)[1]
        goal = parsed[0] if parsed is not None else None
        if goal is None or goal.all_acts() or self.skills is None:
            return False, None
        steps = written_steps(text)
        if steps is None:
            return False, None
        ex = execute(steps, self.world, self.skills)
        if not ex.findings and ex.complete and achieves(goal, ex, self.world):
            return True, steps
        return len(steps) > 1 and _call(steps[-1]) == _call(steps[-2]), None

    def _read(self, key: tuple, compute):
        if key not in self._reads:
            if len(self._reads) >= 256:  # drafts that never commit: keep it bounded
                self._reads.clear()
            self._reads[key] = compute()
        return self._reads[key]

    def done_plan(self, text: str) -> dict | None:
        """The plan a text that ``step_opened`` ended at its done goal stands for: its head and
        the steps that did the goal; None for any other text (another goal, another ending)."""
        head = stated_goal(text) if self.done_steps is not None else None
        if head is None or head["goal"] != self.goal:
            return None
        return {**head, "steps": self.done_steps}

    def parsed_for(self, plan) -> ParsedGoal | None:
        """The parse of ``plan``'s goal when it is the goal this check read, else None."""
        if self.parsed is None or not isinstance(plan, dict) or plan.get("goal", None) != self.goal:
            return None
        return self.parsed


def goal_stop(
    world: World, skills: SkillSet | None = None, max_steps: int | None = None
) -> GoalStop:
    return GoalStop(world, skills, max_steps)
