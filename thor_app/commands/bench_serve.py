"""`thor bench --serve`: what the local API costs over calling the planner in-process.

Starts `thor serve` (same model, weights, KV dtype and speculation) on a free loopback port,
waits for its self-test, then measures:
  * plan requests/s and p50/p99 latency with 1, 4 and 16 concurrent clients;
  * streaming time to the first content chunk (TTFT) against the runtime's own prefill TTFT;
  * the same plans in this process, one at a time, and the server's added cost two ways:
    HTTP latency over in-process latency, and HTTP latency minus the plan time the server
    itself reports (transport, parsing, queueing: independent of run-to-run decode noise).
Requests run one at a time on the server, so more clients raise latency, not throughput.
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from thor_runtime.errors import ThorError

TASKS = ("put the red cup in the sink", "move the apple to the table")
CHAT = [{"role": "user", "content": "Name three things a kitchen robot can do."}]


def _log(msg: str) -> None:
    print(f"bench serve: {msg}", file=sys.stderr, flush=True)


def _pct(xs, q):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], 4) if xs else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(args, wdt: str, kv: str, spec: str, tmp: Path):
    port = _free_port()
    cfg = tmp / "thor.toml"
    cfg.write_text(f'[server]\nport = {port}\n[model]\nname = "{args.model}"\ndtype = "{wdt}"\n'
                   f'kv_dtype = "{kv}"\n[speculation]\nmethod = "{spec}"\n'
                   f'{f"drafter = {json.dumps(args.drafter)}" if args.drafter else ""}\n'
                   f'[limits]\nqueue_size = 64\nrequest_timeout_s = 3600\n'
                   f'[planner]\nmax_tokens = {max(args.max_tokens, 16)}\nattempts = 0\n')
    log = open(tmp / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "thor_app.cli", "serve", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ))
    return proc, port


def _wait_ready(proc, port: int, log: Path) -> dict:
    import urllib.error
    import urllib.request

    while True:
        if proc.poll() is not None:
            raise ThorError(f"thor serve exited with {proc.returncode}: {log.read_text()[-400:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            if body.get("status") == "failed":
                raise ThorError(f"thor serve is not ready: {body['reason']}") from None
        except OSError:
            pass
        time.sleep(0.5)


async def _plans(base: str, clients: int, n: int, world: str, max_tokens: int) -> dict:
    import aiohttp

    lat, server_s, todo = [], [], list(range(n))

    async def client(s):
        while todo:
            i = todo.pop()
            t = time.perf_counter()
            async with s.post(f"{base}/v1/plan", json={"task": TASKS[i % len(TASKS)], "world": world,
                                                       "max_tokens": max_tokens, "attempts": 0}) as r:
                body = await r.json()
            if r.status not in (200, 422):
                raise ThorError(f"plan request failed with {r.status}: {body}")
            lat.append(time.perf_counter() - t)
            # the server compiles the grammar before queueing, outside the planner's own timer;
            # in-process planning pays it inside: count it on the server's side of the ledger
            server_s.append(body["stats"]["plan_latency_s"] + body["stats"]["grammar_compile_s"])

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        await asyncio.gather(*(client(s) for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"clients": clients, "requests": n, "req_per_s": round(n / wall, 4), "p50_s": _pct(lat, 0.5),
            "p99_s": _pct(lat, 0.99), "server_plan_p50_s": _pct(server_s, 0.5),
            "_lat": lat, "_server": server_s}


async def _ttft(base: str, n: int) -> list[float]:
    import aiohttp

    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            t = time.perf_counter()
            async with s.post(f"{base}/v1/chat/completions",
                              json={"messages": CHAT, "max_tokens": 16, "stream": True}) as r:
                async for raw in r.content:
                    if b'"content": "' in raw and b'"content": ""' not in raw:
                        out.append(time.perf_counter() - t)
                        break
                await r.read()
    return out


def _in_process(args, wdt: str, kv: str, spec: str, world_name: str, n: int):
    from agent.files import AGENT_DIR, load_skills, load_world, resolve_skills_path
    from agent.planner import Planner
    from thor_runtime.generate import Runtime
    from thor_runtime.loading import load
    from thor_runtime.sampling import SamplingParams
    from thor_runtime.speculative import SpecOptions, build_speculation

    loaded = load(args.model, wdt)
    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv)
    speculation = build_speculation(SpecOptions(method=spec, drafter=args.drafter), loaded.model)
    world = load_world(AGENT_DIR / "worlds" / f"{world_name}.json")
    skills = load_skills(resolve_skills_path(world, None))
    planner = Planner(rt, loaded.tokenizer, speculation, max_tokens=max(args.max_tokens, 16), attempts=0)
    planner.plan(TASKS[0], world, skills)                 # warm-up, as the server's
    lat = []
    for i in range(n):
        t = time.perf_counter()
        planner.plan(TASKS[i % len(TASKS)], world, skills)
        lat.append(time.perf_counter() - t)
    ids = loaded.tokenizer.encode_chat(CHAT)
    ttft = [rt.generate(ids, SamplingParams(max_tokens=2), speculation).stats.ttft_s for _ in range(n)]
    return lat, ttft


def run_serve(args) -> int:
    from .bench import device_info

    wdt, kv = args.configs.split(",")[0].strip().split("/")
    spec = args.spec.split(",")[0].strip()
    try:
        levels = [int(c) for c in args.serve_clients.split(",")]
    except ValueError:
        raise ThorError(f"--serve-clients must be a comma list of integers, got {args.serve_clients!r}") from None
    if not levels or min(levels) < 1:
        raise ThorError("--serve-clients: every client count must be >= 1")
    world = args.serve_world
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        proc, port = _start_server(args, wdt, kv, spec, tmp)
        base = f"http://127.0.0.1:{port}"
        try:
            _log(f"waiting for thor serve on port {port} (load, warm-up, self-test) ...")
            health = _wait_ready(proc, port, tmp / "serve.log")
            rows = []
            for c in levels:
                n = max(c, args.repeats)
                _log(f"{c} client(s), {n} plan requests ...")
                rows.append(asyncio.run(_plans(base, c, n, world, args.max_tokens)))
            _log("streaming TTFT ...")
            ttft_http = asyncio.run(_ttft(base, args.repeats))
        finally:
            proc.terminate()
            proc.wait(120)
    _log("the same plans in-process ...")
    inproc, ttft_inproc = _in_process(args, wdt, kv, spec, world, args.repeats)
    one = next((r for r in rows if r["clients"] == 1), rows[0])
    added = [h - s for h, s in zip(one["_lat"], one["_server"])]
    doc = {"device": device_info(), "model": str(args.model), "weights": wdt, "kv": kv, "spec": spec,
           "speculation_served": health.get("speculation"), "world": world, "max_tokens": args.max_tokens,
           "levels": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
           "in_process_p50_s": _pct(inproc, 0.5),
           "http_over_in_process": round(one["p50_s"] / statistics.median(inproc) - 1, 4),
           "added_by_server_p50_s": _pct(added, 0.5),
           "added_by_server_fraction": round(statistics.median(added) / statistics.median(one["_server"]), 5),
           "ttft_stream_p50_s": _pct(ttft_http, 0.5), "ttft_in_process_p50_s": _pct(ttft_inproc, 0.5)}
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print(f"{'clients':>7}  {'requests':>8}  {'req/s':>7}  {'p50 s':>7}  {'p99 s':>7}")
    for r in doc["levels"]:
        print(f"{r['clients']:>7}  {r['requests']:>8}  {r['req_per_s']:>7.3f}  {r['p50_s']:>7.3f}  {r['p99_s']:>7.3f}")
    print(f"in-process plan p50 {doc['in_process_p50_s']:.3f} s; over HTTP (1 client) "
          f"{doc['http_over_in_process']:+.1%}; added by the server (HTTP - server's own plan time) "
          f"p50 {doc['added_by_server_p50_s'] * 1000:.1f} ms = {doc['added_by_server_fraction']:.2%}")
    print(f"TTFT streaming p50 {doc['ttft_stream_p50_s']:.3f} s vs in-process prefill {doc['ttft_in_process_p50_s']:.3f} s")
    _log(f"results written to {args.json_out}")
    return 0
