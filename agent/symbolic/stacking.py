"""Goals that stack objects on objects (`on`): the classic tower strategy, one move at a time.

A goal such as "the red block on the blue one, the blue one on the green one" is Blocksworld.
Breadth-first search over every call on every block of the towers grows with the number of
arrangements (some 7,000 states for six blocks and a hand, each with dozens of calls), so the
solver plans these goals the classic way instead, which is complete for them and at most twice
as long as the shortest plan:

1. an object is *in place* when it rests where the goal wants it (or the goal says nothing of
   it), no other object the goal wants there holds its spot, and what it rests on is in place;
2. while some object is not in place: move a clear one onto where the goal wants it, when that
   is a place or an object in place and clear (a move that builds); else move a clear one that
   is not in place off its tower onto a place (a move that clears);
3. then whatever else the goal asks (a block held at the end) by the ordinary search.

Every move ("red_block on blue_block", "red_block at table") is itself found by the solver's
breadth-first search from the current state, a few calls deep, so the skills' preconditions and
effects decide which calls make it (unstack and put down; pick up and stack) and which are safe.
"""

from __future__ import annotations

from agent.files.loader import World
from agent.symbolic.conditions import Cond
from agent.symbolic.executor import HELD, State, apply, holds, initial_state, reaches
from agent.symbolic.goals import Goal

MOVE_DEPTH = 4  # calls one move may take: take it (unstack / pick up), put it (stack / put down)


def applies(goal) -> bool:
    """A goal of end states that stacks something: required calls and orders are left to the
    ordinary search, which tracks their progress."""
    return any(c.kind == "on" for c in goal) and not (isinstance(goal, Goal) and goal.process)


def towers_of(names: set[str], world: World) -> set[str]:
    """Every object of the towers these objects stand in at the start (what is on them may have
    to move off, whatever the goal says of it)."""
    below = {o.name: o.on for o in world.objects}

    def base(n: str) -> str:
        while below.get(n):
            n = below[n]
        return n

    bases = {base(n) for n in names if world.object(n)}
    return {o.name for o in world.objects if base(o.name) in bases}


def _wants(goal, world: World) -> tuple[dict, dict] | None:
    """-> (object -> where the goal wants it, object -> the object the goal wants on it), or None
    when the goal wants one object in two spots or two objects on one (no state has both)."""
    want, on = {}, {}
    for c in goal:
        if c.kind in ("on", "at") and world.object(c.subject):
            if want.setdefault(c.subject, c.value) != c.value:
                return None
    for x, y in want.items():
        if world.object(y) and on.setdefault(y, x) != x:
            return None
    return want, on


def plan(goal: Goal, world: World, actions: list, max_steps: int, search) -> list | None:
    """-> the actions (solver.Action) that reach ``goal`` from the world's initial state, at most
    ``max_steps`` of them, or None. ``search(goal, world, actions, depth, state)``: the solver's
    breadth-first search, which finds each move."""
    wants = _wants(goal, world)
    if wants is None:
        return None
    want, wanted_on = wants
    members = sorted(towers_of(goal.objects(world), world))
    st, path = initial_state(world), []

    def in_place(x: str) -> bool:
        at = st.loc.get(x)
        if at in (HELD, None) or (x in want and want[x] != at):
            return False
        if at in st.loc:  # on an object: its spot, and what holds it up
            return wanted_on.get(at, x) == x and in_place(at)
        return True

    def clear(x: str) -> bool:
        return holds(Cond("clear", x), st)[0] is True

    while not all(in_place(x) for x in members):
        loose = [x for x in members if not in_place(x) and clear(x)]
        builds = [
            Cond("on" if world.object(want[x]) else "at", x, want[x])
            for x in loose
            if x in want and (not world.object(want[x]) or (in_place(want[x]) and clear(want[x])))
        ]
        steps = next(
            (s for c in builds for s in [search((c,), world, actions, MOVE_DEPTH, st)] if s), None
        )
        if steps is None:  # nothing builds: clear a misplaced one off its tower
            steps = next(
                (
                    s
                    for x in loose
                    if st.loc.get(x) in st.loc
                    for s in [_park(x, world, actions, st, search)]
                    if s
                ),
                None,
            )
        if steps is None or len(path) + len(steps) > max_steps:
            return None
        for a in steps:
            st = apply(a.eff, st, "")
        path += steps
    if not reaches(goal, st):  # what else the goal asks, from the built towers
        rest = search(goal, world, actions, max_steps - len(path), st)
        if rest is None:
            return None
        path += rest
    return path


def _park(x: str, world: World, actions: list, st: State, search) -> list | None:
    """Move ``x`` onto a place some call can put it at (the table), the world's places in order."""
    spots = {c.value for a in actions for c in a.eff if c.kind == "at" and c.subject == x}
    for p in (p.name for p in world.places if p.name in spots):
        steps = search((Cond("at", x, p),), world, actions, MOVE_DEPTH, st)
        if steps:
            return steps
    return None
