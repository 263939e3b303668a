"""Routes, middlewares and start-up of the local API.

The app listens at once and answers /health with 503 and the reason while the model loads,
warms up and passes its self-test (in a thread, off the loop); READY=1 goes to systemd only
then. Generation runs in the job queue's worker thread; handlers await its futures, so a client
that goes away cancels its handler (aiohttp handler cancellation), which cancels its job.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from typing import Callable

from aiohttp import web

from thor_app.server.config import ServeConfig
from thor_app.server.errors import ApiError, bad_request, error_body, error_response
from thor_app.server.guard import (
    allowed_hosts,
    check_host,
    check_json_type,
    check_model,
    model_names,
)
from thor_app.server.host import ModelHost
from thor_app.server.inputs import parse_body
from thor_app.server.jobs import Cancelled, JobQueue, QueueFull
from thor_app.server.metrics import CONTENT_TYPE, Metrics
from thor_app.server.notify import Notifier, watchdog_interval, watchdog_loop
from thor_app.server.openai_api import chunk_body, completion_id, parse_chat, usage
from thor_app.server.plan_api import parse_plan
from thor_app.server.tool_calls import CallReader, completion, prepare
from thor_runtime.errors import ThorError

log = logging.getLogger("thor.serve")
STATE = web.AppKey("thor_state", object)
DISCONNECTED = web.RequestKey("disconnected", bool)
OPEN_ROUTES = ("/health",)
CUT_WRITE_S = 1.0  # after the grace: time for the cut requests' answers to go out


class ServerState:
    def __init__(
        self,
        cfg: ServeConfig,
        host: ModelHost,
        notifier: Notifier,
        watchdog_s: float | None,
        keys: tuple[str, ...],
    ):
        self.cfg, self.host, self.notifier, self.watchdog_s = cfg, host, notifier, watchdog_s
        self.keys = tuple(k.encode() for k in keys)
        self.metrics = Metrics(lambda: self.jobs.depth, lambda: self.host.ready)
        self.jobs = JobQueue(
            cfg.limits.queue_size, on_cancel=self.metrics.record_cancel, workers=cfg.limits.batch
        )
        self.created = int(time.time())
        self.tasks: list[asyncio.Task] = []
        self.draining = False
        self.allowed_hosts = allowed_hosts(cfg.server.host, cfg.server.allowed_hosts)
        self.inflight = 0  # generation requests not yet answered


def make_app(
    cfg: ServeConfig,
    *,
    loader=None,
    selftest=None,
    notifier: Notifier | None = None,
    watchdog_s: float | None | str = "env",
) -> web.Application:
    """loader, selftest: injectable (tests); notifier: default from $NOTIFY_SOCKET;
    watchdog_s: seconds between pings, None for none, "env" for systemd's $WATCHDOG_USEC."""
    keys = cfg.auth.load_keys()
    state = ServerState(
        cfg,
        ModelHost(cfg, loader, selftest),
        notifier or Notifier.from_env(),
        watchdog_interval() if watchdog_s == "env" else watchdog_s,
        keys,
    )
    # every start-up phase reaches systemctl status, not only the first and the last
    state.host.on_status = lambda status, reason: state.notifier.send(f"STATUS={status}: {reason}")
    app = web.Application(
        client_max_size=cfg.limits.max_body_bytes, middlewares=[_errors, _guard, _auth, _gate]
    )
    app[STATE] = state
    app.router.add_get("/health", health)
    app.router.add_get("/health/report", health_report)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/plan", plan)
    app.on_startup.append(_startup)
    app.on_shutdown.append(_shutdown)
    app.on_cleanup.append(_cleanup)
    return app


