"""Hypothesis strategies for the property-based tests: random JSON, JSON Schemas, worlds, skill
sets and request bodies, mostly near-valid so that most draws pass the first checks and reach
the deeper ones (test_serve_properties.py, test_agent_cli.py)."""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# By default 60 examples a property, the same every run (CI sees what a developer saw); a
# failure prints the shrunk input. THOR_PROPERTY_EXAMPLES=N: N new random examples a property,
# for a longer hunt by hand.
_HUNT = int(os.environ.get("THOR_PROPERTY_EXAMPLES", "0"))
PROPERTY = settings(
    max_examples=_HUNT or 60,
    deadline=None,
    derandomize=not _HUNT,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

NAMES = st.sampled_from(
    ["red_cup", "apple", "sink", "table", "shelf_a", "drawer", "red cup", "a", "", "x" * 80]
)
PLAIN = st.text(max_size=12) | NAMES
SURROGATE = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2)  # not UTF-8
NUMBER = st.integers() | st.floats() | st.sampled_from([0, -1, 2**64, 1e308, math.nan, math.inf])


def rarely(good, bad, one_in: int):
    """``bad`` about one draw in ``one_in`` (st.one_of weighs distinct branches alike, whatever
    repeats them)."""
    return st.sampled_from([False] * (one_in - 1) + [True]).flatmap(lambda b: bad if b else good)


def mostly(good, bad):
    """``good`` about 7 draws in 8: a request must pass its first checks to reach the deeper
    ones."""
    return rarely(good, bad, 8)


def seldom(good, bad):
    """``bad`` about one draw in 30: for the fields of a world, a dozen of which each may spoil
    it."""
    return rarely(good, bad, 30)


TEXT = rarely(PLAIN, SURROGATE, 40)  # a body holds many strings: one in 40 bad
ATOM = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(
    ATOM,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=16,
)


def _schema(inner):
    kinds = st.sampled_from(
        ["object", "array", "string", "integer", "number", "boolean", "null", "what"]
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "type": mostly(kinds | st.lists(kinds, max_size=3), JSON),
            "properties": st.dictionaries(TEXT, inner, max_size=3),
            "required": st.lists(TEXT, max_size=3),
            "items": inner,
            "enum": st.lists(ATOM, max_size=3),
            "const": ATOM,
            "anyOf": st.lists(inner, max_size=3),
            "$ref": st.sampled_from(
                ["#", "#/properties/a", "#/$defs/x", "other.json", "http://127.0.0.1/s"]
            ),
            "$defs": st.dictionaries(st.just("x"), inner, max_size=1),
            "minItems": NUMBER,
            "maxItems": NUMBER,
            "minLength": NUMBER,
            "maxLength": NUMBER,
            "minimum": NUMBER,
            "maximum": NUMBER,
            "pattern": st.sampled_from(["^a+$", "(", "[a-z]{2,}", "\\"]) | TEXT,
            "additionalProperties": st.booleans() | inner,
        },
    )


