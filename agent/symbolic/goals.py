"""Goals that say more than an end state: required actions, their order, and sets of things.

A goal is a list. Besides the conditions of conditions.py (what holds at the end), an entry may be

    {"do": SKILL, "args": {...}}               that call must happen; ``args`` holds only what the
                                               task fixes (``push gauze_box left 0.1``, ``wait 5``);
                                               ``"times": N`` asks for it N times
    {"before": [A, B, ...]}                    A happens, then B, ...: each item is a `do` or a
                                               condition, and a condition "happens" when it
                                               becomes true (or holds at the start, for the first)
    {"every": SELECTOR, "at": P} / "is": S    every object the selector picks from the world's
                                               initial state is at P / in state S at the end

A `before` is one sequence: "inspect, wait, inspect again" is ``{"before": [inspect, wait,
inspect]}``, and one call can only stand for one item of it. What must hold at the end is said by
plain conditions; a condition inside a `before` is only an event. A selector (``SELECTORS``) is
a conjunction: ``{"type": "tool", "carriable": true}``. It is expanded into plain conditions
against the world before anything is checked or solved, and one that picks nothing is refused:
guessing what "everything on the counter" means in a world where nothing is there would plan
for some other task.

Why events and not a temporal logic: a task says "first", "then", "again", and a sequence of
calls and state changes says exactly that, can be checked by one pass over the steps, and keeps
the solver's search state small (one counter per `do`, one position per `before`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.files.loader import SkillSet, World
from agent.symbolic.conditions import GOAL_KINDS, IS_STATES, Cond, parse_cond
from agent.symbolic.findings import Finding
from thor_runtime.errors import ThorError

MAX_TIMES = 5  # "three times" is a task; "forty times" is a loop for the executive
MAX_ORDER = 4


@dataclass(frozen=True)
class Act:
    """A required call: ``skill`` with at least these ``args`` (name -> JSON value)."""

    skill: str
    args: tuple = ()  # ((name, value), ...) as written (the task's words' order)
    times: int = 1
    kind: str = "do"  # so code that looks at ``.kind`` of goal items can tell

    @property
    def arg_dict(self) -> dict:
        return dict(self.args)

    def matches(self, skill: str, args) -> bool:
        if skill != self.skill or not isinstance(args, dict):
            return False
        return all(k in args and _same(args[k], v) for k, v in self.args)

    def objects(self, world: World) -> list[str]:
        return [v for _, v in self.args if isinstance(v, str) and world.object(v)]

    def text(self) -> str:
        vals = " ".join(
            f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)
            for _, v in self.args
        )
        return f"{self.skill} {vals}".strip() + (f" x{self.times}" if self.times > 1 else "")

    def to_dict(self) -> dict:
        out = {"do": self.skill, "args": self.arg_dict}
        return {**out, "times": self.times} if self.times > 1 else out


def _same(a, b) -> bool:
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    if num(a) and num(b):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


# ---- selectors: key -> (check of the value, does object o qualify, words for a message) ------
def _carriable(world: World, o) -> bool:
    r = world.robot
    return o.graspable and o.mass_kg <= r.max_payload_kg and r.inside(o.position)


SELECTORS = {
    "type": (
        lambda w, v: isinstance(v, str) and bool(v),
        lambda w, o, v: o.type == v,
        lambda v: f"is a {v}",
    ),
    "at": (
        lambda w, v: isinstance(v, str) and w.place(v) is not None,
        lambda w, o, v: o.at == v,
        lambda v: f"is at {v}",
    ),
    "carriable": (
        lambda w, v: v is True,
        lambda w, o, v: _carriable(w, o),
        lambda v: "can be carried",
    ),
}
# template key -> the condition kind each member gets
TEMPLATES = {"at": "at", "is": "is"}


def select(sel, world: World, where: str = "every") -> tuple[list[str], str]:
    """-> (names of the objects the selector picks, in world order; its words)."""
    if not isinstance(sel, dict) or not sel or not set(sel) <= set(SELECTORS):
        raise ThorError(
            f"{where}: a selector is an object with some of {', '.join(SELECTORS)}, got {sel!r}"
        )
    for k, v in sel.items():
        if not SELECTORS[k][0](world, v):
            raise ThorError(
                f"{where}: {k} {v!r} is not a selector value here"
                + (
                    " (a place of this world)"
                    if k == "at"
                    else " (true)"
                    if k == "carriable"
                    else ""
                )
            )
    words = " and ".join(SELECTORS[k][2](v) for k, v in sel.items())
    return [
        o.name for o in world.objects if all(SELECTORS[k][1](world, o, v) for k, v in sel.items())
    ], words


class Goal(tuple):
    """The end-state conditions (a tuple of Cond, as goals always were), with the process parts:
    ``acts`` (required calls outside any order), ``orders`` (sequences of Act / Cond) and
    ``sets`` ((words of an `every`, member names) per quantifier, for the report)."""

    def __new__(cls, conds=(), acts=(), orders=(), sets=(), raw=None):
        self = super().__new__(cls, conds)
        self.acts, self.orders, self.sets = tuple(acts), tuple(orders), tuple(sets)
        self.raw = list(raw) if raw is not None else [c.to_dict() for c in conds]  # as written
        return self

    def __bool__(self) -> bool:  # a goal of calls alone still asks for something
        return bool(len(self) or self.acts or self.orders or self.sets)

    @property
    def process(self) -> bool:
        return bool(self.acts or self.orders)

    def all_acts(self) -> list[Act]:
        return list(self.acts) + [i for o in self.orders for i in o if isinstance(i, Act)]

    def all_conds(self) -> list[Cond]:
        return list(self) + [i for o in self.orders for i in o if isinstance(i, Cond)]

    def objects(self, world: World) -> set[str]:
        out = {n for c in self.all_conds() for n, k in c.refs() if k == "object"}
        return out | {n for a in self.all_acts() for n in a.objects(world)}

    def expansion(self) -> list[str]:
        return [f"every object that {words}: {', '.join(names)}" for words, names in self.sets]


def parse_act(d, skills: SkillSet | None, where: str) -> Act:
    if (
        not isinstance(d, dict)
        or not isinstance(d.get("do"), str)
        or not set(d) <= {"do", "args", "times"}
    ):
        raise ThorError(f'{where}: an action is {{"do": SKILL, "args": {{...}}}}, got {d!r}')
    args = d.get("args", {})
    if not isinstance(args, dict):
        raise ThorError(f"{where}: args must be an object")
    times = d.get("times", 1)
    if not isinstance(times, int) or isinstance(times, bool) or not 1 <= times <= MAX_TIMES:
        raise ThorError(f"{where}: times must be a whole number 1..{MAX_TIMES}, got {times!r}")
    skill = skills.get(d["do"]) if skills is not None else None
    if skills is not None and skill is None:
        raise ThorError(
            f"{where}: no skill {d['do']!r} here "
            f"(known: {', '.join(s.name for s in skills.skills)})"
        )
    if skill is not None:
        extra = set(args) - {a.name for a in skill.args}
        if extra:
            raise ThorError(f"{where}: {skill.name} has no argument {sorted(extra)[0]!r}")
    return Act(d["do"], tuple(args.items()), times)


def _item(d, skills, where):
    """One item of a `before`: a call or an end-state condition (no `missing`: it is no event)."""
    if isinstance(d, dict) and "do" in d:
        return parse_act(d, skills, where)
    return parse_cond(d, tuple(k for k in GOAL_KINDS if k != "missing"), where)


def _every(d: dict, world: World, where: str) -> tuple[list[Cond], tuple[str, tuple]]:
    keys = set(d) - {"every"}
    if len(keys) != 1 or next(iter(keys)) not in TEMPLATES:
        raise ThorError(
            f"{where}: `every` takes one of {', '.join(TEMPLATES)} beside it, got {sorted(keys)}"
        )
    key = keys.pop()
    names, words = select(d["every"], world, where)
    val = d[key]
    if key == "is" and val not in IS_STATES:
        raise ThorError(f"{where}: `is` must be one of {', '.join(IS_STATES)}, got {val!r}")
    return [Cond(TEMPLATES[key], n, val) for n in names], (words, tuple(names))


def parse_goal_items(
    raw, world: World, skills: SkillSet | None = None, where: str = "goal"
) -> Goal:
    """-> Goal; raises ThorError on a malformed entry. Plain conditions keep their order; an
    `every` adds its members' conditions where it stands (an empty set adds none: see
    ``empty_sets``)."""
    if not isinstance(raw, list):
        raise ThorError(f"{where}: expected a list of conditions")
    conds, acts, orders, sets = [], [], [], []
    for i, d in enumerate(raw):
        at = f"{where}[{i}]"
        if isinstance(d, dict) and "do" in d:
            acts.append(parse_act(d, skills, at))
        elif isinstance(d, dict) and "before" in d:
            items = d["before"]
            if (
                set(d) != {"before"}
                or not isinstance(items, list)
                or not 2 <= len(items) <= MAX_ORDER
            ):
                raise ThorError(
                    f"{at}: `before` is a list of 2..{MAX_ORDER} actions or conditions, in order"
                )
            orders.append(tuple(_item(x, skills, f"{at}.before[{j}]") for j, x in enumerate(items)))
        elif isinstance(d, dict) and "every" in d:
            more, s = _every(d, world, at)
            conds += [c for c in more if c not in conds]
            sets.append(s)
        else:
            c = parse_cond(d, GOAL_KINDS, at)
            if c not in conds:
                conds.append(c)
    return Goal(conds, acts, orders, sets, raw)


def empty_sets(goal: Goal) -> list[Finding]:
    """A quantifier that picks nothing: the task is about things this world does not have."""
    return [
        Finding(
            None,
            "object",
            f"nothing in this world {words}"
            + (
                ""
                if "is at" not in words
                else " (the world file says where each object rests with `at`)"
            ),
        )
        for words, names in goal.sets
        if not names
    ]


# ---- progress over a run: what the process parts of a goal have seen so far ------------------
@dataclass(frozen=True)
class Progress:
    counts: tuple = ()  # per goal.acts: calls seen, capped at its times
    pos: tuple = ()  # per goal.orders: items matched so far (earliest matching)


def _cond_event(c: Cond, before, after, holds) -> bool:
    return holds(c, after)[0] is True and (before is None or holds(c, before)[0] is not True)


def start(goal: Goal, st, holds) -> Progress:
    pos = tuple(int(isinstance(o[0], Cond) and holds(o[0], st)[0] is True) for o in goal.orders)
    return Progress(tuple(0 for _ in goal.acts), pos)


def advance(goal: Goal, p: Progress, skill: str, args, before, after, holds) -> Progress:
    """After one call (``before`` -> ``after``): its own event first, then what became true."""
    counts = tuple(min(n + a.matches(skill, args), a.times) for n, a in zip(p.counts, goal.acts))
    pos = []
    for k, o in zip(p.pos, goal.orders):
        if k < len(o) and isinstance(o[k], Act) and o[k].matches(skill, args):
            k += 1
        if k < len(o) and isinstance(o[k], Cond) and _cond_event(o[k], before, after, holds):
            k += 1
        pos.append(k)
    return Progress(counts, tuple(pos))


def done(goal: Goal, p: Progress) -> bool:
    return all(n >= a.times for n, a in zip(p.counts, goal.acts)) and all(
        k >= len(o) for k, o in zip(p.pos, goal.orders)
    )


def progress_findings(goal: Goal, p: Progress) -> list[Finding]:
    """An unmet `do` (check ``action``) or `before` (check ``order``), named."""
    out = []
    for n, a in zip(p.counts, goal.acts):
        if n < a.times:
            seen = f"the steps do it {n} time{'s' if n != 1 else ''}" if n else "no step does it"
            out.append(Finding(None, "action", f"the goal asks for {a.text()}; {seen}"))
    for k, o in zip(p.pos, goal.orders):
        if k < len(o):
            seq = ", then ".join(i.text() for i in o)
            got = (
                (
                    f"the steps reach {', then '.join(i.text() for i in o[:k])} but not "
                    f"{o[k].text()} after it"
                )
                if k
                else f"the steps never reach {o[0].text()}"
            )
            out.append(Finding(None, "order", f"the goal asks for {seq} in that order; {got}"))
    return out