# ---- lifecycle ------------------------------------------------------------------------------
def _in_daemon(fn: Callable):
    """Run ``fn`` in a daemon thread; an awaitable of its result. A daemon, so a shutdown during
    a minutes-long model load does not wait for it."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def run():
        try:
            r = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            loop.call_soon_threadsafe(lambda err=e: fut.done() or fut.set_exception(err))
        else:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(r))

    threading.Thread(target=run, name="thor-startup", daemon=True).start()
    return fut


async def _bring_up(st: ServerState) -> None:
    st.notifier.send("STATUS=loading the model")
    if await _in_daemon(st.host.start):
        st.jobs.workers = st.host.concurrency  # what the loaded runtime can run at once
        st.jobs.start()
        await st.notifier.send_reliably("READY=1", f"STATUS=ready: {st.host.reason}")
    else:  # never READY=1: systemd's start timeout fails the unit; /health says why
        st.notifier.send(f"STATUS={st.host.reason}")
        log.error("%s", st.host.reason)


async def _startup(app: web.Application) -> None:
    st = app[STATE]
    st.tasks.append(asyncio.create_task(_bring_up(st)))
    if st.watchdog_s:
        stall = st.cfg.server.stall_s
        st.tasks.append(
            asyncio.create_task(
                watchdog_loop(st.notifier, st.watchdog_s, lambda: st.jobs.stalled_for() < stall)
            )
        )


async def drain(app: web.Application, grace_s: float) -> None:
    """SIGTERM's drain, called once the listener is closed: refuse new requests (503), answer the
    queued ones 503 at once, give the running one ``grace_s`` to finish, then cut it (a JSON 503,
    or an SSE error event before [DONE]) and wait briefly for its answer to be written."""
    st = app[STATE]
    if st.draining:
        return
    st.draining = True
    st.host.stopping()
    st.notifier.send("STOPPING=1", "STATUS=stopping: finishing in-flight requests")
    st.jobs.refuse_new()
    queued = st.jobs.fail_all("shutdown", running=False)
    loop = asyncio.get_running_loop()
    end = loop.time() + grace_s
    while st.inflight and loop.time() < end:  # the queued ones leave within a turn
        await asyncio.sleep(0.02)
    cut = st.jobs.fail_all("shutdown", running=True)
    end = loop.time() + CUT_WRITE_S
    while st.inflight and loop.time() < end:
        await asyncio.sleep(0.02)
    log.info(
        "drained: %d queued answered 503, %d cut at the grace's end, %d unanswered",
        queued,
        cut,
        st.inflight,
    )


async def _shutdown(app: web.Application) -> None:
    await drain(app, 0.0)  # no-op after serve's drain; a runner torn down without it cuts at once


async def _cleanup(app: web.Application) -> None:
    st = app[STATE]
    st.host.stopping()
    for t in st.tasks:
        t.cancel()
    await asyncio.gather(*st.tasks, return_exceptions=True)
    # the drain has cut the running job; it stops at its next check (a daemon thread either way)
    await asyncio.to_thread(st.jobs.stop, True, CUT_WRITE_S)
    st.notifier.close()


# ---- middlewares ----------------------------------------------------------------------------
def _route(request: web.Request) -> str:
    info = request.match_info
    return info.route.resource.canonical if info.route.resource is not None else "other"


@web.middleware
async def _errors(request: web.Request, handler):
    st, t0, status = request.app[STATE], time.perf_counter(), 500
    try:
        resp = await handler(request)
        status = 499 if request.get(DISCONNECTED) else resp.status
        return resp
    except ApiError as e:
        status = e.status
        return error_response(e)
    except ThorError as e:
        status = 400
        return error_response(bad_request(str(e)))
    except web.HTTPException as e:  # the router's 404 / 405, aiohttp's 413
        status = e.status
        code = {413: "request_too_large", 404: "not_found", 405: "method_not_allowed"}.get(e.status)
        headers = {k: v for k, v in e.headers.items() if k.lower() in ("allow",)}
        msg = (
            f"request body exceeds {st.cfg.limits.max_body_bytes} bytes"
            if e.status == 413
            else e.reason
        )
        return web.json_response(error_body(e.status, msg, code), status=e.status, headers=headers)
    except asyncio.CancelledError:
        status = 499
        raise
    except Exception:  # noqa: BLE001 - a bug: logged with its traceback, the client gets no internals
        log.exception("internal error on %s %s", request.method, request.path)
        return web.json_response(
            error_body(500, "internal server error", "internal_error"), status=500
        )
    finally:
        route = _route(request)
        st.metrics.requests.labels(route, str(status)).inc()
        st.metrics.latency.labels(route).observe(time.perf_counter() - t0)


@web.middleware
async def _guard(request: web.Request, handler):
    check_host(request.headers.get("Host"), request.app[STATE].allowed_hosts)
    if request.method == "POST":
        check_json_type(request.content_type)
    return await handler(request)


@web.middleware
async def _auth(request: web.Request, handler):
    st = request.app[STATE]
    if st.keys and request.path not in OPEN_ROUTES:
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip().encode() if auth[:7].lower() == "bearer " else b""
        # compare against every key, always: the time taken says nothing about which key is close
        ok = False
        for k in st.keys:
            ok |= hmac.compare_digest(given, k)
        if not given or not ok:
            raise ApiError(
                401,
                "missing or invalid API key (Authorization: Bearer KEY)",
                "invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
    return await handler(request)


@web.middleware
async def _gate(request: web.Request, handler):
    """Counts the generation requests in flight (the drain waits on them); refuses new ones
    once draining."""
    st = request.app[STATE]
    if request.method != "POST":
        return await handler(request)
    if st.draining:
        raise ApiError(
            503, "the server is shutting down", "shutting_down", headers={"Retry-After": "5"}
        )
    st.inflight += 1
    try:
        return await handler(request)
    finally:
        st.inflight -= 1


# ---- helpers --------------------------------------------------------------------------------
async def _json(request: web.Request):
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(
            413,
            f"request body exceeds {request.app[STATE].cfg.limits.max_body_bytes} bytes",
            "request_too_large",
        ) from None
    return parse_body(raw)


def _served_names(st: ServerState) -> frozenset[str]:
    return model_names(st.host.model_id, st.host.hosted.loaded.source)


def _require_ready(st: ServerState) -> None:
    if not st.host.ready:
        raise ApiError(
            503,
            f"model not ready ({st.host.status}): {st.host.reason}",
            "model_not_ready",
            headers={"Retry-After": "5"},
        )


def _submit(st: ServerState, fn, priority: int):
    if st.draining:  # parsed while the drain began
        raise ApiError(
            503, "the server is shutting down", "shutting_down", headers={"Retry-After": "5"}
        )
    try:
        return st.jobs.submit(fn, st.cfg.limits.request_timeout_s, priority)
    except QueueFull as e:
        raise ApiError(
            429,
            f"the generation queue is full ({st.cfg.limits.queue_size} waiting); retry later",
            "queue_full",
            headers={"Retry-After": str(e.retry_after_s)},
        ) from None


def _cancelled_error(st: ServerState, c: Cancelled) -> ApiError:
    if c.reason == "timeout":
        return ApiError(
            504, f"the request took longer than {st.cfg.limits.request_timeout_s} s", "timeout"
        )
    return ApiError(
        503, "the server is shutting down", "shutting_down", headers={"Retry-After": "5"}
    )


async def _result(st: ServerState, request: web.Request, job):
    try:
        return await job.future
    except Cancelled as c:
        raise _cancelled_error(st, c) from None
    except asyncio.CancelledError:  # the client went away: stop its generation
        job.cancel("disconnect")
        request[DISCONNECTED] = True
        raise


# ---- handlers -------------------------------------------------------------------------------
def _not_ready(h) -> web.Response:
    return web.json_response(
        {"status": h.status, "reason": h.reason, **error_body(503, h.reason, "model_not_ready")},
        status=503,
    )


async def health(request: web.Request) -> web.Response:
    """Open to every caller: the status and the self-test's one-line summary, nothing about where
    or how the model is stored (that is /health/report, behind the key)."""
    st = request.app[STATE]
    h = st.host
    if not h.ready:
        return _not_ready(h)
    return web.json_response(
        {
            "status": "ok",
            "model": h.model_id,
            "selftest": h.reason.removeprefix("self-test passed: "),
            "queue_depth": st.jobs.depth,
            "generating": len(st.jobs.running),
        }
    )


async def health_report(request: web.Request) -> web.Response:
    """The full report: runtime as built, start-up times, the self-test's whole report."""
    st = request.app[STATE]
    h = st.host
    if not h.ready:
        return _not_ready(h)
    rep = h.report
    return web.json_response(
        {
            "status": "ok",
            "model": h.model_id,
            "backend": st.cfg.engine.backend,
            "speculation": h.hosted.speculation.name,
            "selftest": h.reason.removeprefix("self-test passed: "),
            "selftest_report": rep.to_dict() if callable(getattr(rep, "to_dict", None)) else None,
            "runtime": h.settings(),
            "startup_s": {k: round(v, 3) for k, v in h.startup_s.items()},
            "queue_depth": st.jobs.depth,
            "generating": len(st.jobs.running),
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    st = request.app[STATE]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": st.host.model_id,
                    "object": "model",
                    "created": st.created,
                    "owned_by": "thor-runtime",
                }
            ],
        }
    )


