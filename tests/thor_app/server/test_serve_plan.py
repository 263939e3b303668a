"""POST /v1/plan answers what `thor plan --json` prints (and 422 with the report when no plan
is valid); the official `openai` client works against /v1/chat/completions unchanged."""

from __future__ import annotations

import json

import pytest

from tests.helpers.serving import (
    config,
    direct_plan,
    hosted_loader,
    is_error_body,
    passing,
    wait_health,
)
from thor_app.server.app import make_app

pytestmark = pytest.mark.asyncio
KITCHEN_TASK = "put the red cup in the sink"
COLOR = {
    "type": "object",
    "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["color"],
    "additionalProperties": False,
}


@pytest.fixture
def start(aiohttp_client):
    async def go(loaded, **tables):
        app = make_app(
            config(**tables), loader=hosted_loader(loaded), selftest=passing, watchdog_s=None
        )
        client = await aiohttp_client(app)
        status, body = await wait_health(client)
        assert status == 200, body
        return client

    return go


def same_plan_document(body: dict, res) -> None:
    assert set(body) >= {"plan", "valid", "report", "stats"}
    assert body["plan"] == res.plan and body["valid"] == res.valid and body["report"] == res.report
    assert set(body["stats"]) == set(res.stats)
    for k in ("generated_tokens", "prompt_tokens", "attempts", "spec", "drafted", "accepted"):
        assert body["stats"][k] == res.stats[k], k


async def test_no_valid_plan_is_422_with_the_report_as_thor_plan_json(start, tiny_llama_long):
    client = await start(tiny_llama_long)
    r = await client.post(
        "/v1/plan", json={"task": KITCHEN_TASK, "world": "kitchen", "max_tokens": 24, "attempts": 1}
    )
    body = await r.json()
    want = direct_plan(tiny_llama_long, KITCHEN_TASK, "kitchen", 24, 1)
    assert not want.valid and r.status == 422
    assert is_error_body(body) and body["error"]["code"] == "no_valid_plan" and body["report"]
    same_plan_document(body, want)


async def test_inline_world_and_skills_plan_like_the_named_ones(start, tiny_llama_long):
    from agent.files.loader import AGENT_DIR

    client = await start(tiny_llama_long)
    world = json.loads((AGENT_DIR / "worlds" / "kitchen.json").read_text())
    skills = json.loads((AGENT_DIR / "skills" / "manipulation.json").read_text())
    by_name = await (
        await client.post(
            "/v1/plan",
            json={"task": KITCHEN_TASK, "world": "kitchen", "max_tokens": 16, "attempts": 0},
        )
    ).json()
    inline = await (
        await client.post(
            "/v1/plan",
            json={
                "task": KITCHEN_TASK,
                "world": world,
                "skills": skills,
                "max_tokens": 16,
                "attempts": 0,
            },
        )
    ).json()
    assert (
        inline["report"] == by_name["report"]
        and inline["stats"]["generated_tokens"] == by_name["stats"]["generated_tokens"]
    )


@pytest.mark.parametrize(
    "body, words",
    [
        ({"world": "kitchen"}, "task"),
        ({"task": " ", "world": "kitchen"}, "task"),
        ({"task": "x", "world": 3}, "world"),
        ({"task": "x", "world": "no_such_world"}, "no world named"),
        ({"task": "x", "world": "../worlds/kitchen"}, "not a plain name"),
        ({"task": "x", "world": "/etc/passwd"}, "not a plain name"),
        ({"task": "x", "world": {"objects": []}}, "request world"),
        ({"task": "x", "world": "kitchen", "skills": "nope"}, "no skills named"),
        ({"task": "x", "world": "kitchen", "skills": 5}, "skills must be"),
        ({"task": "x", "world": "kitchen", "attempts": 99}, "attempts"),
        ({"task": "x", "world": "kitchen", "max_tokens": 8}, "max_tokens"),
        ({"task": "x", "world": "kitchen", "max_tokens": "many"}, "max_tokens"),
        (
            {"task": "x", "world": "kitchen", "schema": {"type": "array", "uniqueItems": True}},
            "uniqueItems",
        ),
        ({"task": "x", "world": "kitchen", "schema": []}, "schema"),
    ],
)
async def test_bad_plan_requests_are_400(start, tiny_llama_long, body, words):
    client = await start(tiny_llama_long)
    r = await client.post("/v1/plan", json=body)
    err = await r.json()
    assert r.status == 400 and is_error_body(err) and words in err["error"]["message"], err


async def test_openai_client_chat_stream_and_json_schema(start, tiny_llama, tmp_path):
    openai = pytest.importorskip("openai")
    keys = tmp_path / "keys"
    keys.write_text("sk-local-0123456789abcdef\n")
    client = await start(tiny_llama, auth={"api_keys_file": str(keys)})
    oc = openai.AsyncOpenAI(
        base_url=str(client.make_url("/v1")), api_key="sk-local-0123456789abcdef", max_retries=0
    )
    msgs = [
        {"role": "system", "content": "You are a robot."},
        {"role": "user", "content": "pick up the cup"},
    ]
    models = await oc.models.list()
    assert [m.id for m in models.data] == ["default"]
    done = await oc.chat.completions.create(model="default", messages=msgs, max_tokens=12, seed=3)
    assert (
        done.choices[0].finish_reason in ("stop", "length") and done.usage.completion_tokens <= 12
    )
    stream = await oc.chat.completions.create(
        model="default",
        messages=msgs,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(parts) == done.choices[0].message.content and usage == done.usage
    fmt = {"type": "json_schema", "json_schema": {"name": "color", "schema": COLOR, "strict": True}}
    out = await oc.chat.completions.create(
        model="default", messages=msgs, max_tokens=30, response_format=fmt
    )
    assert json.loads(out.choices[0].message.content)["color"] in ("red", "green", "blue")
    with pytest.raises(openai.BadRequestError) as e:
        await oc.chat.completions.create(
            model="default",
            messages=msgs,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}},
            },
        )
    assert "uniqueItems" in e.value.message
    bad = openai.AsyncOpenAI(
        base_url=str(client.make_url("/v1")), api_key="sk-wrong-0000000000000", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        await bad.chat.completions.create(model="default", messages=msgs, max_tokens=2)
    await oc.close()
    await bad.close()


@pytest.mark.slow
async def test_a_valid_plan_is_200_and_identical_to_thor_plan(start, default_model):
    """The default model plans this kitchen task validly; the server's document is the planner's."""
    client = await start(default_model)
    r = await client.post(
        "/v1/plan",
        json={"task": KITCHEN_TASK, "world": "kitchen", "max_tokens": 128, "attempts": 0},
    )
    body = await r.json()
    want = direct_plan(default_model, KITCHEN_TASK, "kitchen", 128, 0)
    assert want.valid, want.report
    assert r.status == 200 and set(body) == {"plan", "valid", "report", "expansion", "stats"}
    same_plan_document(body, want)