SCHEMA = st.recursive(
    st.fixed_dictionaries({}) | st.builds(dict, type=st.sampled_from(["string", "integer"])),
    _schema,
    max_leaves=8,
)
XYZ = seldom(
    st.lists(st.floats(-1, 1), min_size=3, max_size=3), st.lists(NUMBER, max_size=4) | JSON
)
THING, SPOT = (
    st.sampled_from(["red_cup", "apple", "drawer", "tool_1"]),
    st.sampled_from(["sink", "table", "shelf_a"]),
)
OBJECT = st.fixed_dictionaries(
    {
        "name": seldom(THING, TEXT),
        "type": seldom(st.sampled_from(["cup", "fruit", "drawer", "tool"]), TEXT),
        "position": XYZ,
        "mass_kg": seldom(st.floats(0, 5), NUMBER),
    },
    optional={
        "at": seldom(SPOT, JSON),
        "graspable": seldom(st.booleans(), JSON),
        "state": seldom(st.sampled_from(["open", "closed"]), JSON),
        "aliases": seldom(st.just([]), st.lists(PLAIN, max_size=2) | JSON),
        "on": rarely(st.nothing(), THING, 30),
    },
)
PLACE = st.fixed_dictionaries(
    {"name": TEXT, "position": XYZ}, optional={"aliases": st.lists(TEXT, max_size=2)}
)
EVERY_SPOT = st.permutations(["sink", "table", "shelf_a"]).map(
    lambda names: [{"name": n, "position": [0.3 * i - 0.3, 0.2, 0.9]} for i, n in enumerate(names)]
)
ROBOT = st.fixed_dictionaries(
    {
        "workspace": seldom(
            st.just({"min": [-1.5, -1.5, -1.5], "max": [1.5, 1.5, 1.5]}),
            st.fixed_dictionaries({"min": XYZ, "max": XYZ}) | JSON,
        ),
        "max_payload_kg": seldom(st.floats(0.1, 5), NUMBER),
    },
    optional={"at": SPOT},
)
WORLD = st.fixed_dictionaries(
    {
        "objects": seldom(
            st.lists(OBJECT, min_size=1, max_size=4, unique_by=lambda o: o["name"]), JSON
        ),
        "places": seldom(EVERY_SPOT, st.lists(PLACE, max_size=3) | JSON),
        "robot": ROBOT,
    },
    optional={"name": TEXT, "description": TEXT, "skills": TEXT},
)
ARG = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "place", "number", "string", "enum", "?"]) | JSON},
    optional={
        "min": NUMBER,
        "max": NUMBER,
        "values": st.lists(TEXT, max_size=2) | JSON,
        "object_types": st.lists(TEXT, max_size=2),
        "max_length": NUMBER,
    },
)
SKILL = st.fixed_dictionaries(
    {
        "name": NAMES | TEXT,
        "description": TEXT,
        "args": st.dictionaries(TEXT, ARG, max_size=3) | JSON,
    },
    optional={
        "preconditions": st.lists(JSON, max_size=2),
        "effects": st.lists(JSON, max_size=2),
        "timeout_s": NUMBER,
    },
)
SKILLS = (
    st.fixed_dictionaries(
        {"skills": st.lists(SKILL, max_size=3) | JSON}, optional={"max_steps": NUMBER}
    )
    | JSON
)

MESSAGE = st.fixed_dictionaries(
    {
        "role": mostly(st.sampled_from(["user", "system", "assistant", "tool"]), JSON),
        "content": mostly(TEXT, JSON),
    }
)
CHAT_BODY = st.fixed_dictionaries(
    {
        "messages": mostly(st.lists(MESSAGE, min_size=1, max_size=3), JSON),
        "max_tokens": st.integers(1, 4),
    },
    optional={
        "seed": NUMBER,
        "temperature": NUMBER,
        "top_p": NUMBER,
        "stop": TEXT | JSON,
        "stream": st.booleans() | JSON,
        "model": TEXT,
        "n": mostly(st.just(1), NUMBER),
        "priority": NUMBER,
        "response_format": st.fixed_dictionaries(
            {"type": st.sampled_from(["json_schema", "json_object", "text"]) | JSON},
            optional={
                "json_schema": st.fixed_dictionaries({"name": TEXT, "schema": SCHEMA | JSON})
            },
        ),
    },
)
PLAN_BODY = st.fixed_dictionaries(
    {
        "task": mostly(
            st.sampled_from(["put the red cup in the sink", "move the apple to the table", "wave"]),
            PLAIN | JSON,
        ),
        "world": mostly(
            WORLD,
            st.sampled_from(["kitchen", "lab_bench", "nowhere", "../kitchen", "kitchen.json"])
            | JSON,
        ),
        "max_tokens": st.integers(16, 24),
    },
    optional={
        "skills": SKILLS | st.sampled_from(["manipulation", "mobile", "none"]),
        "schema": mostly(SCHEMA, JSON),
        "attempts": mostly(st.integers(0, 1), JSON),
        "max_steps": mostly(st.integers(1, 8), NUMBER),
        "priority": mostly(st.integers(0, 9), NUMBER),
    },
)
