"""`thor serve` endpoints on a tiny random model (aiohttp test client): results identical to
the runtime called directly, and every error path answers with the OpenAI error body."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.helpers.serving import (
    SlowSelftest,
    config,
    failing,
    hosted_loader,
    is_error_body,
    passing,
    wait_health,
)
from thor_app.server.app import STATE, make_app
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import PLAIN

MSG = [{"role": "user", "content": "pick up the red cup"}]
COLOR = {
    "type": "object",
    "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["color"],
    "additionalProperties": False,
}
pytestmark = pytest.mark.asyncio
LONG = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 450}


@pytest.fixture
def start(aiohttp_client, tiny_llama):
    async def go(selftest=passing, spec="none", wait=True, **tables):
        app = make_app(
            config(**tables),
            loader=hosted_loader(tiny_llama, spec),
            selftest=selftest,
            watchdog_s=None,
        )
        client = await aiohttp_client(app)
        if wait:
            status, body = await wait_health(client)
            assert status == 200, body
        return client

    return go


def direct(loaded, messages, max_tokens, **kw):
    from thor_runtime.engine.generate import Runtime

    rt = Runtime(loaded.model, loaded.tokenizer)
    ids = loaded.tokenizer.encode_chat(messages)
    return rt.generate(ids, SamplingParams(max_tokens=max_tokens, **kw), PLAIN)


async def sse(resp) -> tuple[list[dict], bool]:
    events, done = [], False
    async for line in resp.content:
        line = line.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        if line == "data: [DONE]":
            done = True
            continue
        assert not done, "event after [DONE]"
        events.append(json.loads(line[6:]))
    return events, done


# ---- health gated by the self-test ----------------------------------------------------------
async def test_health_waits_for_a_slow_selftest_then_reports_it(start):
    slow = SlowSelftest()
    client = await start(selftest=slow, wait=False)
    status, body = await wait_health(client, lambda s, b: b["status"] == "self_test")
    assert status == 503 and "self-test" in body["reason"] and is_error_body(body)
    r = await client.post("/v1/chat/completions", json={"messages": MSG})
    assert r.status == 503 and (await r.json())["error"]["code"] == "model_not_ready"
    slow.release.set()
    status, body = await wait_health(client)
    assert status == 200 and body["selftest"] == "PASS: 2/2 parity checks"
    # open /health: the status and summary only; the full report is /health/report
    assert set(body) == {"status", "model", "selftest", "queue_depth", "generating"}
    body = await (await client.get("/health/report")).json()
    assert body["selftest_report"] == {"passed": True, "note": "2/2 parity checks"}
    assert body["backend"] == "torch" and body["model"] == "default"
    # what the hosted runtime runs with, read back from it (the loader here builds a bare Runtime)
    assert {
        k: body["runtime"][k] for k in ("kv_dtype", "prefix_cache", "speculation", "prefill_chunk")
    } == {"kv_dtype": "fp32", "prefix_cache": 0, "speculation": "none", "prefill_chunk": 0}


@pytest.mark.parametrize(
    "selftest, reason",
    [
        (failing, "self-test failed: FAIL: attention max |diff| 3.1 > 1e-3"),
        (lambda loaded, backend: 1 / 0, "self-test failed: ZeroDivisionError"),
    ],
)
async def test_failed_selftest_is_503_with_the_reason_and_never_serves(start, selftest, reason):
    client = await start(selftest=selftest, wait=False)
    status, body = await wait_health(client)
    assert status == 503 and body["status"] == "failed" and body["reason"].startswith(reason)
    r = await client.post("/v1/plan", json={"task": "x", "world": "kitchen"})
    assert r.status == 503 and is_error_body(await r.json())
    assert "thor_ready 0.0" in await (await client.get("/metrics")).text()


# ---- chat -----------------------------------------------------------------------------------
async def test_chat_matches_the_runtime_and_streams_the_same_text(start, tiny_llama):
    client = await start()
    want = direct(tiny_llama, MSG, 24)
    r = await client.post(
        "/v1/chat/completions", json={"model": "default", "messages": MSG, "max_tokens": 24}
    )
    assert r.status == 200
    body = await r.json()
    assert (
        body["object"] == "chat.completion"
        and body["choices"][0]["message"]["content"] == want.text
    )
    assert body["usage"] == {
        "prompt_tokens": want.prompt_tokens,
        "completion_tokens": len(want.token_ids),
        "total_tokens": want.prompt_tokens + len(want.token_ids),
    }
    r = await client.post(
        "/v1/chat/completions",
        json={
            "messages": MSG,
            "max_tokens": 24,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events, done = await sse(r)
    assert done and events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == want.text
    finals = [e["choices"][0]["finish_reason"] for e in events if e["choices"]]
    assert finals[-1] == body["choices"][0]["finish_reason"] and set(finals[:-1]) == {None}
    assert events[-1]["choices"] == [] and events[-1]["usage"] == body["usage"]


async def test_stream_with_stop_strings_never_sends_text_past_the_stop(start, tiny_llama):
    client = await start()
    free = direct(tiny_llama, MSG, 40).text
    stop = free[len(free) // 2 : len(free) // 2 + 3]
    if not stop.strip():
        pytest.skip("the tiny model's text has no usable stop string here")
    want = direct(tiny_llama, MSG, 40, stop=(stop,))
    r = await client.post(
        "/v1/chat/completions",
        json={"messages": MSG, "max_tokens": 40, "stop": stop, "stream": True},
    )
    events, done = await sse(r)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert done and text == want.text and stop not in text


async def test_json_schema_output_is_valid_against_the_schema(start):
    import jsonschema

    client = await start()
    for fmt in ({"type": "json_schema", "json_schema": {"name": "color", "schema": COLOR}},):
        r = await client.post(
            "/v1/chat/completions", json={"messages": MSG, "max_tokens": 30, "response_format": fmt}
        )
        assert r.status == 200
        jsonschema.validate(json.loads((await r.json())["choices"][0]["message"]["content"]), COLOR)


async def test_json_object_output_opens_an_object(start):
    client = await start()
    r = await client.post(
        "/v1/chat/completions",
        json={"messages": MSG, "max_tokens": 8, "response_format": {"type": "json_object"}},
    )
    assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"].startswith("{")


# ---- error paths ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"messages": MSG, "max_tokens": "10"}, "max_tokens"),
        ({"messages": MSG, "max_tokens": 0}, "max_tokens"),
        ({"messages": MSG, "temperature": "hot"}, "temperature"),
        ({"messages": MSG, "top_p": 0}, "top_p"),
        ({"messages": MSG, "seed": 1.5}, "seed"),
        ({"messages": MSG, "stop": ["a", ""]}, "stop"),
        ({"messages": MSG, "stream": "yes"}, "stream"),
        ({"messages": MSG, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"messages": MSG, "n": 2}, "n"),
        ({"messages": MSG, "tools": [{"type": "function"}]}, "tools"),
        ({"messages": MSG, "response_format": {"type": "xml"}}, "response_format"),
        (
            {
                "messages": MSG,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
            },
            "response_format",
        ),
        ({"messages": MSG, "max_tokens": 4096}, "max_tokens"),
    ],
)
async def test_wrong_types_are_400_naming_the_field(start, body, param):
    client = await start()
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 400
    err = await r.json()
    assert (
        is_error_body(err)
        and err["error"]["param"] == param
        and err["error"]["type"] == "invalid_request_error"
    )


async def test_malformed_json_non_object_and_unsupported_keyword_are_400(start):
    client = await start()
    for raw, code in (
        (b'{"messages": [', "invalid_json"),
        (b"[1, 2]", "invalid_request"),
        (b"\xff\xfe", "invalid_json"),
    ):
        for route in ("/v1/chat/completions", "/v1/plan"):
            r = await client.post(route, data=raw, headers={"Content-Type": "application/json"})
            body = await r.json()
            assert r.status == 400 and is_error_body(body) and body["error"]["code"] == code, (
                route,
                raw,
                body,
            )
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "u", "schema": {"type": "array", "uniqueItems": True}},
    }
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "response_format": fmt})
    body = await r.json()
    assert r.status == 400 and "uniqueItems" in body["error"]["message"]


async def test_context_overflow_is_400(start, tiny_llama):
    client = await start()
    ctx = tiny_llama.cfg.max_position_embeddings
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": ctx})
    body = await r.json()
    assert r.status == 400 and body["error"]["code"] == "context_length_exceeded"
    long = [{"role": "user", "content": "pick up the red cup " * ctx}]
    r = await client.post("/v1/chat/completions", json={"messages": long})
    assert r.status == 400 and (await r.json())["error"]["code"] == "context_length_exceeded"


async def test_body_cap_is_413_with_the_error_body(start):
    client = await start(limits={"max_body_bytes": 4096})
    r = await client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 8000}]}
    )
    body = await r.json()
    assert r.status == 413 and is_error_body(body) and body["error"]["code"] == "request_too_large"


async def test_unknown_route_and_method_answer_json_errors(start):
    client = await start()
    r = await client.get("/v1/nothing")
    assert r.status == 404 and is_error_body(await r.json())
    r = await client.get("/v1/chat/completions")
    assert r.status == 405 and is_error_body(await r.json()) and "POST" in r.headers["Allow"]


async def test_api_keys_guard_every_route_but_health(start, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# operators\nk-0123456789abcdef\nk-fedcba9876543210\n")
    client = await start(auth={"api_keys_file": str(keys)}, wait=False)
    status, _ = await wait_health(client)
    assert status == 200
    for headers in (
        {},
        {"Authorization": "Bearer wrong-key-000000000"},
        {"Authorization": "k-0123456789abcdef"},
    ):
        for method, route in (
            ("GET", "/metrics"),
            ("GET", "/v1/models"),
            ("POST", "/v1/plan"),
            ("POST", "/v1/chat/completions"),
        ):
            r = await client.request(method, route, headers=headers, json={})
            assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer", (route, headers)
            assert is_error_body(await r.json())
    r = await client.get("/v1/models", headers={"Authorization": "Bearer k-fedcba9876543210"})
    assert r.status == 200 and (await r.json())["data"][0]["id"] == "default"


# ---- the queue, the timeout and disconnects -------------------------------------------------
async def test_full_queue_is_429_with_retry_after_and_a_late_request_times_out(start):
    import threading

    client = await start(
        limits={"queue_size": 1, "request_timeout_s": 0.5, "batch": 1}
    )  # one worker
    st = client.app[STATE]
    gate = threading.Event()
    blocker = st.jobs.submit(lambda ctx: gate.wait(30), 60)  # occupies the worker
    while not st.jobs.busy:
        await asyncio.sleep(0.01)
    queued = asyncio.ensure_future(
        client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4})
    )
    while st.jobs.depth < 1:
        await asyncio.sleep(0.01)
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4})
    assert (
        r.status == 429
        and int(r.headers["Retry-After"]) >= 1
        and (await r.json())["error"]["code"] == "queue_full"
    )
    await asyncio.sleep(0.6)  # the queued request's deadline passes while it waits
    gate.set()
    await blocker.future
    r = await queued
    assert r.status == 504 and (await r.json())["error"]["code"] == "timeout"
    while st.jobs.depth or st.jobs.busy:  # answered at the deadline; the worker drops it after
        await asyncio.sleep(0.01)
    assert (
        'thor_generations_cancelled_total{reason="timeout"} 1.0'
        in await (await client.get("/metrics")).text()
    )


def _metric(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[-1])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_running_generation_past_its_timeout_is_cut_short(start, stream):
    """The deadline reaches a generation already running (not only one still queued): it stops
    at the next committed token and the client gets the timeout error."""
    client = await start(limits={"request_timeout_s": 0.25})
    st = client.app[STATE]
    body = {
        "messages": MSG,
        "max_tokens": 900,
        "stream": stream,  # ~1 s of tokens on this model
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": LONG}},
    }
    r = await client.post("/v1/chat/completions", json=body)
    if stream:  # the headers went out before the deadline: the error comes as the last event
        events, done = await sse(r)
        assert (
            r.status == 200
            and done
            and is_error_body(events[-1])
            and events[-1]["error"]["code"] == "timeout"
        )
    else:
        err = await r.json()
        assert r.status == 504 and is_error_body(err) and err["error"]["code"] == "timeout"
        assert "0.25 s" in err["error"]["message"]
    while st.jobs.busy:  # answered at the deadline; the worker stops at its next check
        await asyncio.sleep(0.01)
    assert st.jobs.cancelled == {"timeout": 1} and st.jobs.completed == 0
    text = await (await client.get("/metrics")).text()
    assert 'thor_generations_cancelled_total{reason="timeout"} 1.0' in text
    # it had started (tokens were committed) and was stopped well before its 900 tokens
    assert 0 < _metric(text, "thor_generated_tokens_total") < 900
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4})
    assert r.status == 200  # the worker is free again


@pytest.mark.parametrize("stream", [False, True])
async def test_disconnect_stops_the_generation(start, stream):
    client = await start()
    st = client.app[STATE]
    body = {
        "messages": MSG,
        "max_tokens": 900,
        "stream": stream,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": LONG}},
    }
    task = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
    if stream:
        resp = await task
        assert resp.status == 200
        while b'"content": "' not in await resp.content.readline():
            pass  # a token came out: the generation is running
        resp.close()
    else:
        while not any(j.tokens >= 3 for j in st.jobs.running):
            assert not task.done(), await (await task).text()
            await asyncio.sleep(0.01)
        task.cancel()
    while not st.jobs.cancelled and not st.jobs.completed:
        await asyncio.sleep(0.01)
    assert st.jobs.cancelled == {"disconnect": 1}
    metrics = await (await client.get("/metrics")).text()
    assert 'thor_generations_cancelled_total{reason="disconnect"} 1.0' in metrics
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 4})
    assert r.status == 200  # and the server serves the next request


# ---- models and metrics ---------------------------------------------------------------------
async def test_models_and_metrics(start):
    client = await start(spec="ngram")
    body = await (await client.get("/v1/models")).json()
    assert body["object"] == "list" and body["data"][0]["object"] == "model"
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 40})
    use = (await r.json())["usage"]
    gen = use["completion_tokens"]
    await client.post("/v1/chat/completions", json={"messages": "x"})
    r = await client.get("/metrics")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
    text = await r.text()
    for line in (
        'thor_requests_total{route="/v1/chat/completions",status="200"} 1.0',
        'thor_requests_total{route="/v1/chat/completions",status="400"} 1.0',
        f"thor_generated_tokens_total {float(gen)}",
        f"thor_prompt_tokens_total {float(use['prompt_tokens'])}",
        "thor_queue_depth 0.0",
        "thor_ready 1.0",
        "thor_ttft_seconds_count 1.0",
        'thor_request_latency_seconds_bucket{le="0.05",route="/v1/models"}',
        "thor_drafted_tokens_total",
        "thor_accepted_tokens_total",
    ):
        assert line in text, line


async def test_speculative_request_fills_prompt_tokens_and_acceptance_by_position(
    start, tiny_llama
):
    from thor_runtime.engine.generate import Runtime
    from thor_runtime.speculative import SpecOptions, build_speculation

    client = await start(spec="ngram")
    ids = tiny_llama.tokenizer.encode_chat(MSG)
    want = (
        Runtime(tiny_llama.model, tiny_llama.tokenizer)
        .generate(
            ids,
            SamplingParams(max_tokens=40),
            build_speculation(SpecOptions("ngram"), tiny_llama.model),
        )
        .stats
    )
    assert want.drafted > 0, "the tiny model drafts nothing here: the test would show nothing"
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 40})
    assert r.status == 200
    text = await (await client.get("/metrics")).text()
    assert (
        _metric(text, "thor_prompt_tokens_total")
        == want.prompt_tokens
        == (await r.json())["usage"]["prompt_tokens"]
    )
    assert _metric(text, "thor_drafted_tokens_total") == want.drafted
    assert _metric(text, "thor_accepted_tokens_total") == want.accepted
    for j, (o, a) in enumerate(zip(want.pos_offered, want.pos_accepted)):
        if o:
            assert _metric(text, f'thor_acceptance_by_position{{position="{j}"}}') == pytest.approx(
                a / o
            )
            assert _metric(text, f'thor_draft_position_offered_total{{position="{j}"}}') == o


async def test_a_higher_priority_overtakes_queued_requests(start):
    import threading

    from thor_app.server.openai_api import ChatRequest
    from thor_app.server.plan_api import PlanRequest

    assert PlanRequest.priority > ChatRequest.priority  # a replan overtakes queued chat by default
    client = await start(
        limits={"queue_size": 4, "batch": 1}
    )  # one worker: the queue decides the order
    st = client.app[STATE]
    gate = threading.Event()
    blocker = st.jobs.submit(lambda ctx: gate.wait(30), 60)
    while not st.jobs.busy:
        await asyncio.sleep(0.01)
    order = []

    async def ask(name, **extra):
        r = await client.post(
            "/v1/chat/completions", json={"messages": MSG, "max_tokens": 2, **extra}
        )
        order.append((name, r.status))

    tasks = []
    for name, extra in (("first", {}), ("second", {}), ("urgent", {"priority": 7})):
        tasks.append(asyncio.ensure_future(ask(name, **extra)))
        while st.jobs.depth < len(tasks):
            await asyncio.sleep(0.01)
    r = await client.post("/v1/chat/completions", json={"messages": MSG, "priority": 10})
    assert r.status == 400 and (await r.json())["error"]["param"] == "priority"
    gate.set()
    await blocker.future
    await asyncio.gather(*tasks)
    assert order == [("urgent", 200), ("first", 200), ("second", 200)]
