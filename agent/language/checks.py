"""Checks that hold a plan's goal to its task, in any language: the things it names and the
amounts it says (mentions.py), never its grammar.

Symbolic execution proves the steps reach the plan's *own* goal; these hold the goal to the task:

- ``object``: the goal is about an object the task names in no way (not by its name, an alias
  or its type): a small model asked for a thing the world lacks swaps in one it has. The repair
  points at ``missing``. A `missing` thing must itself be said in the task.
- ``goal``: the task names an object by its name or an alias and neither the goal nor the
  plan's steps say anything of it (a two-object task stated by half); or the task says an
  amount with a unit a lexicon knows ("5 cm", "30 seconds", "twice") that no call of the goal
  takes: "shove it 5 cm" with no push of 0.05 m, "wait 30 s" with no wait, "twice" with no
  ``times`` and no second call of the same skill.

An amount inside a thing's name ("bay 2") is no amount. A number said with no unit a lexicon
knows ("3 jars", "5 Zentimeter" with no German lexicon) may be a count of things or part of a
name: it asks for nothing here, and only ranks the goals that take it (``takes_amounts``).
"""

from __future__ import annotations

import math

from agent.files.loader import SkillSet, World
from agent.files.names import words as words_of
from agent.language.mentions import Amount, TaskWords, phrases, run_in
from agent.symbolic.executor import ParsedGoal, parse_goal
from agent.symbolic.findings import Finding

_OBJECT_KINDS = ("at", "is", "holding", "on")
# the scales a number said without a known unit may carry into an argument (m from cm or mm, s
# from minutes): a language-neutral reading of "5" in "5 cm" when no lexicon knows "cm"
_SCALES = (1.0, 0.01, 0.001, 60.0)
_UNIT_OF_ARG = {"m": "m", "s": "s", "deg": "deg"}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _values(a: Amount) -> list[float]:
    return [a.value] if a.unit is not None else [a.value * s for s in _SCALES]


def _takers(a: Amount, skills: SkillSet) -> bool:
    """Whether some skill argument (or a call's ``times``) could take the amount."""
    if a.unit in (None, "count") and float(a.value).is_integer() and 2 <= a.value <= 5:
        return True
    for s in skills.skills:
        for arg in s.args:
            if arg.type not in ("number", "integer"):
                continue
            if a.unit not in (None, "count") and _UNIT_OF_ARG.get(arg.unit or "") not in (
                None,
                a.unit,
            ):
                continue
            lo = arg.min if arg.min is not None else -math.inf
            hi = arg.max if arg.max is not None else math.inf
            if any(lo <= v <= hi for v in _values(a)):
                return True
    return False


def _taken(a: Amount, goal) -> bool:
    acts = goal.all_acts()
    if a.unit in (None, "count"):
        calls: dict[str, int] = {}
        for act in acts:
            calls[act.skill] = calls.get(act.skill, 0) + act.times
        if any(_close(n, a.value) for n in calls.values() if n > 1):
            return True  # "twice": times 2, or the same call made twice
    for act in acts:
        for _, v in act.args:
            if (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and any(_close(float(v), x) for x in _values(a))
            ):
                return True
    return False


def task_findings(
    words: TaskWords,
    plan,
    world: World,
    skills: SkillSet | None = None,
    parsed: ParsedGoal | None = None,
) -> list[Finding]:
    """The findings above for a plan whose goal parses; [] when it has none to check."""
    raw = plan.get("goal") if isinstance(plan, dict) else None
    missing = missing_names(raw)
    if missing:  # (the executor reports the thing as not here: the refusal's own finding)
        return [
            Finding(
                None,
                "object",
                f"the goal says {m!r} is missing, but the task does not say "
                f"{m!r}; name the thing the task asks for",
            )
            for m in missing
            if not words.says(m)
        ]
    goal, problems = parse_goal(plan, world, skills) if parsed is None else parsed
    if goal is None or problems:
        return []
    out: list[Finding] = []
    members = {n for _, names in goal.sets for n in names}
    about = {c.subject for c in goal if c.kind in _OBJECT_KINDS} | goal.objects(world) | members
    for name in sorted(goal.objects(world) - members):
        if not words.mentions(name):
            out.append(
                Finding(
                    None,
                    "object",
                    f"the goal is about {name}, which the task does not "
                    "name; if the task asks for a thing this world does "
                    'not have, the goal is [{"missing": "<that thing>"}]',
                )
            )
    about |= {v for step in _steps(plan) for v in _values_of(step.get("args"))}
    for name, _ in sorted(words.named.items(), key=lambda kv: kv[1]):
        if world.object(name) is not None and name not in about:
            out.append(
                Finding(
                    None,
                    "goal",
                    f"the task names {name}, but the goal says nothing "
                    "about it; state one condition for each object the "
                    "task names",
                )
            )
    if skills is not None:
        for a in words.amounts:
            if a.unit is None or a.unit == "count" and a.value == 1:
                continue
            if _takers(a, skills) and not _taken(a, goal):
                said = f"{a.value:g}" + (f" {a.unit}" if a.unit not in (None, "count") else "")
                out.append(
                    Finding(
                        None,
                        "goal",
                        f"the task says {said}, and no call in the goal "
                        'takes it: {"do": SKILL, "args": {...}} with it, '
                        'or "times"',
                    )
                )
    return out


