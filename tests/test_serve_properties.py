"""Property-based (hypothesis): whatever JSON, JSON Schema, world, skill set or bytes reach any
route, the answer is never a 5xx, every error answer carries the OpenAI error body, and the
server answers /health 200 after every request.

The strategies draw mostly near-valid documents (a world with objects, places and a robot; a
chat with messages), so most requests pass the first checks and reach the deeper ones: the
world and skills validation, the grammar compile, the planner, the solver and the safety gate.
The app runs on a loopback port in an event loop of its own thread, so each example is a plain
call that hypothesis can repeat and shrink. ``derandomize``: CI runs the same examples every
time; a failure prints the shrunk request.
"""
from __future__ import annotations

import asyncio
import json
import math
import threading
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_util import config, hosted_loader, is_error_body, passing, wait_health

from thor_app.server.app import make_app

CHAT, PLAN = "/v1/chat/completions", "/v1/plan"
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ---- strategies ---------------------------------------------------------------------------
NAMES = st.sampled_from(["red_cup", "apple", "sink", "table", "shelf_a", "drawer", "red cup", "a", "", "x" * 80])
PLAIN = st.text(max_size=12) | NAMES
SURROGATE = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=2)     # not UTF-8
NUMBER = (st.integers() | st.floats() | st.sampled_from([0, -1, 2 ** 64, 1e308, math.nan, math.inf]))


def rarely(good, bad, one_in: int):
    """``bad`` about one draw in ``one_in`` (st.one_of weighs distinct branches alike, whatever
    repeats them)."""
    return st.sampled_from([False] * (one_in - 1) + [True]).flatmap(lambda b: bad if b else good)


def mostly(good, bad):
    """``good`` about 7 draws in 8: a request must pass its first checks to reach the deeper ones."""
    return rarely(good, bad, 8)


def seldom(good, bad):
    """``bad`` about one draw in 30: for the fields of a world, a dozen of which each may spoil it."""
    return rarely(good, bad, 30)


TEXT = rarely(PLAIN, SURROGATE, 40)      # a body holds many strings: one in 40 bad
ATOM = st.none() | st.booleans() | NUMBER | TEXT
JSON = st.recursive(ATOM, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                    max_leaves=16)


def _schema(inner):
    kinds = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", "what"])
    return st.fixed_dictionaries({}, optional={
        "type": mostly(kinds | st.lists(kinds, max_size=3), JSON),
        "properties": st.dictionaries(TEXT, inner, max_size=3),
        "required": st.lists(TEXT, max_size=3),
        "items": inner,
        "enum": st.lists(ATOM, max_size=3),
        "const": ATOM,
        "anyOf": st.lists(inner, max_size=3),
        "$ref": st.sampled_from(["#", "#/properties/a", "#/$defs/x", "other.json", "http://127.0.0.1/s"]),
        "$defs": st.dictionaries(st.just("x"), inner, max_size=1),
        "minItems": NUMBER, "maxItems": NUMBER, "minLength": NUMBER, "maxLength": NUMBER,
        "minimum": NUMBER, "maximum": NUMBER,
        "pattern": st.sampled_from(["^a+$", "(", "[a-z]{2,}", "\\"]) | TEXT,
        "additionalProperties": st.booleans() | inner,
    })


SCHEMA = st.recursive(st.fixed_dictionaries({}) | st.builds(dict, type=st.sampled_from(["string", "integer"])),
                      _schema, max_leaves=8)
XYZ = seldom(st.lists(st.floats(-1, 1), min_size=3, max_size=3), st.lists(NUMBER, max_size=4) | JSON)
THING, SPOT = st.sampled_from(["red_cup", "apple", "drawer", "tool_1"]), st.sampled_from(["sink", "table", "shelf_a"])
OBJECT = st.fixed_dictionaries(
    {"name": seldom(THING, TEXT), "type": seldom(st.sampled_from(["cup", "fruit", "drawer", "tool"]), TEXT),
     "position": XYZ, "mass_kg": seldom(st.floats(0, 5), NUMBER)},
    optional={"at": seldom(SPOT, JSON), "graspable": seldom(st.booleans(), JSON),
              "state": seldom(st.sampled_from(["open", "closed"]), JSON),
              "aliases": seldom(st.just([]), st.lists(PLAIN, max_size=2) | JSON), "on": rarely(st.nothing(), THING, 30)})
PLACE = st.fixed_dictionaries({"name": TEXT, "position": XYZ}, optional={"aliases": st.lists(TEXT, max_size=2)})
EVERY_SPOT = st.permutations(["sink", "table", "shelf_a"]).map(
    lambda names: [{"name": n, "position": [0.3 * i - 0.3, 0.2, 0.9]} for i, n in enumerate(names)])
ROBOT = st.fixed_dictionaries(
    {"workspace": seldom(st.just({"min": [-1.5, -1.5, -1.5], "max": [1.5, 1.5, 1.5]}),
                         st.fixed_dictionaries({"min": XYZ, "max": XYZ}) | JSON),
     "max_payload_kg": seldom(st.floats(0.1, 5), NUMBER)},
    optional={"at": SPOT})
WORLD = st.fixed_dictionaries(
    {"objects": seldom(st.lists(OBJECT, min_size=1, max_size=4, unique_by=lambda o: o["name"]), JSON),
     "places": seldom(EVERY_SPOT, st.lists(PLACE, max_size=3) | JSON), "robot": ROBOT},
    optional={"name": TEXT, "description": TEXT, "skills": TEXT})
