"""No input gives a 5xx: the bodies that once reached a 500 get a 400 with the OpenAI error
body, before they take a queue slot (random inputs at every route: test_serve_properties.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.serving import config, hosted_loader, is_error_body, passing, wait_health
from thor_app.server.app import STATE, make_app

MSG = [{"role": "user", "content": "pick up the red cup"}]
CHAT, PLAN = "/v1/chat/completions", "/v1/plan"


def nested_schema(levels: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}}
    return s


def schema_chat(schema) -> dict:
    return {
        "messages": MSG,
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


@pytest.fixture
def client(aiohttp_client, tiny_llama):
    async def go():
        app = make_app(
            config(), loader=hosted_loader(tiny_llama), selftest=passing, watchdog_s=None
        )
        c = await aiohttp_client(app)
        assert (await wait_health(c))[0] == 200
        return c, app[STATE]

    return go


# The body is sent as raw bytes: json.dumps writes "\ud800" as the escape, as a client would.
CASES = [
    (
        "seed past 2**64",
        CHAT,
        json.dumps({"messages": MSG, "seed": 2**64, "temperature": 1.0}),
        "seed",
    ),
    (
        "a lone surrogate in a plan task",
        PLAN,
        json.dumps({"task": "pick \ud800", "world": "kitchen"}),
        "Unicode",
    ),
    (
        "a lone surrogate in a chat message",
        CHAT,
        json.dumps({"messages": [{"role": "user", "content": "\udfff"}]}),
        "Unicode",
    ),
    ("990 nested arrays", CHAT, "[" * 990 + "]" * 990, "nests deeper"),
    ("5000 nested arrays", PLAN, "[" * 5000, "nests deeper"),
    (
        "a schema nested 150 levels",
        CHAT,
        json.dumps(schema_chat(nested_schema(150))),
        "nests deeper",
    ),
    (
        "a schema nested 40 levels (within the body's limit)",
        CHAT,
        json.dumps(schema_chat(nested_schema(40))),
        "nests deeper",
    ),
    (
        "a plan schema nested 40 levels",
        PLAN,
        json.dumps({"task": "x", "world": "kitchen", "schema": nested_schema(40)}),
        "nests deeper",
    ),
    ("an enum of a lone surrogate", CHAT, json.dumps(schema_chat({"enum": ["\ud800"]})), "Unicode"),
    (
        "a message role that is a list",
        CHAT,
        json.dumps({"messages": [{"role": [], "content": "hi"}]}),
        "role",
    ),
    (
        "a key that is a lone surrogate",
        PLAN,
        json.dumps({"task": "x", "world": "kitchen", "\ud800": 1}),
        "Unicode",
    ),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("name, route, body, words", CASES, ids=[c[0] for c in CASES])
async def test_inputs_that_were_500_are_400_before_queueing(client, name, route, body, words):
    c, st = await client()
    r = await c.post(route, data=body.encode(), headers={"Content-Type": "application/json"})
    got = await r.json()
    assert r.status == 400 and is_error_body(got), (r.status, got)
    assert words in got["error"]["message"]
    # refused on the loop: the worker never saw it
    assert st.jobs.completed == 0 and not st.jobs.cancelled


def test_the_runtime_refuses_a_seed_it_cannot_take():
    from thor_runtime.engine.sampling import make_generator
    from thor_runtime.errors import ThorError

    make_generator(2**64 - 1)
    with pytest.raises(ThorError, match="seed"):
        make_generator(2**64)


@pytest.mark.asyncio
async def test_a_tiny_temperature_is_answered_like_greedy(client):
    """1e-259 is inside [0, 2]; logit / t once overflowed and the sampler's NaN was a 500."""
    c, _ = await client()
    texts = []
    for t in (1e-259, 0.0):
        r = await c.post(CHAT, json={"messages": MSG, "max_tokens": 6, "temperature": t, "seed": 1})
        assert r.status == 200, await r.text()
        texts.append((await r.json())["choices"][0]["message"]["content"])
    assert texts[0] == texts[1]
