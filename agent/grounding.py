"""Does the plan's goal talk about what the task talks about? A check on words, not on meaning.

Symbolic execution proves that the steps reach the plan's *own* goal; nothing so far held the
goal to the task. A small model that is asked for a thing the world lacks ("put the orchid on
the bench" in a greenhouse without one) tends to swap in a thing the world has and plan for it,
and a task naming two objects often gets a goal about the first only. Both leave a plan that
is valid, safe and wrong. These findings catch them, all from the task's words:

- ``object``: a goal condition is about an object the task never mentions (by a word of its
  name, or its type). The repair prompt then points at ``missing``; a model that insists is
  refused, which is the safe side of a plan about the wrong thing.
- ``goal``: the task names a world object in full (every word of its name) and the goal says
  nothing about it; or the task's own verb ("open", "close", "inspect", "hold") asks for a
  condition of a named object that can take it, and the goal does not state it.
- ``object`` too: the task asks for a thing to be moved ("put", "bring", ...) and mentions no
  object of this world at all, yet the goal says nothing is missing.

Words match case-insensitively and tolerate a plural ``s``/``es``/``ies``. Places are not
checked: a goal's place may be said in many ways ("the low shelf", "up top"), and a wrong place
is not a wrong object.
"""
from __future__ import annotations

import re

from .conditions import Cond
from .files import World
from .findings import Finding
from .symbolic import parse_goal, states_by_object

_OBJECT_KINDS = ("at", "is", "holding")

# The vocabulary's own verbs (singular forms, see ``words``): a task that says "open the X"
# wants X open, whatever kind of condition the model would rather copy. word -> (kind, state)
STATE_VERBS = {"open": ("is", "open"), "opened": ("is", "open"),
               "close": ("is", "closed"), "closed": ("is", "closed"), "shut": ("is", "closed"),
               "inspect": ("is", "inspected"), "inspected": ("is", "inspected"), "examine": ("is", "inspected"),
               "hold": ("holding", None), "holding": ("holding", None)}
# Words that ask for a thing to be moved: with no world object mentioned, the thing is missing.
CARRY_VERBS = frozenset({"put", "bring", "take", "carry", "fetch", "move", "place", "lift", "deliver",
                         "stow", "store"})


def wanted(task_words: set[str], world: World) -> set[tuple[str, str | None]]:
    """(kind, state) the task's verbs ask for. A word of a name the task says in full is part
    of that name, not a verb ("the hold shelf", "the open bay")."""
    taken = {t for n in [*(o.name for o in world.objects), *(p.name for p in world.places)]
             if names(task_words, n) for t in name_words(n)}
    return {STATE_VERBS[w] for w in task_words - taken if w in STATE_VERBS}


def asks_to_carry(task_words: set[str]) -> bool:
    return bool(task_words & CARRY_VERBS)


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


def _cues(name: str, type_: str | None) -> list[str]:
    return [t for t in name_words(name) if len(t) >= 3 and not t.isdigit()] + (name_words(type_) if type_ else [])


def mentions(task_words: set[str], name: str, type_: str | None) -> bool:
    """The task refers to this object by some word of its name (3+ letters) or by its type."""
    return any(c in task_words for c in _cues(name, type_))


def names(task_words: set[str], name: str) -> bool:
    """The task names this object in full: every word of its name appears."""
    toks = name_words(name)
    return any(len(t) >= 3 and not t.isdigit() for t in toks) and all(t in task_words for t in toks)


def referred(task: str, world: World) -> list[str]:
    """World objects the task names in full, in the order it says them. (A single word is not
    enough: "the patient" in a ward is a person, not the patient hoist.)"""
    tw, low = words(task), task.lower()
    out = {o.name for o in world.objects if names(tw, o.name)}

    def first(name: str) -> int:
        o = world.object(name)
        found = [low.find(t) for t in name_words(o.name) if low.find(t) >= 0]
        return min(found, default=len(low))
    return sorted(out, key=lambda n: (first(n), n))


def grounding_findings(task: str, plan, world: World, skills=None) -> list[Finding]:
    """Findings (see the module doc) for a plan whose goal parses; [] when there is no goal to
    hold to the task (the gate reports that) or the goal already says a thing is missing.
    With ``skills``, the task's state verbs are checked too (an object's reachable states
    come from them)."""
    goal, problems = parse_goal(plan, world)
    if goal is None or problems or any(c.kind == "missing" for c in goal):
        return []
    tw, named = words(task), referred(task, world)
    reachable = reachable_conditions(world, skills) if skills is not None else (lambda name: set())
    out: list[Finding] = []
    in_goal = {c.subject for c in goal if c.kind in _OBJECT_KINDS}
    for c in goal:
        o = world.object(c.subject) if c.kind in _OBJECT_KINDS else None
        if o is not None and not mentions(tw, o.name, o.type):
            out.append(Finding(None, "object", _unmentioned(c, o.name)))
    for name in named:
        if name not in in_goal:
            out.append(Finding(None, "goal", f"the task names {name}, but the goal says nothing about it; "
                                             "state one condition for each object the task names"))
    return out + verb_findings(tw, named, goal, world, reachable)


def verb_findings(tw: set[str], named: list[str], goal, world: World, reachable) -> list[Finding]:
    """The task's verbs against the goal: "open the cabinet" with no `cabinet open`. tw: the
    task's ``words``; named: the objects it ``referred`` to; reachable(object name) -> the
    (kind, state) a skill can give it. A verb no named object can take ("open the trowel") is
    left to the other checks."""
    out = []
    want_all = wanted(tw, world)
    if not any(c.kind in _OBJECT_KINDS for c in goal) and asks_to_carry(tw) \
            and not any(mentions(tw, o.name, o.type) for o in world.objects):
        out.append(Finding(None, "object", "the task asks for a thing to be moved but mentions no object of "
                                           'this world; if that thing is not here, the goal is [{"missing": "<it>"}]'))
    for name in named:
        want = want_all & reachable(name)
        have = {(c.kind, c.value if c.kind == "is" else None) for c in goal if c.subject == name}
        if want and not want & have:
            said = " or ".join(sorted(st or "held" for _, st in want))
            out.append(Finding(None, "goal", f"the task asks for {name} {said}; the goal does not say so"))
    return out


def reachable_conditions(world: World, skills):
    """-> f(object name) -> {(kind, state)} some skill can make true of it."""
    kinds = {c.kind for s in skills.skills for c in s.effects}
    states = states_by_object(world, skills)
    held = {("holding", None)} if "holding" in kinds else set()
    return lambda name: held | {("is", st) for st in states.get(name, ())}


def _unmentioned(c: Cond, name: str) -> str:
    return (f"goal {c.text()}: the task does not mention {name}; if the task names a thing this "
            'world does not have, the goal is [{"missing": "<that thing>"}]')
