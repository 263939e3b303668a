"""Calibration / distillation prompts: randomized robot-planning requests plus general instructions.

Why synthetic: the drafter and the FP8 scales should see what the robot actually asks the
target — the planner's system prompt (agent.planner.prompt.build_messages) with a world, a skill
list and a task — but with far more variety than the three sample worlds. Each prompt is built from
its own ``random.Random`` seeded by (split, seed, index), so a prompt never depends on how many
came before it and any subset can be regenerated exactly.

Splits are disjoint by construction, not by luck: a candidate belongs to ``heldout`` iff the
sha256 of its rendered messages falls in the held-out bucket (1 in ``HELDOUT_MOD``); the
generator for a split simply skips candidates that hash into the other split. Two different
seed streams plus this content rule mean heldout text is never trained on, even when the
random choices happen to coincide.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from agent.files.loader import AGENT_DIR, SkillSet, World, skills_from_dict, world_from_dict
from agent.planner.prompt import build_messages
from thor_runtime.errors import ThorError

SPLITS = ("train", "heldout")
HELDOUT_MOD = 8  # 1 in 8 candidate prompts is held out
GENERAL_FILE = Path(__file__).resolve().parent / "general_instructions.json"
# Separate seed streams per split (the content hash is what guarantees disjointness).
_STREAM = {"train": 0x7A11, "heldout": 0x4E1D}

# Renames per object type: the model must copy names from the world, so varying them keeps the
# drafter from memorizing the three sample worlds' vocabulary.
NAME_VOCAB = {
    "cup": ["red_cup", "green_cup", "blue_mug", "white_mug", "paper_cup", "tea_cup"],
    "plate": ["plate", "dinner_plate", "blue_plate", "saucer"],
    "fruit": ["apple", "orange", "banana", "pear", "lemon"],
    "kettle": ["kettle", "steel_kettle", "teapot"],
    "pan": ["cast_iron_pan", "frying_pan", "sauce_pan", "wok"],
    "drawer": ["drawer", "top_drawer", "cutlery_drawer"],
    "jar": ["spice_jar", "honey_jar", "salt_jar", "jam_jar"],
    "tube": ["test_tube", "sample_tube", "vial"],
    "beaker": ["beaker", "flask", "glass_beaker"],
    "pipette": ["pipette", "dropper"],
    "rack": ["sample_rack", "tube_rack"],
    "bottle": ["reagent_bottle", "water_bottle", "buffer_bottle"],
    "lid": ["centrifuge_lid", "incubator_lid"],
    "box": ["box_a", "box_b", "box_c", "crate", "carton"],
    "tote": ["tote_small", "tote_large", "blue_tote"],
    "pallet": ["pallet_1", "pallet_2", "pallet_3"],
    "barrel": ["barrel", "oil_drum", "water_barrel"],
}
PLACE_VOCAB = {
    "kitchen": [
        "counter",
        "sink",
        "dish_rack",
        "table",
        "top_shelf",
        "stove",
        "fridge_shelf",
        "island",
    ],
    "lab_bench": [
        "tray",
        "rack_slot_1",
        "rack_slot_2",
        "centrifuge",
        "scale",
        "waste_bin",
        "fume_hood",
    ],
    "warehouse": [
        "dock_1",
        "dock_2",
        "aisle_3",
        "aisle_7",
        "shelf_b2",
        "staging_area",
        "charging_station",
        "mezzanine",
        "packing_zone",
    ],
}
WORLD_NAMES = {
    "kitchen": ["kitchen", "home_kitchen", "cafe_counter"],
    "lab_bench": ["lab_bench", "wet_lab", "qc_bench"],
    "warehouse": ["warehouse", "hall_b", "depot"],
}

# {o}, {o2}: objects; {p}, {p2}: places; {n}: a number. Arm and mobile worlds share most verbs.
TASK_TEMPLATES = [
    "pick up the {o} and place it on the {p}",
    "put the {o} on the {p}",
    "move the {o} to the {p}",
    "take the {o} to the {p}",
    "grab the {o} and drop it at the {p}",
    "bring the {o} over to the {p}",
    "place the {o} at the {p}, then the {o2} at the {p2}",
    "swap the places of the {o} and the {o2}",
    "stack the {o} next to the {o2} on the {p}",
    "sort the {o} and the {o2}: light one to the {p}, heavy one to the {p2}",
    "clear the {p}: move everything you can to the {p2}",
    "hand the {o} over at the {p}",
    "open the {o}",
    "close the {o}",
    "open the {o}, put the {o2} away at the {p}, then close it",
    "pour the {o} into the {o2}",
    "wait {n} seconds, then move the {o} to the {p}",
    "tidy up: return the {o} to the {p}",
    "collect the {o} and the {o2} at the {p}",
    "inspect the {p} and then pick up the {o}",
    "carry the {o} to the {p} and come back",
    "move the gripper above the {o}",
    "lift the {o} and hold it",
    "put the {o} back where it was",
    "deliver the {o} to the {p} as fast as possible",
    "first the {o2}, then the {o}: both to the {p}",
    "Please move the {o} from where it is to the {p}.",
    "Can you put the {o} onto the {p}?",
    "I need the {o} at the {p}.",
    "Relocate {o} -> {p}.",
    "push the {o} towards the {p}",
    "fetch the {o} from wherever it is and leave it at the {p}",
    "the {o} belongs at the {p}, sort that out",
    "get the {o} and the {o2} over to the {p}",
    "could you check the {p}, then bring me the {o}?",
    "drop off the {o} at the {p} on your way",
]
CONSTRAINTS = [
    "",
    "",
    "",
    "",
    " and avoid the {p2}",
    ", do it gently",
    " in under {n} s",
    ", keep it upright",
    " without touching the {o2}",
    ", slowly",
    " and then wait",
    ", grasp it from the side",
    ", use a top grasp",
    " and report when done",
    ", carefully",
    " while staying clear of the {p2}",
]


@dataclass(frozen=True)
class PromptSpec:
    """Validated request for a prompt set (what `thor calib` commands pass around)."""

    split: str
    n: int
    seed: int = 0
    general_frac: float = 0.1  # share of general instructions mixed into a calibration set
    # a request log (calib/request_log.py): the robots' own requests instead of generated ones
    from_log: str = ""

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ThorError(f"unknown split {self.split!r}; choose one of {', '.join(SPLITS)}")
        if self.n < 0:
            raise ThorError(f"number of prompts must be >= 0, got {self.n}")
        if not 0.0 <= self.general_frac <= 1.0:
            raise ThorError(f"general_frac must be in [0, 1], got {self.general_frac}")
        if self.from_log and not Path(self.from_log).is_dir():  # before a model loads
            raise ThorError(f"no request log at {self.from_log}")


DOMAIN_FILE = Path(__file__).resolve().parent / "domains.json"
ALIAS_SHARE = 0.3  # share of mentions of a thing with aliases that use one
SAMPLE_SHARE = 0.4  # share of requests set in a sample world (the rest: a domain)
# People write "the seed tray", not "the seed_tray": the share of mentions in a task that spell
# a name as words. With none, the drafter never saw a task copied into "task" as words, and on
# unseen worlds it missed at nearly every word of it.
SPOKEN_SHARE = 0.7
# Share of requests whose objects and places get invented names (pseudo-words): names no model
# has memorized, so a drafter must copy them from its window rather than recall a vocabulary.
INVENTED_SHARE = 0.3
_ONSETS = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gl",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "pl",
    "qu",
    "r",
    "s",
    "sk",
    "st",
    "t",
    "tr",
    "v",
    "w",
    "z",
)
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "l", "x", "m", "sk")
_RARE = ("kv", "zv", "qv", "xh")  # onsets no English word has: an invented word is never a real one


@dataclass(frozen=True)
class _Base:
    """A setting requests are drawn from: its world and skills (dicts) and the names a drawn
    world may give its objects (per type), places and itself."""

    world: dict
    skills: dict
    rename: dict
    places: list
    world_names: list


def _skills(name: str) -> dict:
    return json.loads((AGENT_DIR / "skills" / f"{name}.json").read_text(encoding="utf-8"))


def _sample_bases() -> list[_Base]:
    """The sample worlds, renamed from NAME_VOCAB / PLACE_VOCAB / WORLD_NAMES."""
    out = []
    for wp in sorted((AGENT_DIR / "worlds").glob("*.json")):
        w = json.loads(wp.read_text(encoding="utf-8"))
        sp = (wp.parent / w.get("skills", "../skills/manipulation.json")).resolve()
        out.append(
            _Base(
                w,
                json.loads(sp.read_text(encoding="utf-8")),
                NAME_VOCAB,
                PLACE_VOCAB.get(w["name"], [p["name"] for p in w["places"]]),
                WORLD_NAMES.get(w["name"], [w["name"]]),
            )
        )
    if not out:
        raise ThorError(f"no sample worlds under {AGENT_DIR / 'worlds'}")
    return out


def _domain_bases() -> list[_Base]:
    """The training-only settings of domains.json: other trades, the tabletop skills, aliases,
    so a drafter learns to copy names it has never seen rather than the sample worlds' own."""
    try:
        doc = json.loads(DOMAIN_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ThorError(f"cannot read {DOMAIN_FILE}: {e}") from None
    out = []
    try:
        for d in doc["domains"]:
            w = {
                k: v
                for k, v in d.items()
                if k not in ("skills", "rename", "place_names", "world_names")
            }
            out.append(
                _Base(w, _skills(d["skills"]), d["rename"], d["place_names"], d["world_names"])
            )
    except (KeyError, TypeError, AttributeError, OSError) as e:
        raise ThorError(
            f"{DOMAIN_FILE}: a domain lacks a field or names no skills file ({e!r})"
        ) from None
    return out


def training_names(samples: bool = True) -> set[str]:
    """Every world, object and place name a generated request can carry (the evaluation sets
    must use none of them); samples=False: the domains' alone."""
    names: set[str] = set()
    for b in (_sample_bases() if samples else []) + _domain_bases():
        names |= {b.world["name"], *b.world_names, *b.places}
        names |= {o["name"] for o in b.world["objects"]} | {p["name"] for p in b.world["places"]}
        names |= {n for v in b.rename.values() for n in v}
    return names


def _r2(x: float) -> float:
    return round(x, 2)


def _random_world(rng: random.Random, b: _Base) -> dict:
    """Object subset (>= 2), renamed from the base's names, positions jittered inside the
    workspace, masses scaled 0.5x..1.5x; place subset (>= 2) with some renamed and jittered.
    A renamed thing drops its aliases (they belonged to the old name)."""
    w = copy.deepcopy(b.world)
    lo, hi = w["robot"]["workspace"]["min"], w["robot"]["workspace"]["max"]
    span = [h - low for low, h in zip(lo, hi)]
    used: set[str] = set()

    def fresh(cands: list[str], default: str, pool: list[str] = ()) -> str:
        free = (
            [c for c in cands if c not in used]
            or [c for c in pool if c not in used]
            or [f"{default}_{len(used)}"]
        )
        name = rng.choice(free)
        used.add(name)
        return name

    objs = rng.sample(w["objects"], rng.randint(min(2, len(w["objects"])), len(w["objects"])))
    for o in objs:
        old = o["name"]
        o["name"] = fresh(b.rename.get(o["type"], [o["name"]]), o["name"])
        if o["name"] != old:
            o.pop("aliases", None)
        # jitter by up to 15% of the workspace span, clamped inside it (z kept for shelves etc.)
        o["position"] = [
            _r2(min(h, max(low, p + rng.uniform(-0.15, 0.15) * s)))
            for p, low, h, s in zip(o["position"], lo, hi, span)
        ]
        o["mass_kg"] = _r2(max(0.01, o["mass_kg"] * rng.uniform(0.5, 1.5)))
    w["objects"] = objs
    places = rng.sample(w["places"], rng.randint(min(2, len(w["places"])), len(w["places"])))
    renamed = {}
    for p in places:
        old = p["name"]
        p["name"] = renamed[old] = fresh(
            b.places if rng.random() < 0.5 else [p["name"]], p["name"], b.places
        )
        if p["name"] != old:
            p.pop("aliases", None)
        p["position"] = [
            _r2(min(h, max(low, v + rng.uniform(-0.1, 0.1) * s)))
            for v, low, h, s in zip(p["position"], lo, hi, span)
        ]
    w["places"] = places
    _follow_places(w, renamed)
    w["name"] = rng.choice(b.world_names)
    w["robot"]["max_payload_kg"] = _r2(w["robot"]["max_payload_kg"] * rng.uniform(0.8, 1.25))
    return w


def _follow_places(w: dict, renamed: dict) -> None:
    """An initial `at` follows its place's new name (``renamed``: old -> new, every place kept),
    or goes with a place left out."""
    for holder in w["objects"] + [w["robot"]]:
        if "at" in holder:
            if holder["at"] in renamed:
                holder["at"] = renamed[holder["at"]]
            else:
                holder.pop("at")


def invented_word(rng: random.Random) -> str:
    """A pronounceable word of two or three syllables, one of them with an onset no English word
    has, so it is never a real word (tests/calib/test_calib.py checks the evaluation sets'
    names)."""
    n = rng.choice((2, 2, 3))
    rare = rng.randrange(1, n)
    return "".join(
        rng.choice(_RARE if i == rare else _ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
        for i in range(n)
    )


def _invent_names(rng: random.Random, w: dict) -> None:
    """Gives every object and place of ``w`` an invented name (one or two words), drops their
    aliases and moves the initial `at`s along (every `at` names a place of ``w`` by now)."""
    used: set[str] = set()

    def new() -> str:
        while True:
            name = "_".join(invented_word(rng) for _ in range(rng.choice((1, 2))))
            if name not in used:
                used.add(name)
                return name

    renamed = {}
    for kind in ("objects", "places"):
        for t in w[kind]:
            old, t["name"] = t["name"], new()
            if kind == "places":
                renamed[old] = t["name"]
            t.pop("aliases", None)
    _follow_places(w, renamed)


def _random_task(rng: random.Random, world: dict) -> str:
    """A task from the templates; a thing that has aliases is sometimes called by one, as
    people on site do ("the cone"), and a name is mostly said as words ("the seed tray")."""

    def called(thing: dict) -> str:
        name = (
            rng.choice(thing["aliases"])
            if thing.get("aliases") and rng.random() < ALIAS_SHARE
            else thing["name"]
        )
        return name.replace("_", " ") if rng.random() < SPOKEN_SHARE else name

    objs, places = world["objects"], world["places"]
    o, o2 = rng.sample(objs, 2) if len(objs) >= 2 else (objs[0], objs[0])
    p, p2 = rng.sample(places, 2) if len(places) >= 2 else (places[0], places[0])
    fill = dict(
        o=called(o),
        o2=called(o2),
        p=called(p),
        p2=called(p2),
        n=rng.choice([5, 10, 15, 20, 30, 45, 60]),
    )
    task = rng.choice(TASK_TEMPLATES).format(**fill) + rng.choice(CONSTRAINTS).format(**fill)
    return task[0].upper() + task[1:] if rng.random() < 0.3 else task


def _key(messages: list[dict]) -> bytes:
    return hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()


def split_of(messages: list[dict]) -> str:
    """The split a prompt belongs to, from its content alone."""
    return "heldout" if int.from_bytes(_key(messages)[:8], "big") % HELDOUT_MOD == 0 else "train"


@dataclass(frozen=True)
class RobotRequest:
    """One planner request: the chat messages plus what the planner's grammar is built from."""

    messages: list
    task: str
    world: World
    skills: SkillSet


def robot_requests(split: str, n: int, seed: int = 0) -> list[RobotRequest]:
    """n planner requests for ``split``; the same (split, n, seed) gives the same list, and
    robot_requests(s, n) is a prefix of robot_requests(s, n + m)."""
    PromptSpec(split, n, seed)
    samples, domains = _sample_bases(), _domain_bases()
    out: list[RobotRequest] = []
    i = 0
    while len(out) < n:
        rng = random.Random(f"{_STREAM[split]}:{seed}:{i}")  # str seeds hash deterministically
        i += 1
        b = rng.choice(samples if rng.random() < SAMPLE_SHARE else domains)
        wd = _random_world(rng, b)
        if rng.random() < INVENTED_SHARE:
            _invent_names(rng, wd)
        task, world, skill_set = (
            _random_task(rng, wd),
            world_from_dict(wd),
            skills_from_dict(b.skills),
        )
        msgs = build_messages(task, world, skill_set)
        if split_of(msgs) == split:
            out.append(RobotRequest(msgs, task, world, skill_set))
    return out


def robot_prompts(split: str, n: int, seed: int = 0) -> list[list[dict]]:
    return [r.messages for r in robot_requests(split, n, seed)]


def general_instructions() -> list[str]:
    try:
        doc = json.loads(GENERAL_FILE.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ThorError(f"cannot read {GENERAL_FILE}: {e}") from None
    items = doc.get("instructions") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not all(isinstance(s, str) and s for s in items):
        raise ThorError(f'{GENERAL_FILE}: expected {{"instructions": [non-empty strings]}}')
    return items


def general_prompts(split: str) -> list[list[dict]]:
    """The general instruction set's share of ``split`` (content-hash split, as above)."""
    PromptSpec(split, 0)
    msgs = [[{"role": "user", "content": s}] for s in general_instructions()]
    return [m for m in msgs if split_of(m) == split]


def calib_items(spec: PromptSpec) -> list[tuple[list[dict], RobotRequest | None]]:
    """A calibration set: robot requests with a general instruction (no request: nothing to
    constrain) in every round(1/frac)-th slot while the general set lasts. Slot i's kind
    depends on i alone, so the set for n is a prefix of the set for any larger n (gen-data can
    be extended and resumed by index). A spec ``from_log`` is read by calib/fleet.py instead."""
    gen = general_prompts(spec.split)
    random.Random(f"general:{spec.seed}").shuffle(gen)
    every = round(1 / spec.general_frac) if spec.general_frac > 0 else 0
    kinds = [
        bool(every) and i % every == every - 1 and i // every < len(gen) for i in range(spec.n)
    ]
    robot = iter(robot_requests(spec.split, kinds.count(False), spec.seed))
    items = []
    for i, k in enumerate(kinds):
        req = None if k else next(robot)
        items.append((gen[i // every] if k else req.messages, req))
    return items


def calib_prompts(spec: PromptSpec) -> list[list[dict]]:
    return [m for m, _ in calib_items(spec)]


def render_key(messages: list[dict]) -> str:
    """One string per prompt, for prompt_set_sha256 and resume bookkeeping."""
    return json.dumps(messages, sort_keys=True, ensure_ascii=False)
