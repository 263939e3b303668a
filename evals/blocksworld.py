"""Blocksworld (PlanBench's domain) as an external evaluation set: a seeded generator of the
standard distribution writes PDDL problems, and a translation reads them back with the `pddl`
parser into this project's worlds and tasks.

    python -m evals.blocksworld [--out evals/sets/8-blocksworld] [--seed 29] [--per-size 12]

The distribution is the usual one for random Blocksworld: an initial state and a goal state
drawn uniformly from all arrangements of n blocks into towers (every state equally likely, by
the count of arrangements with k towers), for n = 4, 5, 6. The goal lists the goal state's `on`
facts, as PlanBench's do, and for a block that stands alone in the goal state but starts on
another block, that it goes on the table. Two limits of this project shape the draw, by
rejection (so the instances are the distribution conditioned on them): a plan's goal has at most
four items (plan.schema.json), so a six-block goal state has at least two towers; and a goal
that already holds at the start is drawn again.

The translation is what would take any Blocksworld problem file (PlanBench's own included)
to a world and a task: blocks named by PlanBench's colours (``a`` is the red block), `ontable`
as `at table`, `on` as `on`; the task is said in words ("Stack the red block on the blue
block and put the white block on the table."). The PDDL domain and problems stay in the set,
so every plan on it can also be checked by an independent validator (pddl_check.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from thor_runtime.errors import ThorError

SET_DIR = Path(__file__).resolve().parent / "sets" / "8-blocksworld"
SIZES = (4, 5, 6)
MAX_GOAL = 4  # plan.schema.json: a goal has at most four items
# PlanBench names block a the red block, b the blue block, ...
COLORS = dict(
    zip(
        "abcdefghijkl",
        (
            "red",
            "blue",
            "orange",
            "yellow",
            "white",
            "magenta",
            "black",
            "cyan",
            "green",
            "violet",
            "silver",
            "gold",
        ),
    )
)
# skill -> (PDDL action, its arguments in the action's order)
ACTIONS = {
    "pick_up": ("pick-up", ["object"]),
    "put_down": ("put-down", ["object"]),
    "stack": ("stack", ["object", "onto"]),
    "unstack": ("unstack", ["object", "from"]),
}
DOMAIN = """(define (domain blocksworld)
  (:requirements :strips)
  (:predicates (clear ?x) (ontable ?x) (handempty) (holding ?x) (on ?x ?y))
  (:action pick-up :parameters (?x)
    :precondition (and (clear ?x) (ontable ?x) (handempty))
    :effect (and (not (ontable ?x)) (not (clear ?x)) (not (handempty)) (holding ?x)))
  (:action put-down :parameters (?x)
    :precondition (holding ?x)
    :effect (and (not (holding ?x)) (clear ?x) (handempty) (ontable ?x)))
  (:action stack :parameters (?x ?y)
    :precondition (and (holding ?x) (clear ?y))
    :effect (and (not (holding ?x)) (not (clear ?y)) (clear ?x) (handempty) (on ?x ?y)))
  (:action unstack :parameters (?x ?y)
    :precondition (and (on ?x ?y) (clear ?x) (handempty))
    :effect (and (holding ?x) (clear ?y) (not (clear ?x)) (not (handempty)) (not (on ?x ?y)))))
