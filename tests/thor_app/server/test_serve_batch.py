"""Several clients at once (limits.batch): requests that run together share the target's
forwards, and each answer is the one the request gets alone — plans and chat, plain and
speculative."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers.serving import (
    config,
    direct_plan,
    hosted_loader,
    long_context_copy,
    passing,
    wait_health,
)
from thor_app.server.app import STATE, make_app

pytestmark = pytest.mark.asyncio
TASKS = [
    "put the red cup in the sink",
    "move the apple to the table",
    "put the sponge in the sink",
    "move the red cup to the table",
]
CHATS = [
    "Name three robot arms.",
    "Say hello to the operator.",
    "What is a gripper?",
    "Count to five.",
]


@pytest.fixture(scope="module")
def tiny_long(tiny_dirs, tmp_path_factory):
    from thor_runtime.loading import load

    return load(
        str(long_context_copy(tiny_dirs["llama"], tmp_path_factory.mktemp("serve_batch") / "llama"))
    )


def direct_chat(loaded, text, max_tokens, spec):
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.engine.sampling import SamplingParams
    from thor_runtime.speculative import SpecOptions, build_speculation

    ids = loaded.tokenizer.encode_chat([{"role": "user", "content": text}])
    res = Runtime(loaded.model, loaded.tokenizer).generate(
        ids,
        SamplingParams(max_tokens=max_tokens),
        build_speculation(SpecOptions(spec), loaded.model),
    )
    return res.text


@pytest.mark.parametrize("spec", ["none", "ngram"])
async def test_requests_at_once_answer_what_each_answers_alone(aiohttp_client, tiny_long, spec):
    app = make_app(
        config(limits={"batch": 4, "queue_size": 8}),
        loader=hosted_loader(tiny_long, spec),
        selftest=passing,
        watchdog_s=None,
    )
    client = await aiohttp_client(app)
    assert (await wait_health(client))[0] == 200
    rt = client.app[STATE].host.hosted.runtime
    assert rt.batch is not None and rt.batch.limit == 4

    async def plan(task):
        r = await client.post(
            "/v1/plan", json={"task": task, "world": "kitchen", "max_tokens": 40, "attempts": 0}
        )
        return r.status, await r.json()

    async def chat(text):
        r = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}], "max_tokens": 24},
        )
        return r.status, await r.json()

    plans = await asyncio.gather(*(plan(t) for t in TASKS))
    chats = await asyncio.gather(*(chat(t) for t in CHATS))
    assert max(rt.batch.rounds) > 1, rt.batch.rounds  # they did run together
    for task, (status, body) in zip(TASKS, plans):
        want = direct_plan(tiny_long, task, "kitchen", 40, 0)
        assert status in (200, 422), body
        assert body["plan"] == want.plan and body["valid"] == want.valid
        assert body["stats"]["generated_tokens"] == want.stats["generated_tokens"]
    for text, (status, body) in zip(CHATS, chats):
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == direct_chat(tiny_long, text, 24, spec)


async def test_health_counts_the_requests_generating(aiohttp_client, tiny_long):
    import threading

    app = make_app(
        config(limits={"batch": 2, "queue_size": 4}),
        loader=hosted_loader(tiny_long),
        selftest=passing,
        watchdog_s=None,
    )
    client = await aiohttp_client(app)
    assert (await wait_health(client))[0] == 200
    st = client.app[STATE]
    gate = threading.Event()
    jobs = [st.jobs.submit(lambda ctx: gate.wait(30), 60) for _ in range(3)]
    while len(st.jobs.running) < 2:
        await asyncio.sleep(0.01)
    body = await (await client.get("/health")).json()
    assert body["generating"] == 2 and body["queue_depth"] == 1  # two slots, the third waits
    gate.set()
    for j in jobs:
        await j.future
