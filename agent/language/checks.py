"""Checks that hold a plan's goal to its task, in any language: the things it names and the
amounts it says (mentions.py), never its grammar.

Symbolic execution proves the steps reach the plan's *own* goal; these hold the goal to the task:

- ``object``: the goal is about an object the task names in no way (not by its name, an alias
  or its type): a small model asked for a thing the world lacks swaps in one it has. The repair
  points at ``missing``. A `missing` thing must itself be said in the task.
- ``goal``: the task names an object by its name or an alias and the goal says nothing of it
  (a two-object task stated by half); or the task says an amount (digits, or a lexicon's number
  words, with a unit a lexicon knows) that no call of the goal takes: "shove it 5 cm" with no
  push of 0.05 m, "wait 30 s" with no wait, "three times" with no ``times``.

An amount inside a thing's name ("bay 2") is no amount; an amount no skill could take (no
numeric argument admits it in any unit) is left alone.
"""
from __future__ import annotations

import math

from agent.files.loader import SkillSet, World
from agent.language.mentions import Amount, TaskWords
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
            if a.unit not in (None, "count") and _UNIT_OF_ARG.get(arg.unit or "") not in (None, a.unit):
                continue
            lo = arg.min if arg.min is not None else -math.inf
            hi = arg.max if arg.max is not None else math.inf
            if any(lo <= v <= hi for v in _values(a)):
                return True
    return False


def _taken(a: Amount, goal) -> bool:
    for act in goal.all_acts():
        if a.unit in (None, "count") and _close(act.times, a.value) and act.times > 1:
            return True
        for _, v in act.args:
            if isinstance(v, (int, float)) and not isinstance(v, bool) \
                    and any(_close(float(v), x) for x in _values(a)):
                return True
    return False


def task_findings(words: TaskWords, plan, world: World, skills: SkillSet | None = None,
                  parsed: ParsedGoal | None = None) -> list[Finding]:
    """The findings above for a plan whose goal parses; [] when it has none to check."""
    raw = plan.get("goal") if isinstance(plan, dict) else None
    missing = [d["missing"] for d in raw if isinstance(d, dict) and isinstance(d.get("missing"), str)] \
        if isinstance(raw, list) else []
    if missing:         # (the executor reports the thing as not here: the refusal's own finding)
        return [Finding(None, "object", f"the goal says {m!r} is missing, but the task does not say "
                                        f"{m!r}; name the thing the task asks for")
                for m in missing if not words.says(m)]
    goal, problems = parse_goal(plan, world, skills) if parsed is None else parsed
    if goal is None or problems:
        return []
    out: list[Finding] = []
    members = {n for _, names in goal.sets for n in names}
    about = {c.subject for c in goal if c.kind in _OBJECT_KINDS} | goal.objects(world) | members
    for name in sorted(goal.objects(world) - members):
        if not words.mentions(name):
            out.append(Finding(None, "object", f"the goal is about {name}, which the task does not "
                                               "name; if the task asks for a thing this world does "
                                               'not have, the goal is [{"missing": "<that thing>"}]'))
    for name, _ in sorted(words.named.items(), key=lambda kv: kv[1]):
        if world.object(name) is not None and name not in about:
            out.append(Finding(None, "goal", f"the task names {name}, but the goal says nothing "
                                             "about it; state one condition for each object the "
                                             "task names"))
    if skills is not None:
        for a in words.amounts:
            if _takers(a, skills) and not _taken(a, goal):
                said = f"{a.value:g}" + (f" {a.unit}" if a.unit not in (None, "count") else "")
                out.append(Finding(None, "goal", f"the task says {said}, and no call in the goal "
                                                 'takes it: {"do": SKILL, "args": {...}} with it, '
                                                 'or "times"'))
    return out