def _steps(plan) -> list[dict]:
    steps = plan.get("steps") if isinstance(plan, dict) else None
    return [x for x in steps if isinstance(x, dict)] if isinstance(steps, list) else []


def _values_of(args) -> list[str]:
    return [v for v in args.values() if isinstance(v, str)] if isinstance(args, dict) else []


def takes_amounts(words: TaskWords, goal, world: World, skills: SkillSet | None) -> int:
    """How many of the numbers the task says (with a unit or not, but not 1) the goal's calls take:
    a hint for ranking goals in any language, never a finding."""
    if skills is None or not isinstance(goal, list):
        return 0
    parsed, problems = parse_goal({"goal": goal}, world, skills)
    if parsed is None or problems:
        return 0
    return sum(
        1 for a in words.amounts if a.value != 1 and _takers(a, skills) and _taken(a, parsed)
    )


def absent(words: TaskWords, name: str, world: World) -> bool:
    """Whether ``name`` (a thing a goal says is missing) is a thing the task says that this
    world lacks: its words run in the task, and no object or place of the world is called so
    (by its name or an alias, by a part of one, "the glass" for the sundae glass, or by more
    than one, "the glass bowl" where the glass is a thing)."""
    said = tuple(words_of(name))
    if not said or not words.says(name):
        return False
    return not any(
        run_in(list(p), said) is not None or run_in(list(said), p) is not None
        for thing in (*world.objects, *world.places)
        for p in phrases(thing)
    )


def missing_names(goal) -> list[str]:
    """The things a goal's items say are missing (``{"missing": NAME}``)."""
    items = goal if isinstance(goal, list) else []
    return [
        d["missing"] for d in items if isinstance(d, dict) and isinstance(d.get("missing"), str)
    ]


def names_in(value, world: World, out: set[str]) -> None:
    """Every world object or place name written anywhere in a goal's JSON (its calls' arguments
    and its sets' filters included)."""
    if isinstance(value, str):
        if world.object(value) is not None or world.place(value) is not None:
            out.add(value)
    elif isinstance(value, dict):
        for v in value.values():
            names_in(v, world, out)
    elif isinstance(value, list):
        for v in value:
            names_in(v, world, out)


def grounding(words: TaskWords, goal, world: World, skills: SkillSet | None) -> tuple[int, int]:
    """How well a goal is about what the task names, in any language: (net, said). ``said``
    counts each thing the task names (by its name or an alias) and each type it names that the
    goal is about; ``net`` is that less one for each thing the goal writes that the task does
    not mention at all. A ranking figure for goals the gate already passes, never a finding:
    "the sheet onto the plan chest" ranks the goal about the sheet and the chest above one that
    only picks the sheet up; a goal about nothing the task names (said 0) is no reading of it."""
    if skills is None or not isinstance(goal, list):
        return 0, 0
    parsed, problems = parse_goal({"goal": goal}, world, skills)
    if parsed is None or problems:
        return 0, 0
    written: set[str] = set()
    names_in(goal, world, written)
    about = written | {n for _, names in parsed.sets for n in names}
    # a place the task names where a thing it names already lies says where that thing is,
    # not what to do ("the sheet on the light box: move it to the chest"): no goal need say it
    lying = {o.at or o.on for o in world.objects if o.name in words.named or o.name in words.typed}
    said = sum(1 for name in words.named if name in about and name not in lying)
    types = {world.object(n).type for n in words.typed if world.object(n) is not None}
    said += sum(1 for t in types if any(o.type == t and o.name in about for o in world.objects))
    return said - sum(1 for name in written if not words.mentions(name)), said