async def plan(request: web.Request) -> web.Response:
    st = request.app[STATE]
    _require_ready(st)
    body = await _json(request)
    if isinstance(body, dict):
        check_model(body, _served_names(st))
    req = await asyncio.to_thread(parse_plan, body, st.cfg.planner)
    prepared = await asyncio.to_thread(st.host.prepare_plan, req)
    job = _submit(st, st.host.plan_job(req, prepared), req.priority)
    res = await _result(st, request, job)
    for s in res.generations:
        st.metrics.record_generation(s)
    doc = res.document()
    if res.valid:
        return web.json_response(doc)
    raise ApiError(
        422,
        f"no valid plan after {res.attempts} attempt(s); see report",
        "no_valid_plan",
        extra=doc,
    )


async def chat(request: web.Request) -> web.StreamResponse:
    st = request.app[STATE]
    _require_ready(st)
    body = await _json(request)
    req = parse_chat(body)
    check_model(body, _served_names(st))
    prepared, shape = await asyncio.to_thread(prepare, st.host, req)  # tool calls: tool_calls.py
    if req.stream:
        return await _chat_stream(st, request, req, prepared, CallReader(shape))
    job = _submit(st, st.host.chat_job(prepared), req.priority)
    res, _ = await _result(st, request, job)
    st.metrics.record_generation(res.stats)
    return web.json_response(completion(completion_id(), st.host.model_id, shape, res))


