"""Does the plan's goal talk about what the task talks about? A check on words, not on meaning.

Symbolic execution proves that the steps reach the plan's *own* goal; nothing so far held the
goal to the task. A small model that is asked for a thing the world lacks ("put the orchid on
the bench" in a greenhouse without one) tends to swap in a thing the world has and plan for it,
and a task naming two objects often gets a goal about the first only. Both leave a plan that
is valid, safe and wrong. Two findings catch them, both from the task's words:

- ``object``: a goal condition is about an object the task never mentions (by a word of its
  name, or its type). The repair prompt then points at ``missing``; a model that insists is
  refused, which is the safe side of a plan about the wrong thing.
- ``goal``: the task names a world object in full (every word of its name) and the goal says
  nothing about it.

Words match case-insensitively and tolerate a plural ``s``/``es``/``ies``. Places are not
checked: a goal's place may be said in many ways ("the low shelf", "up top"), and a wrong place
is not a wrong object.
"""
from __future__ import annotations

import re

from .conditions import Cond
from .files import World
from .findings import Finding
from .symbolic import parse_goal

_OBJECT_KINDS = ("at", "is", "holding")


def words(text: str) -> set[str]:
    """Lower-case alphanumeric words, each also in its singular form."""
    out = set()
    for w in re.findall(r"[a-z0-9]+", text.lower()):
        out.add(w)
        if w.endswith("ies") and len(w) > 4:
            out.add(w[:-3] + "y")
        elif w.endswith("es") and len(w) > 3:
            out.update((w[:-2], w[:-1]))
        elif w.endswith("s") and len(w) > 2:
            out.add(w[:-1])
    return out


def name_words(name: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def mentions(task_words: set[str], name: str, type_: str | None) -> bool:
    """The task refers to this object by some word of its name (3+ letters) or by its type."""
    cues = [t for t in name_words(name) if len(t) >= 3 and not t.isdigit()]
    cues += name_words(type_) if type_ else []
    return any(c in task_words for c in cues)


def names(task_words: set[str], name: str) -> bool:
    """The task names this object in full: every word of its name appears."""
    toks = name_words(name)
    return any(len(t) >= 3 and not t.isdigit() for t in toks) and all(t in task_words for t in toks)


def grounding_findings(task: str, plan, world: World) -> list[Finding]:
    """Findings (see the module doc) for a plan whose goal parses; [] when there is no goal to
    hold to the task (the gate reports that) or the goal already says a thing is missing."""
    goal, problems = parse_goal(plan, world)
    if goal is None or problems or any(c.kind == "missing" for c in goal):
        return []
    tw = words(task)
    out: list[Finding] = []
    in_goal = {c.subject for c in goal if c.kind in _OBJECT_KINDS}
    for c in goal:
        o = world.object(c.subject) if c.kind in _OBJECT_KINDS else None
        if o is not None and not mentions(tw, o.name, o.type):
            out.append(Finding(None, "object", _unmentioned(c, o.name)))
    for o in world.objects:
        if o.name not in in_goal and names(tw, o.name):
            out.append(Finding(None, "goal", f"the task names {o.name}, but the goal says nothing about it; "
                                             "state one condition for each object the task names"))
    return out


def _unmentioned(c: Cond, name: str) -> str:
    return (f"goal {c.text()}: the task does not mention {name}; if the task names a thing this "
            'world does not have, the goal is [{"missing": "<that thing>"}]')