ARG = st.fixed_dictionaries({"type": st.sampled_from(["object", "place", "number", "string", "enum", "?"]) | JSON},
                            optional={"min": NUMBER, "max": NUMBER, "values": st.lists(TEXT, max_size=2) | JSON,
                                      "object_types": st.lists(TEXT, max_size=2), "max_length": NUMBER})
SKILL = st.fixed_dictionaries(
    {"name": NAMES | TEXT, "description": TEXT, "args": st.dictionaries(TEXT, ARG, max_size=3) | JSON},
    optional={"preconditions": st.lists(JSON, max_size=2), "effects": st.lists(JSON, max_size=2),
              "timeout_s": NUMBER})
SKILLS = st.fixed_dictionaries({"skills": st.lists(SKILL, max_size=3) | JSON}, optional={"max_steps": NUMBER}) | JSON

MESSAGE = st.fixed_dictionaries({"role": mostly(st.sampled_from(["user", "system", "assistant", "tool"]), JSON),
                                 "content": mostly(TEXT, JSON)})
CHAT_BODY = st.fixed_dictionaries(
    {"messages": mostly(st.lists(MESSAGE, min_size=1, max_size=3), JSON), "max_tokens": st.integers(1, 4)},
    optional={"seed": NUMBER, "temperature": NUMBER, "top_p": NUMBER, "stop": TEXT | JSON,
              "stream": st.booleans() | JSON, "model": TEXT, "n": mostly(st.just(1), NUMBER), "priority": NUMBER,
              "response_format": st.fixed_dictionaries(
                  {"type": st.sampled_from(["json_schema", "json_object", "text"]) | JSON},
                  optional={"json_schema": st.fixed_dictionaries({"name": TEXT, "schema": SCHEMA | JSON})})})
PLAN_BODY = st.fixed_dictionaries(
    {"task": mostly(st.sampled_from(["put the red cup in the sink", "move the apple to the table", "wave"]),
                     PLAIN | JSON),
     "world": mostly(WORLD, st.sampled_from(["kitchen", "lab_bench", "nowhere", "../kitchen", "kitchen.json"]) | JSON),
     "max_tokens": st.integers(16, 24)},
    optional={"skills": SKILLS | st.sampled_from(["manipulation", "mobile", "none"]), "schema": mostly(SCHEMA, JSON),
              "attempts": mostly(st.integers(0, 1), JSON), "max_steps": mostly(st.integers(1, 8), NUMBER),
              "priority": mostly(st.integers(0, 9), NUMBER)})


def _encoded(doc) -> bytes:
    # a lone surrogate cannot be UTF-8: json.dumps escapes it (``\ud800``), as a client library would
    return json.dumps(doc).encode()


# ---- the server ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def call(tiny_llama_long):
    """call(method, path, data=..., headers=...) -> (status, body bytes), against the app on a
    loopback port served from its own thread's event loop."""
    from aiohttp.test_utils import TestClient, TestServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        cfg = config(limits={"max_tokens": 64, "default_max_tokens": 16, "queue_size": 4}, planner={"max_tokens": 24, "attempts": 1})
        app = make_app(cfg, loader=hosted_loader(tiny_llama_long), selftest=passing, watchdog_s=None)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        await wait_health(client)
        return client

    client = asyncio.run_coroutine_threadsafe(start(), loop).result(300)

    def run(method: str, path: str, **kw) -> tuple[int, bytes]:
        async def go():
            r = await client.request(method, path, **kw)
            return r.status, await r.read()
        return asyncio.run_coroutine_threadsafe(go(), loop).result(300)

    yield run
    asyncio.run_coroutine_threadsafe(client.close(), loop).result(60)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def _answered(call, method: str, path: str, data: bytes | None = None, query: dict | None = None) -> int:
    status, body = call(method, path, data=data, params=query, headers={"Content-Type": "application/json"})
    assert status < 500, (method, path, status, body[:400], (data or b"")[:400])
    if status >= 400:
        assert is_error_body(json.loads(body)), (status, body[:400])
    live, _ = call("GET", "/health")
    assert live == 200, f"/health {live} after {method} {path} {(data or b'')[:400]!r}"
    return status


def test_chat_bodies_give_no_5xx(call):
    seen: Counter = Counter()

    @PROPERTY
    @given(body=CHAT_BODY)
    def chat(body):
        seen[_answered(call, "POST", CHAT, _encoded(body))] += 1

    chat()
    assert seen[200] >= 8, seen               # generations ran, not only the first checks


def test_plan_bodies_with_random_worlds_skills_and_schemas_give_no_5xx(call):
    seen: Counter = Counter()

    @PROPERTY
    @given(body=PLAN_BODY)
    def plan(body):
        seen[_answered(call, "POST", PLAN, _encoded(body))] += 1

    plan()
    # the planner ran (a tiny random model plans nothing valid: 422 with the attempts' report)
    assert seen[200] + seen[422] >= 20, seen


@PROPERTY
@given(path=st.sampled_from([CHAT, PLAN]), doc=JSON)
def test_any_json_at_the_post_routes_gives_no_5xx(call, path, doc):
    _answered(call, "POST", path, _encoded(doc))


@PROPERTY
@given(path=st.sampled_from([CHAT, PLAN, "/health", "/metrics", "/v1/models", "/v1/nothing"]),
       method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]), data=st.binary(max_size=200),
       query=st.dictionaries(st.text("abcxyz_", min_size=1, max_size=5), st.text(max_size=8), max_size=2))
def test_any_bytes_at_any_route_give_no_5xx(call, path, method, data, query):
    _answered(call, method, path, data, query)
