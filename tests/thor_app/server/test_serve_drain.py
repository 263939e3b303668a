"""SIGTERM's drain: new and queued requests get 503 with Retry-After at once, the running one
may finish within shutdown_grace_s (waited once), else it is cut with a proper error — a JSON
503, or an SSE error event before [DONE] — never a truncated body."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from tests.helpers.serving import config, is_error_body, passing, wait_health
from thor_app.server.app import CUT_WRITE_S, STATE, drain, make_app
from thor_app.server.host import Hosted
from thor_runtime.speculative import PLAIN

MSG = [{"role": "user", "content": "pick up the red cup"}]
TOKEN_S = 0.02
LONG = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 450}


class SlowSteps:
    """The tiny model with every decode step taking TOKEN_S longer."""

    def __init__(self, model):
        self._m = model

    def __getattr__(self, name):
        return getattr(self._m, name)

    def verify(self, *args, **kw):
        time.sleep(TOKEN_S)
        return self._m.verify(*args, **kw)


@pytest.fixture
def server(aiohttp_client, tiny_llama):
    async def go():
        from thor_runtime.engine.generate import Runtime

        hosted = Hosted(
            tiny_llama, Runtime(SlowSteps(tiny_llama.model), tiny_llama.tokenizer), PLAIN
        )
        app = make_app(
            config(limits={"batch": 1}),
            loader=lambda cfg: hosted,
            selftest=passing,
            watchdog_s=None,
        )  # one worker: a second request queues
        client = await aiohttp_client(app)
        assert (await wait_health(client))[0] == 200
        return client, app

    return go


def long_chat(stream: bool) -> dict:
    return {
        "messages": MSG,
        "max_tokens": 900,
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": LONG}},
    }


async def read_sse(resp) -> tuple[list[dict], bool]:
    events, done = [], False
    async for line in resp.content:
        line = line.decode().strip()
        if line == "data: [DONE]":
            done = True
        elif line:
            assert not done, "event after [DONE]"
            events.append(json.loads(line.removeprefix("data: ")))
    return events, done


@pytest.mark.asyncio
async def test_queued_get_503_at_once_and_the_running_stream_is_cut_with_an_error_event(server):
    client, app = await server()
    st = app[STATE]
    stream = await client.post("/v1/chat/completions", json=long_chat(True))
    assert stream.status == 200
    while not st.jobs.busy:
        await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(
        client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4})
    )
    while st.jobs.depth < 1:
        await asyncio.sleep(0.01)
    grace = 0.6
    t0 = time.monotonic()
    drained = asyncio.ensure_future(drain(app, grace))
    r = await queued
    assert time.monotonic() - t0 < 0.3  # not after the grace
    assert (
        r.status == 503
        and r.headers["Retry-After"]
        and (await r.json())["error"]["code"] == "shutting_down"
    )
    r = await client.post("/v1/plan", json={"task": "x", "world": "kitchen"})
    assert r.status == 503 and is_error_body(await r.json())  # new work is refused
    events, done = await read_sse(stream)
    cut_s = time.monotonic() - t0
    assert done and is_error_body(events[-1]) and events[-1]["error"]["code"] == "shutting_down"
    assert any(e.get("choices") and e["choices"][0]["delta"].get("content") for e in events[:-1]), (
        events[:5]
    )
    await drained
    took = time.monotonic() - t0
    assert grace <= cut_s and took < grace + CUT_WRITE_S, (cut_s, took)  # the grace once, not twice
    assert (await client.get("/health")).status == 503


@pytest.mark.asyncio
async def test_a_request_that_finishes_within_the_grace_gets_its_answer(server):
    client, app = await server()
    st = app[STATE]
    req = asyncio.ensure_future(
        client.post(
            "/v1/chat/completions", json={"messages": MSG, "max_tokens": 20, "temperature": 0}
        )
    )
    while not st.jobs.busy:
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    await drain(app, 10.0)
    assert time.monotonic() - t0 < 5.0  # it returns when the work is done
    r = await req
    assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] is not None


@pytest.mark.asyncio
async def test_a_running_plain_request_cut_at_the_grace_gets_a_json_503(server):
    client, app = await server()
    st = app[STATE]
    req = asyncio.ensure_future(client.post("/v1/chat/completions", json=long_chat(False)))
    while not st.jobs.busy:
        await asyncio.sleep(0.01)
    await drain(app, 0.2)
    r = await req
    body = await r.json()
    assert r.status == 503 and body["error"]["code"] == "shutting_down" and r.headers["Retry-After"]


def test_sigterm_cuts_a_stream_with_an_error_event_and_exits_0_within_the_grace(
    tmp_path, tiny_dirs
):
    """The process: SIGTERM during a long stream -> the stream ends with an error event and
    [DONE], and the process exits 0 about one grace later (not two)."""
    import http.client

    from tests.helpers.serving import free_port, spawn_serve, wait_ready

    grace = 1.0
    port = free_port()
    proc = spawn_serve(
        tmp_path,
        f"[server]\nport = {port}\nshutdown_grace_s = {grace}\n[model]\n"
        f'name = "{tiny_dirs["llama"]}"\n[speculation]\nmethod = "none"\n',
    )
    try:
        status, body = wait_ready(proc, port, tmp_path)
        if status != 200:
            pytest.skip(f"the tiny model did not pass the real self-test: {body['reason']}")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(long_chat(True)),
            {"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert resp.status == 200
        resp.readline()  # the role event: generation is under way
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        lines = [ln.strip() for ln in resp.read().decode().splitlines() if ln.strip()]
        rc = proc.wait(30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, (tmp_path / "serve.log").read_text()
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data: "))
    # cut at the grace, or the generation ended first (a fast machine): either is a whole body
    assert is_error_body(last) and last["error"]["code"] == "shutting_down" or last["choices"], last
    assert took < 2 * grace + 1.0, took