"""


# ---- the generator: uniform random states ---------------------------------------------------
def _arrangements(n: int, k: int) -> int:
    """States of n labelled blocks in exactly k towers (the Lah number)."""
    return math.comb(n - 1, k - 1) * math.factorial(n) // math.factorial(k)


def random_state(blocks: list[str], rng: random.Random) -> list[list[str]]:
    """Towers (each bottom first), every arrangement of ``blocks`` equally likely: draw the
    number of towers by how many states have it, then an order of the blocks cut into that many
    runs; each state comes from the same number of (order, cuts) pairs (its towers' orders)."""
    n = len(blocks)
    k = rng.choices(range(1, n + 1), [_arrangements(n, k) for k in range(1, n + 1)])[0]
    order = rng.sample(blocks, n)
    cuts = [0, *sorted(rng.sample(range(1, n), k - 1)), n]
    return sorted((order[a:b] for a, b in zip(cuts, cuts[1:])), key=lambda t: t[0])


def _facts(towers: list[list[str]]) -> set[tuple]:
    return {("ontable", t[0]) for t in towers} | {
        ("on", x, y) for t in towers for y, x in zip(t, t[1:])
    }


def goal_facts(
    init: list[list[str]], goal: list[list[str]], rng: random.Random
) -> list[tuple] | None:
    """The goal state's `on` facts (in a random order, as a problem file may list them), then
    `ontable` for a block alone in the goal that starts on another, while there is room."""
    on = [("on", x, y) for t in goal for y, x in zip(t, t[1:])]
    if len(on) > MAX_GOAL:
        return None
    rng.shuffle(on)
    start = _facts(init)
    table = [("ontable", t[0]) for t in goal if len(t) == 1 and ("ontable", t[0]) not in start]
    facts = on + table[: MAX_GOAL - len(on)]
    return None if set(facts) <= start else facts


def problem_text(name: str, init: list[list[str]], goal: list[tuple]) -> str:
    blocks = sorted(b for t in init for b in t)
    start = (
        ["(handempty)"]
        + [f"(ontable {t[0]})" for t in init]
        + [f"(on {x} {y})" for t in init for y, x in zip(t, t[1:])]
        + [f"(clear {t[-1]})" for t in init]
    )
    return (
        f"(define (problem {name})\n  (:domain blocksworld)\n  (:objects {' '.join(blocks)})\n"
        f"  (:init {' '.join(start)})\n"
        f"  (:goal (and {' '.join('(' + ' '.join(f) + ')' for f in goal)})))\n"
    )


def generate(seed: int = 29, per_size: int = 12) -> list[tuple[str, str]]:
    """-> [(problem name, PDDL text)], ``per_size`` instances of each size, from ``seed``."""
    rng, out = random.Random(seed), []
    for n in SIZES:
        blocks = list("abcdefghijkl"[:n])
        for i in range(per_size):
            while True:
                init, goal = random_state(blocks, rng), random_state(blocks, rng)
                facts = goal_facts(init, goal, rng)
                if facts is not None:
                    break
            name = f"bw-{n}-{i + 1:02d}"
            out.append((name, problem_text(name, init, facts)))
    return out


# ---- the translation: a PDDL problem -> a world and a task ------------------------------------
def block_name(pddl_name: str) -> str:
    if pddl_name not in COLORS:
        raise ThorError(f"block {pddl_name!r}: PlanBench's names are a..l (a is the red block)")
    return f"{COLORS[pddl_name]}_block"


def read_problem(path: Path) -> tuple[list[str], dict, list[tuple]]:
    """-> (blocks, block -> what it rests on ("table" or a block), goal facts), by the `pddl`
    parser."""
    import pddl
    from pddl.logic.base import And

    p = pddl.parse_problem(str(path))
    blocks = sorted(o.name for o in p.objects)
    rests = {}
    for f in p.init:
        args = [t.name for t in f.terms]
        if f.name == "ontable":
            rests[args[0]] = "table"
        elif f.name == "on":
            rests[args[0]] = args[1]
        elif f.name == "holding":
            raise ThorError(
                f"{path}: a world starts with the hand empty, this problem holds {args[0]}"
            )
    goal = [
        (g.name, *(t.name for t in g.terms))
        for g in (p.goal.operands if isinstance(p.goal, And) else [p.goal])
    ]
    if any(g[0] not in ("on", "ontable") for g in goal) or set(rests) != set(blocks):
        raise ThorError(
            f"{path}: not a Blocksworld problem "
            "(every block on the table or a block; goals on / ontable)"
        )
    return blocks, rests, goal


def world_doc(name: str, blocks: list[str], rests: dict) -> dict:
    """Towers side by side on the table, 12 cm apart, blocks 5 cm high."""
    above = {rests[b]: b for b in blocks}
    objects = []
    for i, base in enumerate(sorted(b for b in blocks if rests[b] == "table")):
        level, cur = 0, base
        while cur is not None:
            objects.append(
                {
                    "name": block_name(cur),
                    "type": "block",
                    "position": [round(-0.3 + 0.12 * i, 3), 0.0, round(0.775 + 0.05 * level, 3)],
                    "mass_kg": 0.1,
                    **({"at": "table"} if level == 0 else {"on": block_name(rests[cur])}),
                }
            )
            cur, level = above.get(cur), level + 1
    return {
        "name": name,
        "description": "one arm over a table of toy blocks (Blocksworld)",
        "skills": "../../../../agent/skills/blocks.json",
        "objects": objects,
        "places": [{"name": "table", "position": [0.0, 0.0, 0.75]}],
        "robot": {
            "workspace": {"min": [-0.6, -0.6, 0.6], "max": [0.6, 0.6, 1.3]},
            "max_payload_kg": 1.0,
        },
    }


def goal_doc(goal: list[tuple]) -> list[dict]:
    return [
        {"object": block_name(g[1]), "on": block_name(g[2])}
        if g[0] == "on"
        else {"object": block_name(g[1]), "at": "table"}
        for g in goal
    ]


# (opening, how an `on` is said, how `ontable` is said, the word before the last clause)
WORDINGS = (
    ("Stack", "the {x} block on the {y} block", "put the {x} block on the table", " and "),
    (
        "My goal is to have",
        "the {x} block on top of the {y} block",
        "the {x} block on the table",
        " and ",
    ),
    ("Put", "the {x} block on the {y} block", "the {x} block on the table", " and "),
    ("I want", "the {x} block on the {y} block", "the {x} block on the table", " and "),
)
# the shortest, for a goal whose words would not fit the plan's `task` (160 characters)
TERSE = ("Put", "the {x} block on the {y} block", "the {x} block on the table", ", ")
TASK_CHARS = 160


def task_words(goal: list[tuple], rng: random.Random) -> str:
    """The goal in words, PlanBench-like ("My goal is to have the red block on top of the blue
    block and ..."), in a wording drawn from WORDINGS."""

    def say(opening: str, on: str, table: str, last: str) -> str:
        said = [
            on.format(x=COLORS[g[1]], y=COLORS[g[2]])
            if g[0] == "on"
            else table.format(x=COLORS[g[1]])
            for g in goal
        ]
        if said[0].startswith(
            "put "
        ):  # "Stack the white block on the table" reads wrong: it is put
            opening, said[0] = "Put", said[0][4:]
        return f"{opening} {said[0] if len(said) == 1 else ', '.join(said[:-1]) + last + said[-1]}."

    text = say(*rng.choice(WORDINGS))
    return text if len(text) <= TASK_CHARS else say(*TERSE)


def _json_lines(doc: dict) -> str:
    """A world file as the project writes them: one object or place a line."""
    head = {k: v for k, v in doc.items() if k not in ("objects", "places", "robot")}
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    for key in ("objects", "places"):
        items = ",\n".join(f"    {json.dumps(x)}" for x in doc[key])
        lines.append(f"  {json.dumps(key)}: [\n{items}\n  ],")
    lines.append(f'  "robot": {json.dumps(doc["robot"])}')
    return "{\n" + "\n".join(lines) + "\n}\n"


def translate(out: Path, seed: int = 29) -> tuple[list[dict], set[str]]:
    """Every ``out/problems/*.pddl`` -> ``out/worlds/<name>.json`` and a task; -> (the tasks,
    the PDDL names of the blocks they use)."""
    tasks, letters = [], set()
    (out / "worlds").mkdir(parents=True, exist_ok=True)
    for path in sorted((out / "problems").glob("*.pddl")):
        blocks, rests, goal = read_problem(path)
        letters |= set(blocks)
        world = path.stem.replace("-", "_")
        (out / "worlds" / f"{world}.json").write_text(_json_lines(world_doc(world, blocks, rests)))
        rng = random.Random(f"{seed}:{path.stem}")
        tasks.append(
            {
                "id": path.stem,
                "world": world,
                "task": task_words(goal, rng),
                "goal": goal_doc(goal),
                "problem": f"problems/{path.name}",
            }
        )
    return tasks, letters


def write_set(out: Path = SET_DIR, seed: int = 29, per_size: int = 12) -> int:
    """Generate the problems, translate them, and write the set (tasks.json, worlds/, problems/,
    domain.pddl). Same seed, same files."""
    (out / "problems").mkdir(parents=True, exist_ok=True)
    for old in [*(out / "problems").glob("*.pddl"), *(out / "worlds").glob("*.json")]:
        old.unlink()  # a smaller draw leaves none of a larger one behind
    (out / "domain.pddl").write_text(DOMAIN)
    for name, text in generate(seed, per_size):
        (out / "problems" / f"{name}.pddl").write_text(text)
    tasks, letters = translate(out, seed)
    description = (
        f"Blocksworld, {per_size} instances each of {', '.join(map(str, SIZES))} blocks, "
        f"drawn with seed {seed} by python -m evals.blocksworld; every plan is also checked "
        "against domain.pddl and its problem by an independent PDDL validator"
    )
    binding = {
        "domain": "domain.pddl",
        "actions": ACTIONS,
        "objects": {block_name(b): b for b in sorted(letters)},
    }
    body = ",\n".join(f"  {json.dumps(t)}" for t in tasks)
    (out / "tasks.json").write_text(
        f'{{"description": {json.dumps(description)},\n "pddl": {json.dumps(binding)},\n'
        f' "tasks": [\n{body}\n]}}\n'
    )
    return len(tasks)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m evals.blocksworld", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--out", type=Path, default=SET_DIR, help="the set's directory (default: %(default)s)"
    )
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument(
        "--per-size", type=int, default=12, help="instances of each size (4, 5, 6 blocks)"
    )
    args = ap.parse_args(argv)
    n = write_set(args.out, args.seed, args.per_size)
    print(f"{n} tasks in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
