"""A long prompt can always be stopped: the runtime's prefill hook runs between chunks, and the
service uses it for cancellation, the deadline and the watchdog's progress mark."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers.serving import config, is_error_body, passing, wait_health
from thor_app.server.app import STATE, make_app
from thor_app.server.host import Hosted
from thor_runtime.engine.sampling import SamplingParams
from thor_runtime.speculative import PLAIN, SpecOptions, build_speculation

CHUNK = 16
LONG_MSG = [{"role": "user", "content": "pick up the red cup and put it in the sink " * 12}]


class SlowPrefill:
    """The tiny model with every prefill call taking ``delay_s`` longer: a CPU host's long
    prompt."""

    def __init__(self, model, delay_s: float):
        self._m, self.delay_s, self.calls = model, delay_s, 0

    def __getattr__(self, name):
        return getattr(self._m, name)

    def prefill(self, *args, **kw):
        self.calls += 1
        time.sleep(self.delay_s)
        return self._m.prefill(*args, **kw)


def test_the_prefill_hook_runs_between_chunks_and_changes_no_token(tiny_llama):
    from thor_runtime.engine.generate import Runtime

    ids = tiny_llama.tokenizer.encode_chat(LONG_MSG)
    assert len(ids) > 6 * CHUNK
    for spec in ("none", "ngram"):
        sp = build_speculation(SpecOptions(spec), tiny_llama.model) if spec != "none" else PLAIN
        rt = Runtime(tiny_llama.model, tiny_llama.tokenizer, prefill_chunk=CHUNK)
        want = rt.generate(ids, SamplingParams(max_tokens=12), sp)
        rows: list[int] = []
        got = rt.generate(ids, SamplingParams(max_tokens=12), sp, on_prefill=rows.append)
        assert got.token_ids == want.token_ids
        assert (
            rows == list(range(CHUNK, len(ids) - 1 - (len(ids) - 1) % CHUNK + 1, CHUNK))
            and len(rows) >= 5
        )


def test_raising_from_the_hook_stops_the_prefill_at_that_chunk(tiny_llama):
    from thor_runtime.engine.generate import Runtime

    slow = SlowPrefill(tiny_llama.model, 0.0)
    rt = Runtime(slow, tiny_llama.tokenizer, prefill_chunk=CHUNK)
    ids = tiny_llama.tokenizer.encode_chat(LONG_MSG)

    def stop(rows):
        if rows >= 2 * CHUNK:
            raise KeyboardInterrupt  # any exception the caller chooses

    with pytest.raises(KeyboardInterrupt):
        rt.generate(ids, SamplingParams(max_tokens=4), PLAIN, on_prefill=stop)
    assert slow.calls == 2


@pytest.fixture
def slow_server(aiohttp_client, tiny_llama):
    """A service whose prefill takes ~0.15 s per 16-token chunk (about 2 s for LONG_MSG)."""

    async def go(**tables):
        from thor_runtime.engine.generate import Runtime

        model = SlowPrefill(tiny_llama.model, 0.15)
        hosted = Hosted(
            tiny_llama, Runtime(model, tiny_llama.tokenizer, prefill_chunk=CHUNK), PLAIN
        )
        app = make_app(
            config(**tables), loader=lambda cfg: hosted, selftest=passing, watchdog_s=None
        )
        client = await aiohttp_client(app)
        assert (await wait_health(client))[0] == 200
        model.calls = 0  # warm-up done
        return client, app[STATE], model

    return go


async def _busy(st, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while not st.jobs.busy:
        assert time.monotonic() < end
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_during_prefill_frees_the_worker_within_a_chunk(
    slow_server, stream
):
    client, st, model = await slow_server()
    body = {"messages": LONG_MSG, "max_tokens": 8, "stream": stream}
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await _busy(st)
    await asyncio.sleep(0.4)  # inside the prefill (~2 s)
    if stream:  # headers and the role event came at once
        (await task).close()  # the client goes away
    else:
        task.cancel()
    left = time.monotonic()
    while st.jobs.busy:
        await asyncio.sleep(0.01)
    freed_s = time.monotonic() - left
    assert freed_s < 0.15 + 0.35, freed_s  # one chunk, plus a loaded machine's slack
    assert model.calls <= 8 and st.jobs.cancelled == {"disconnect": 1}  # of ~13 chunks


@pytest.mark.asyncio
async def test_a_deadline_during_prefill_answers_504_on_time(slow_server):
    client, st, _ = await slow_server(limits={"request_timeout_s": 0.5})
    t0 = time.monotonic()
    r = await client.post("/v1/chat/completions", json={"messages": LONG_MSG, "max_tokens": 8})
    took = time.monotonic() - t0
    assert r.status == 504 and is_error_body(await r.json())
    assert took < 0.5 + 0.3, took  # the deadline, not the end of the prefill (~2 s)
    while st.jobs.busy:  # and the worker stops within a chunk after it
        await asyncio.sleep(0.01)
    assert time.monotonic() - t0 < 0.5 + 0.15 + 0.5


@pytest.mark.asyncio
async def test_a_long_prefill_keeps_the_watchdogs_progress_mark_fresh(slow_server):
    client, st, _ = await slow_server()
    task = asyncio.create_task(
        client.post("/v1/chat/completions", json={"messages": LONG_MSG, "max_tokens": 2})
    )
    await _busy(st)
    worst, t0 = 0.0, time.monotonic()
    while st.jobs.busy and time.monotonic() - t0 < 1.5:
        worst = max(worst, st.jobs.stalled_for())
        await asyncio.sleep(0.02)
    assert time.monotonic() - t0 >= 1.0, "the prefill ended too soon to tell"
    assert worst < 0.15 + 0.3, worst  # a chunk's time, never the whole prompt's
    r = await task
    assert r.status == 200


@pytest.fixture(scope="module")
def tiny_long(tiny_dirs, tmp_path_factory):
    from tests.helpers.serving import long_context_copy
    from thor_runtime.loading import load

    return load(
        str(
            long_context_copy(tiny_dirs["llama"], tmp_path_factory.mktemp("prefill_long") / "llama")
        )
    )


@pytest.mark.asyncio
async def test_a_plan_whose_client_leaves_during_prefill_frees_the_worker_within_a_chunk(
    aiohttp_client, tiny_long
):
    """The planner passes only on_token; the service's runtime view adds the prefill check."""
    from thor_runtime.engine.generate import Runtime

    model = SlowPrefill(tiny_long.model, 0.1)
    hosted = Hosted(tiny_long, Runtime(model, tiny_long.tokenizer, prefill_chunk=64), PLAIN)
    app = make_app(config(), loader=lambda cfg: hosted, selftest=passing, watchdog_s=None)
    client = await aiohttp_client(app)
    assert (await wait_health(client))[0] == 200
    st = app[STATE]
    model.calls = 0
    task = asyncio.create_task(
        client.post(
            "/v1/plan",
            json={"task": "put the red cup in the sink", "world": "kitchen", "attempts": 0},
        )
    )
    await _busy(st)
    while model.calls < 3:  # a ~1.5k-token prompt: ~24 chunks of 0.1 s
        await asyncio.sleep(0.01)
    task.cancel()
    left = time.monotonic()
    while st.jobs.busy:
        await asyncio.sleep(0.01)
    assert time.monotonic() - left < 0.1 + 0.4
    assert model.calls <= 8 and st.jobs.cancelled == {"disconnect": 1}
