"""World, skills and schema files: loading, validation, and the typed views the planner uses.

Every problem a user can cause in these files raises ``ThorError`` naming the file and the
place inside it, before any model is loaded. The JSON meta-schemas in ``agent/schemas`` check
shapes; the semantic rules (unique names, min < max, values only on enums) live in the
dataclasses' ``__post_init__`` so a World or SkillSet built in code is held to the same rules.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import jsonschema

from agent.files.names import name_words, words
from agent.symbolic.conditions import EFFECT_KINDS, SKILL_PRE_KINDS, Cond, parse_conds
from thor_runtime.errors import ThorError

AGENT_DIR = Path(__file__).resolve().parent.parent
SCHEMA_DIR = AGENT_DIR / "schemas"
DEFAULT_SKILLS = AGENT_DIR / "skills" / "manipulation.json"
PLAN_SCHEMA = SCHEMA_DIR / "plan.schema.json"
ARG_TYPES = ("number", "integer", "string", "enum", "object", "place", "position")
MAX_PLAN_STEPS = 99  # step ids are s1..s99 (plan.schema.json)
OBJECT_STATES = ("open", "closed")


# ---- world ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WorldObject:
    name: str
    type: str
    position: tuple[float, float, float]
    mass_kg: float
    graspable: bool = True
    at: str | None = None  # the place it rests at initially (None: at no named place)
    state: str | None = None  # open / closed, for drawers, doors, lids (None: not stated)
    aliases: tuple[str, ...] = ()  # what the people here also call it ("the guitar")
    on: str | None = None  # the object it rests on initially (a block on a block), instead of `at`

    def __post_init__(self):
        _check_xyz(self.position, f"object {self.name!r} position")
        _check_aliases(self.aliases, f"object {self.name!r}")
        if not (math.isfinite(self.mass_kg) and self.mass_kg >= 0):
            raise ThorError(f"object {self.name!r}: mass_kg must be a finite number >= 0")
        if self.state is not None and self.state not in OBJECT_STATES:
            raise ThorError(
                f"object {self.name!r}: state must be one of {', '.join(OBJECT_STATES)}"
            )


@dataclass(frozen=True)
class Place:
    name: str
    position: tuple[float, float, float]
    aliases: tuple[str, ...] = ()  # what the people here also call it ("customs")

    def __post_init__(self):
        _check_xyz(self.position, f"place {self.name!r} position")
        _check_aliases(self.aliases, f"place {self.name!r}")


@dataclass(frozen=True)
class Robot:
    workspace_min: tuple[float, float, float]
    workspace_max: tuple[float, float, float]
    max_payload_kg: float
    at: str | None = None  # a mobile base's initial place

    def __post_init__(self):
        _check_xyz(self.workspace_min, "robot.workspace.min")
        _check_xyz(self.workspace_max, "robot.workspace.max")
        for axis, lo, hi in zip("xyz", self.workspace_min, self.workspace_max):
            if not lo < hi:
                raise ThorError(f"robot.workspace: min {axis}={lo} must be below max {axis}={hi}")
        if not (math.isfinite(self.max_payload_kg) and self.max_payload_kg > 0):
            raise ThorError("robot.max_payload_kg must be a finite number > 0")

    def inside(self, p) -> bool:
        return all(lo <= v <= hi for v, lo, hi in zip(p, self.workspace_min, self.workspace_max))


@dataclass(frozen=True)
class World:
    name: str
    objects: tuple[WorldObject, ...]
    places: tuple[Place, ...]
    robot: Robot
    skills_ref: str | None = None  # the world's own `skills` entry, resolved to a path
    source: str = "<memory>"

    def __post_init__(self):
        seen: set[str] = set()
        for n in [o.name for o in self.objects] + [p.name for p in self.places]:
            if n in seen:
                raise ThorError(
                    f"name {n!r} is used twice (objects and places share one namespace)"
                )
            seen.add(n)
        # one phrase for two things would let a task's reading pick either
        called = {" ".join(name_words(t.name)): t.name for t in self.objects + self.places}
        for thing in self.objects + self.places:
            for a in thing.aliases:
                other = called.setdefault(" ".join(words(a)), thing.name)
                if other != thing.name:
                    raise ThorError(f"alias {a!r} of {thing.name!r} also names {other!r}")
        if not self.objects and not self.places:
            raise ThorError("the world has no objects and no places")
        places = {p.name for p in self.places}
        for who, where in [(f"object {o.name!r}", o.at) for o in self.objects] + [
            ("robot", self.robot.at)
        ]:
            if where is not None and where not in places:
                raise ThorError(f"{who}: `at` names {where!r}, which is not a place of this world")
        _check_supports(self.objects)

    def object(self, name: str) -> WorldObject | None:
        return next((o for o in self.objects if o.name == name), None)

    def place(self, name: str) -> Place | None:
        return next((p for p in self.places if p.name == name), None)


def _check_supports(objects) -> None:
    """`on` names another object of this world, never with `at` beside it, and following what
    each rests on ends at a place or nowhere: a loop would leave where things are undefined."""
    below = {o.name: o.on for o in objects if o.on is not None}
    for o in objects:
        if o.on is None:
            continue
        if o.at is not None:
            raise ThorError(
                f"object {o.name!r}: give `at` or `on`, not both (it rests on one thing)"
            )
        if o.on == o.name or not any(x.name == o.on for x in objects):
            raise ThorError(
                f"object {o.name!r}: `on` names {o.on!r}, which is not another object of this world"
            )
        seen, cur = {o.name}, o.on
        while cur in below:
            if cur in seen:
                raise ThorError(f"object {o.name!r}: what it rests on loops back to {cur!r}")
            seen.add(cur)
            cur = below[cur]


# ---- skills ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: str
    min: float | None = None
    max: float | None = None
    unit: str | None = None
    values: tuple[str, ...] = ()
    object_types: tuple[str, ...] = ()  # object args: only objects of these types qualify
    payload: bool = False  # object args: the robot lifts it (mass vs. max payload)
    max_length: int = 40  # string args: keeps decoding bounded

    def __post_init__(self):
        where = f"arg {self.name!r}"
        if self.type not in ARG_TYPES:
            raise ThorError(f"{where}: unknown type {self.type!r} (one of {', '.join(ARG_TYPES)})")
        if self.type == "enum" and not self.values:
            raise ThorError(f"{where}: type enum needs a non-empty `values` list")
        if self.values and self.type != "enum":
            raise ThorError(f"{where}: `values` is only for type enum, not {self.type}")
        if (self.min is not None or self.max is not None) and self.type not in (
            "number",
            "integer",
        ):
            raise ThorError(f"{where}: `min`/`max` are only for number and integer args")
        if self.min is not None and self.max is not None and not self.min <= self.max:
            raise ThorError(f"{where}: min {self.min} is above max {self.max}")
        if (self.payload or self.object_types) and self.type != "object":
            raise ThorError(f"{where}: `payload`/`object_types` are only for type object")
        if self.type == "integer" and any(
            v is not None and v != int(v) for v in (self.min, self.max)
        ):
            raise ThorError(f"{where}: integer bounds must be whole numbers")


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    args: tuple[ArgSpec, ...]
    timeout_s: float | None = None  # the skill's own limit; a step may not ask for more
    preconditions: tuple[Cond, ...] = ()
    effects: tuple[Cond, ...] = ()
    unchanged: tuple[str, ...] = ()  # object args the skill states it leaves as they are

    def __post_init__(self):
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ThorError(f"skill {self.name!r}: duplicate arg names")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ThorError(f"skill {self.name!r}: timeout_s must be > 0")
        types = {a.name: a.type for a in self.args}
        for what, conds in (("preconditions", self.preconditions), ("effects", self.effects)):
            for c in conds:
                for ref, kind in c.refs():
                    if ref.startswith("$") and types.get(ref[1:]) != kind:
                        raise ThorError(
                            f"skill {self.name!r}: {what} {c.to_dict()} needs {ref!r} to be "
                            f"an argument of type {kind}"
                        )
        if any(c.kind == "hand" and c.value != "empty" for c in self.effects):
            raise ThorError(
                f'skill {self.name!r}: the only hand effect is {{"hand": "empty"}} '
                '(say what is held with {"holding": ...})'
            )
        for n in self.unchanged:
            if types.get(n) != "object":
                raise ThorError(
                    f"skill {self.name!r}: `unchanged` names {n!r}, not an object argument"
                )
        # Fail closed: an object argument whose fate the file does not state would escape the
        # payload and executability checks, so such a skill is refused rather than trusted.
        stated = {ref[1:] for c in self.effects for ref, _ in c.refs() if ref.startswith("$")}
        for a in self.args:
            if a.type == "object" and a.name not in stated and a.name not in self.unchanged:
                raise ThorError(
                    f"skill {self.name!r}: the effect on object argument {a.name!r} is not stated; "
                    f'add an effect naming "${a.name}" (e.g. {{"holding": "${a.name}"}}) '
                    f"or list it in `unchanged`"
                )

    @property
    def carries(self) -> frozenset[str]:
        """Object args this skill holds or moves: they get the payload and graspability checks
        whatever their `payload` flag says."""
        return frozenset(
            c.subject[1:]
            for c in self.effects
            if c.kind in ("holding", "at", "on") and c.subject and c.subject.startswith("$")
        )


@dataclass(frozen=True)
class SkillSet:
    skills: tuple[Skill, ...]
    source: str = "<memory>"
    # the most steps a plan in this library may take (None: the plan schema's own cap); a
    # library of finer skills needs more ("unstack, put down" is one move of a block)
    max_steps: int | None = None

    def __post_init__(self):
        if not self.skills:
            raise ThorError("the skills file defines no skills")
        if self.max_steps is not None and not 1 <= self.max_steps <= MAX_PLAN_STEPS:
            raise ThorError(f"max_steps must be 1..{MAX_PLAN_STEPS}, got {self.max_steps}")
        names = [s.name for s in self.skills]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ThorError(f"skill {dup!r} is defined twice")

    def get(self, name: str) -> Skill | None:
        return next((s for s in self.skills if s.name == name), None)

    @property
    def kinds(self) -> set[str]:
        """The kinds of condition some skill can make true (``at``, ``is``, ``robot_at`` ...)."""
        return {c.kind for s in self.skills for c in s.effects}


def _check_aliases(aliases, where: str) -> None:
    for a in aliases:
        if not isinstance(a, str) or not any(ch.isalpha() for ch in a) or len(a) > 40:
            raise ThorError(
                f"{where}: alias {a!r} must be 1-40 characters with at least one letter"
            )


# ---- loading --------------------------------------------------------------------------------
def _check_xyz(v, what: str) -> None:
    if len(v) != 3 or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v):
        raise ThorError(f"{what} must be 3 finite numbers [x, y, z] in metres")


def read_json(path, what: str):
    p = Path(path)
    if not p.is_file():
        raise ThorError(f"{what} file not found: {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
        # "\ud800" is valid JSON but a lone surrogate, which no later step can encode
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except json.JSONDecodeError as e:
        raise ThorError(f"{p}: not valid JSON ({e})") from None
    except UnicodeDecodeError:
        raise ThorError(f"{p}: not UTF-8 text") from None
    except UnicodeEncodeError:
        raise ThorError(
            f"{p}: holds a string that is not valid Unicode (a lone surrogate such as \\ud800)"
        ) from None
    except RecursionError:
        raise ThorError(f"{p}: JSON nested too deeply to read") from None
    except OSError as e:
        raise ThorError(f"{p}: cannot be read: {e.strerror or e}") from None
    return doc


def _meta_check(data, meta_name: str, path) -> None:
    meta = json.loads((SCHEMA_DIR / meta_name).read_text(encoding="utf-8"))
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(meta).iter_errors(data))
    if err is not None:
        where = "/".join(str(x) for x in err.absolute_path) or "top level"
        raise ThorError(f"{path}: at {where}: {err.message}")


def world_from_dict(data: dict, source: str = "<memory>", base_dir: Path | None = None) -> World:
    _meta_check(data, "world.schema.json", source)
    try:
        objs = tuple(
            WorldObject(
                o["name"],
                o["type"],
                tuple(o["position"]),
                float(o["mass_kg"]),
                bool(o.get("graspable", True)),
                o.get("at"),
                o.get("state"),
                tuple(o.get("aliases", ())),
                o.get("on"),
            )
            for o in data["objects"]
        )
        places = tuple(
            Place(p["name"], tuple(p["position"]), tuple(p.get("aliases", ())))
            for p in data["places"]
        )
        ws = data["robot"]["workspace"]
        robot = Robot(
            tuple(ws["min"]),
            tuple(ws["max"]),
            float(data["robot"]["max_payload_kg"]),
            data["robot"].get("at"),
        )
        ref = data.get("skills")
        if ref is not None and base_dir is not None:
            try:
                ref = str((base_dir / ref).resolve())
            except (ValueError, OSError) as e:  # a NUL byte, a symlink loop
                raise ThorError(f"skills {ref!r} is not a usable path: {e}") from None
        return World(str(data.get("name", Path(source).stem)), objs, places, robot, ref, source)
    except ThorError as e:
        raise ThorError(f"{source}: {e}") from None


def load_world(path) -> World:
    p = Path(path)
    return world_from_dict(read_json(p, "world"), str(p), p.resolve().parent)


def skills_from_dict(data: dict, source: str = "<memory>") -> SkillSet:
    _meta_check(data, "skills.schema.json", source)
    skills = []
    for s in data["skills"]:
        try:
            args = tuple(
                ArgSpec(
                    n,
                    a["type"],
                    a.get("min"),
                    a.get("max"),
                    a.get("unit"),
                    tuple(a.get("values", ())),
                    tuple(a.get("object_types", ())),
                    bool(a.get("payload", False)),
                    int(a.get("max_length", 40)),
                )
                for n, a in s["args"].items()
            )
            where = f"skill {s['name']!r}"
            skills.append(
                Skill(
                    s["name"],
                    s["description"],
                    args,
                    s.get("timeout_s"),
                    parse_conds(
                        s.get("preconditions", []), SKILL_PRE_KINDS, f"{where} preconditions"
                    ),
                    parse_conds(s.get("effects", []), EFFECT_KINDS, f"{where} effects"),
                    tuple(s.get("unchanged", ())),
                )
            )
        except ThorError as e:
            msg = (
                str(e) if str(e).startswith("skill ") else f"skill {s['name']!r}: {e}"
            )  # named once
            raise ThorError(f"{source}: {msg}") from None
    try:
        return SkillSet(tuple(skills), source, data.get("max_steps"))
    except ThorError as e:
        raise ThorError(f"{source}: {e}") from None


def load_skills(path) -> SkillSet:
    p = Path(path)
    return skills_from_dict(read_json(p, "skills"), str(p))


def resolve_skills_path(world: World, explicit: str | None) -> Path:
    """--skills wins; then the world's own `skills` entry; then the default manipulation set."""
    if explicit:
        return Path(explicit)
    if world.skills_ref:
        return Path(world.skills_ref)
    return DEFAULT_SKILLS


def load_schema(path) -> dict:
    """A user plan schema: valid JSON Schema (2020-12), checked before anything is generated."""
    from agent.schema.grammar import check_schema

    data = read_json(path, "schema")
    try:
        check_schema(data)
    except ThorError as e:
        raise ThorError(f"{path}: {e}") from None
    return data


def base_plan_schema() -> dict:
    return json.loads(PLAN_SCHEMA.read_text(encoding="utf-8"))
