"""Requests from the fleet: the request log (calib/request_log.py) read back as RobotRequests for
`thor calib gen-data --from-log DIR`.

- De-duplicated: the same world document, skill set and task (case and spacing aside) is one
  request, however often robots asked it; the oldest record stands for it.
- Split by world: a request is held out iff its world is, decided from the world's identity
  alone (its name and the names of its objects and places: the same site with things moved is
  the same world), 1 in ``HELDOUT_MOD`` as the generated prompts (calib/prompts.py). A held-out
  request therefore never shares a world with a training one, however the log grows.

The labels are the target's own greedy answers, made by gen-data as for generated prompts; the
logged response stays in the log (what the robot got at the time), not in the data.
"""

from __future__ import annotations

import hashlib
import json

from agent.files.loader import skills_from_dict, world_from_dict
from agent.planner.prompt import build_messages
from thor_runtime.errors import ThorError

from .prompts import HELDOUT_MOD, SPLITS, PromptSpec, RobotRequest
from .request_log import doc_hash, read_log


def world_key(world: dict) -> str:
    """What makes a world the same world for the split: its name and its things' names."""
    names = {
        "name": world.get("name", ""),
        "objects": sorted(o.get("name", "") for o in world.get("objects", ())),
        "places": sorted(p.get("name", "") for p in world.get("places", ())),
    }
    return hashlib.sha256(json.dumps(names, sort_keys=True).encode("utf-8")).hexdigest()


def world_split(world: dict) -> str:
    """The split every request in ``world`` belongs to."""
    return "heldout" if int(world_key(world)[:16], 16) % HELDOUT_MOD == 0 else "train"


def task_key(task: str) -> str:
    return " ".join(task.split()).casefold()


def fleet_requests(directory, split: str, n: int | None = None) -> list[RobotRequest]:
    """The logged requests of ``split`` in ``directory``, de-duplicated, oldest first (the
    first ``n``). A record whose world or skills no longer load is left out, as the planner
    would refuse it."""
    if split not in SPLITS:
        raise ThorError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    logged, _ = read_log(directory)
    seen, loaded, out = set(), {}, []
    counts = dict.fromkeys(SPLITS, 0)
    for item in logged:
        w, s = doc_hash(item.world), doc_hash(item.skills)
        key = (w, s, task_key(item.task))
        if key in seen or not item.task.strip():
            continue
        seen.add(key)
        counts[world_split(item.world)] += 1
        if world_split(item.world) != split or (n is not None and len(out) >= n):
            continue
        try:
            world = loaded.get(w) or world_from_dict(item.world, f"logged world {w[:12]}")
            skills = loaded.get(s) or skills_from_dict(item.skills, f"logged skills {s[:12]}")
        except ThorError:
            continue
        loaded[w], loaded[s] = world, skills
        out.append(RobotRequest(build_messages(item.task, world, skills), item.task, world, skills))
    if not out:
        raise ThorError(
            f"{directory}: no logged requests in the {split} split "
            f"({counts['train']} train, {counts['heldout']} held out)"
        )
    return out


def fleet_items(spec: PromptSpec) -> list[tuple[list[dict], RobotRequest]]:
    """A calibration set of logged requests (``spec.from_log``), as calib_items gives generated
    ones: the split's requests alone (no general instructions), at most ``spec.n``."""
    return [(r.messages, r) for r in fleet_requests(spec.from_log, spec.split, spec.n)]
