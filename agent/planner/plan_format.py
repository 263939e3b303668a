"""A fingerprint of the planner's request format: what a planner drafter was trained to predict.

A drafter learns the text the planner makes the target write: the prompt (instructions, goal
examples, world and skills encodings, the repair turn) and the plan document the grammar allows
(schema, key order, compact JSON). When any of that changes, a drafter distilled on the old
format drafts a document that no longer exists and its acceptance collapses, silently. So the
drafter's config records this fingerprint (``calib gen-data`` stamps its data with it,
``calib distill`` copies it), and the runtime compares it at load: a stale drafter still runs when
asked for by name, but ``--spec auto`` declines it and says why.

The fingerprint renders a fixed request (a small world written here, the default skills file, a
fixed task, one repair turn) through the planner's own code and hashes the messages, the
specialized schema and the grammar's options. It therefore moves with any change to the
rendering code, the base schema, the specializer or the grammar options, and with the default
skills file (it is part of every prompt), but not with edits to the sample worlds.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

FORMAT_KEY = "plan_format"

# A small world that exercises the encoding: objects with types, masses and places, one that
# cannot be grasped and has a state, and a robot's workspace and payload.
_WORLD = {
    "name": "format_probe",
    "objects": [
        {
            "name": "red_cup",
            "type": "cup",
            "position": [0.3, 0.1, 0.92],
            "mass_kg": 0.25,
            "at": "counter",
        },
        {
            "name": "wrench",
            "type": "tool",
            "position": [0.2, -0.3, 0.95],
            "mass_kg": 0.5,
            "at": "shelf_a",
        },
        {
            "name": "drawer",
            "type": "drawer",
            "position": [0.2, -0.4, 0.7],
            "mass_kg": 4.0,
            "graspable": False,
            "state": "closed",
        },
    ],
    "places": [
        {"name": "counter", "position": [0.0, 0.0, 0.9]},
        {"name": "shelf_a", "position": [0.3, -0.4, 1.1]},
    ],
    "robot": {
        "workspace": {"min": [-0.6, -0.6, 0.6], "max": [0.6, 0.6, 1.3]},
        "max_payload_kg": 2.0,
    },
}
_TASK = "Put the red cup on shelf A."
_REPAIR = [{"step": 0, "check": "json", "message": "not valid JSON"}]


@lru_cache(maxsize=1)
def plan_format_fingerprint() -> str:
    """-> "sha256:<hex>" of the planner's current request format (see the module docstring)."""
    from agent.files.loader import DEFAULT_SKILLS, load_skills, world_from_dict
    from agent.planner.prompt import build_messages
    from agent.planner.request import specialize_request
    from agent.schema.grammar import _JSON_OPTIONS

    world = world_from_dict(_WORLD, source="<format probe>")
    skills = load_skills(DEFAULT_SKILLS)
    req = specialize_request(_TASK, world, skills)
    first = build_messages(_TASK, world, skills)
    repair = build_messages(_TASK, world, skills, errors=_REPAIR, previous='{"goal":[]}')
    blob = json.dumps(
        {"messages": first, "repair": repair, "schema": req.schema, "grammar": _JSON_OPTIONS},
        sort_keys=True,
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


def stale_reason(recorded: str | None) -> str | None:
    """Why a drafter stamped with ``recorded`` is stale for today's planner; None if it is current.
    The runtime words it (it cannot import this module, so it is handed the fingerprint)."""
    from thor_runtime.speculative import format_stale

    return format_stale(recorded or "", plan_format_fingerprint())