async def _chat_stream(
    st: ServerState, request: web.Request, req, prepared, reader
) -> web.StreamResponse:
    loop = asyncio.get_running_loop()
    texts: asyncio.Queue = asyncio.Queue()  # fed from the worker thread, through the loop
    job = _submit(
        st,
        st.host.chat_job(
            prepared, lambda s: loop.call_soon_threadsafe(texts.put_nowait, s), req.stop
        ),
        req.priority,
    )
    # The result is delivered through the loop after every text (FIFO), so None comes last.
    job.future.add_done_callback(lambda f: texts.put_nowait(None))
    cid, created, model = completion_id(), int(time.time()), st.host.model_id

    def event(delta, finish=None, usage_=None, final_usage=False):
        body = chunk_body(cid, model, created, delta, finish, usage_, req.include_usage)
        if final_usage:
            body["usage"] = usage_
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    try:
        await resp.prepare(request)
        await resp.write(event({"role": "assistant", "content": ""}))
        while (text := await texts.get()) is not None:
            for delta in reader.push(text):  # content, or a tool call's name and arguments
                await resp.write(event(delta))
        try:
            res, tail = job.future.result()
        except Cancelled as c:
            e = _cancelled_error(st, c)
            await resp.write(
                b"data: " + json.dumps(error_body(e.status, e.message, e.code)).encode() + b"\n\n"
            )
        except ThorError as e:
            await resp.write(
                b"data: "
                + json.dumps(error_body(400, str(e), "invalid_request")).encode()
                + b"\n\n"
            )
        else:
            st.metrics.record_generation(res.stats)
            deltas, finish = reader.finish(tail, res.finish_reason)
            for delta in deltas:
                await resp.write(event(delta))
            await resp.write(event({}, finish))
            if req.include_usage:
                await resp.write(
                    event(
                        None, usage_=usage(res.prompt_tokens, len(res.token_ids)), final_usage=True
                    )
                )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except (asyncio.CancelledError, ConnectionResetError) as e:
        job.cancel("disconnect")
        job.future.cancel()  # nobody will read its outcome
        request[DISCONNECTED] = True
        if isinstance(e, asyncio.CancelledError):
            raise
    return resp
