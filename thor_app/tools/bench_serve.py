"""`thor bench --serve`: what the local API costs over calling the planner in-process.

Both sides are built from one TOML file: `thor serve` reads it in a subprocess on a free
loopback port, and this process builds its in-process side with the server's own loader and
warm-up from the same parsed config, so model, weights, layout, KV dtype, prefix cache,
speculation, thinking and thread count are the same by construction. Each side reports the
settings it actually runs with (read back from the built runtime; the server's through
/health), and the run stops if they differ.

Measured:
  * paired plans: the same plan request over HTTP (one client) and in-process, back to back,
    alternating which goes first, over several repeats after one unrecorded round on each side
    (so both prefix caches hold the same prompts). Per pair the difference and the relative
    overhead HTTP / in-process - 1; the summary is the median of those with its quartiles and
    range. Pairing cancels the drift of a shared machine that separate runs pick up;
  * streaming time to the first content chunk against the same chat in-process, paired too;
  * plan requests/s and p50/p99 latency with 1, 4 and 16 concurrent clients, twice: the server
    as configured (``limits.batch`` requests generating at once, sharing forwards), then a second
    server on the same config with ``batch = 1`` (one generation at a time), one after the other,
    the second first sent the paired plans the first answered (both start equally warm);
    every answer to one task must be the same plan in both (batching never changes a plan);
  * HTTP latency minus the plan time the server reports for itself: the transport, parsing and
    queueing alone, a different figure from the paired overhead.
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
from collections import Counter
from pathlib import Path

from thor_runtime.errors import ThorError

TASKS = ("put the red cup in the sink", "move the apple to the table")
# the throughput levels' requests: more tasks, so clients at once plan different things
LOAD_TASKS = TASKS + ("put the apple in the sink", "move the red cup to the table")
CHAT = [{"role": "user", "content": "Name three things a kitchen robot can do."}]
CHAT_TOKENS = 16


def _log(msg: str) -> None:
    print(f"bench serve: {msg}", file=sys.stderr, flush=True)


def _pct(xs, q, nd: int = 4):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))], nd) if xs else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(
    args,
    tmp: Path,
    wdt: str,
    kv: str,
    spec: str,
    prefix_cache: int,
    batch: int,
    name: str = "thor.toml",
) -> Path:
    """The one config both sides run (TOML strings written as JSON strings: the same escapes)."""
    from thor_app.flags import config_from_args

    q = json.dumps
    backend = args.backend.split(",")[0].strip()
    c = config_from_args(args)
    m, s = c.model, c.speculation
    text = (
        f"[server]\nport = {_free_port()}\n"
        f"[model]\nname = {q(m.name)}\ndevice = {q(m.device)}\n"
        f"dtype = {q(wdt)}\nkv_dtype = {q(kv)}\n"
        f"prefix_cache = {prefix_cache}\n"
        f"[engine]\nbackend = {q(backend)}\n"
        f"[speculation]\nmethod = {q(spec)}\ndrafter = {q(s.drafter)}\n"
        f"block_size = {s.block_size}\nwindow = {s.window}\n"
        f"[limits]\nqueue_size = 64\nrequest_timeout_s = 3600\nbatch = {batch}\n"
        f"[planner]\nmax_tokens = {max(args.max_tokens, 16)}\nattempts = 0\n"
    )
    path = tmp / name
    path.write_text(text)
    return path


def _start_server(cfg_path: Path, threads: int, log: Path) -> subprocess.Popen:
    # torch sizes its intra-op pool from OMP_NUM_THREADS when it starts: the server's threads
    # and this process's own thor_app first on the path: both sides run the same code
    root = str(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
    with open(log, "w") as err:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "thor_app.cli", "serve", "--config", str(cfg_path)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )


def _wait_ready(proc, port: int, log: Path) -> dict:
    import urllib.error
    import urllib.request

    while True:
        if proc.poll() is not None:
            raise ThorError(f"thor serve exited with {proc.returncode}: {log.read_text()[-400:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
                json.loads(r.read())
            # ready: the runtime as built is in the full report (no keys in the bench's config)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/report", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
            if body.get("status") == "failed":
                raise ThorError(f"thor serve is not ready: {body['reason']}") from None
        except OSError:
            pass
        time.sleep(0.5)


class InProcess:
    """The planner called directly, built as the server builds its own: same parsed config,
    same loader, same warm-up, same request parsing (outside the timed call)."""

    def __init__(self, cfg):
        from agent.schema.grammar import GrammarTokenizer
        from thor_app.server import host

        self.cfg = cfg
        self.hosted = host.default_loader(cfg)
        self.gtok = GrammarTokenizer(self.hosted.loaded.tokenizer)
        host.ModelHost.warm_up(self.hosted, self.gtok)
        self.thinking = host.resolve_thinking(cfg.planner.thinking, self.gtok)
        self.settings = host.runtime_settings(self.hosted, self.thinking)

    def plan(self, body: dict):
        """-> (seconds, PlanResult) for one /v1/plan request body."""
        from agent.planner.planner import Planner
        from thor_app.server.plan_api import parse_plan

        h, req = self.hosted, parse_plan(body, self.cfg.planner)
        planner = Planner(
            h.runtime,
            h.loaded.tokenizer,
            h.speculation,
            max_tokens=req.max_tokens,
            attempts=req.attempts,
            thinking=self.thinking,
            max_steps=req.max_steps,
            grammar_tokenizer=self.gtok,
        )
        t = time.perf_counter()
        res = planner.plan(req.task, req.world, req.skills, req.schema)
        return time.perf_counter() - t, res

    def ttft(self) -> float:
        """Seconds to the first non-empty text, cut into deltas as the server streams them."""
        from thor_app.server.openai_api import TextStreamer
        from thor_runtime.engine import SamplingParams

        h = self.hosted
        streamer, first = TextStreamer(h.loaded.tokenizer), []
        ids = h.loaded.tokenizer.encode_chat(CHAT)
        t = time.perf_counter()

        def on_token(tok):
            if not first and streamer.push(tok):
                first.append(time.perf_counter() - t)

        h.runtime.generate(
            ids, SamplingParams(max_tokens=CHAT_TOKENS), h.speculation, on_token=on_token
        )
        return first[0] if first else float("nan")


def _plan_body(task: str, world: str, max_tokens: int) -> dict:
    return {"task": task, "world": world, "max_tokens": max_tokens, "attempts": 0}


SENT: Counter = Counter()  # plan requests posted per server (its base URL)


async def _post_plan(s, base: str, body: dict):
    SENT[base] += 1
    t = time.perf_counter()
    async with s.post(f"{base}/v1/plan", json=body) as r:
        doc = await r.json()
    if r.status not in (200, 422):
        raise ThorError(f"plan request failed with {r.status}: {doc}")
    return time.perf_counter() - t, doc


async def _http_ttft(s, base: str) -> float:
    t = time.perf_counter()
    async with s.post(
        f"{base}/v1/chat/completions",
        json={"messages": CHAT, "max_tokens": CHAT_TOKENS, "stream": True},
    ) as r:
        out = float("nan")
        async for raw in r.content:
            if b'"content": "' in raw and b'"content": ""' not in raw:
                out = time.perf_counter() - t
                break
        await r.read()
    return out


async def _paired(base: str, inproc: InProcess, world: str, max_tokens: int, repeats: int):
    """-> (plan pairs, TTFT pairs). Each pair runs its two sides back to back, the first side
    alternating from pair to pair."""
    import aiohttp

    pairs, ttft = [], []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        for task in TASKS:  # unrecorded: the same prompts enter both caches
            await _post_plan(s, base, _plan_body(task, world, max_tokens))
            inproc.plan(_plan_body(task, world, max_tokens))
        for r in range(repeats):
            for i, task in enumerate(TASKS):
                body, http_first = _plan_body(task, world, max_tokens), (r + i) % 2 == 0
                if http_first:
                    h_s, doc = await _post_plan(s, base, body)
                    i_s, res = inproc.plan(body)
                else:
                    i_s, res = inproc.plan(body)
                    h_s, doc = await _post_plan(s, base, body)
                st = doc["stats"]
                pairs.append(
                    {
                        "repeat": r,
                        "task": task,
                        "first": "http" if http_first else "in_process",
                        "http_s": round(h_s, 4),
                        "in_process_s": round(i_s, 4),
                        "diff_s": round(h_s - i_s, 4),
                        "overhead": round(h_s / i_s - 1, 5),
                        # the server compiles the grammar before queueing, outside the
                        # planner's timer
                        "server_reported_s": round(
                            st["plan_latency_s"] + st["grammar_compile_s"], 4
                        ),
                        "same_plan": doc["plan"] == res.plan
                        and doc["valid"] == res.valid
                        and st["generated_tokens"] == res.stats["generated_tokens"],
                        "generated_tokens": st["generated_tokens"],
                        "prompt_tokens": st["prompt_tokens"],
                        "prompt_tokens_computed": st["prompt_tokens_computed"],
                        "drafter_and_between_s": round(st["time_draft_s"] + st["time_rest_s"], 6),
                    }
                )
        for r in range(repeats):
            if r % 2 == 0:
                h, i = await _http_ttft(s, base), inproc.ttft()
            else:
                i, h = inproc.ttft(), await _http_ttft(s, base)
            ttft.append({"http_s": round(h, 4), "in_process_s": round(i, 4)})
    return pairs, ttft


async def _levels(
    base: str, clients: int, n: int, world: str, max_tokens: int, plans: dict
) -> dict:
    """``plans``: task -> the set of plan documents answered for it (filled in)."""
    import aiohttp

    lat, todo = [], list(range(n))

    async def client(s):
        while todo:
            task = LOAD_TASKS[todo.pop() % len(LOAD_TASKS)]
            dt, doc = await _post_plan(s, base, _plan_body(task, world, max_tokens))
            plans.setdefault(task, set()).add(
                json.dumps([doc["plan"], doc["valid"]], sort_keys=True)
            )
            lat.append(dt)

    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        await asyncio.gather(*(client(s) for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "requests": n,
        "req_per_s": round(n / wall, 4),
        "p50_s": _pct(lat, 0.5),
        "p99_s": _pct(lat, 0.99),
    }


def compare_levels(batched: list[dict], one: list[dict], plans: dict) -> dict:
    """Batched against one-at-a-time at each client count; the issue's yardsticks: plans/s at 4
    clients over one-at-a-time's, p99 at 4 clients over one client's p50."""
    by = {r["clients"]: r for r in one}
    rows = [
        {
            "clients": r["clients"],
            "req_per_s_ratio": round(r["req_per_s"] / by[r["clients"]]["req_per_s"], 3),
            "p50_ratio": round(r["p50_s"] / by[r["clients"]]["p50_s"], 3),
        }
        for r in batched
        if r["clients"] in by
    ]
    single = next((r for r in batched if r["clients"] == 1), None)
    four = next((r for r in batched if r["clients"] == 4), None)
    return {
        "levels": rows,
        "p99_4_over_p50_1": round(four["p99_s"] / single["p50_s"], 3) if four and single else None,
        "tasks": len(plans),
        "plans_identical": all(len(v) == 1 for v in plans.values()),
    }


def summarize(pairs: list[dict], ttft: list[dict]) -> dict:
    over = [p["overhead"] for p in pairs]
    added = [p["http_s"] - p["server_reported_s"] for p in pairs]
    return {
        "pairs": len(pairs),
        "plans_identical": sum(p["same_plan"] for p in pairs),
        "http_p50_s": _pct([p["http_s"] for p in pairs], 0.5),
        "in_process_p50_s": _pct([p["in_process_s"] for p in pairs], 0.5),
        "diff_median_s": round(statistics.median(p["diff_s"] for p in pairs), 4),
        "overhead_median": round(statistics.median(over), 5),
        "overhead_p25": _pct(over, 0.25, 5),
        "overhead_p75": _pct(over, 0.75, 5),
        "overhead_min": min(over),
        "overhead_max": max(over),
        "http_minus_server_reported_p50_s": _pct(added, 0.5),
        "http_minus_server_reported_fraction": round(
            statistics.median(added) / statistics.median(p["server_reported_s"] for p in pairs), 5
        ),
        "ttft_stream_p50_s": _pct([t["http_s"] for t in ttft], 0.5),
        "ttft_in_process_p50_s": _pct([t["in_process_s"] for t in ttft], 0.5),
        "ttft_diff_median_s": round(
            statistics.median(t["http_s"] - t["in_process_s"] for t in ttft), 4
        ),
    }


def markdown(doc: dict) -> str:
    s, srv, inp = doc["summary"], doc["settings"]["server"], doc["settings"]["in_process"]
    out = [
        "## thor bench --serve",
        "",
        (
            f"model {doc['model']}, world {doc['world']}, plan max_tokens "
            f"{doc['max_tokens']}, {s['pairs']} paired plans "
            f"({doc['repeats']} repeats x {len(TASKS)} tasks)"
        ),
        "",
        "| setting | server | in-process |",
        "|---|---|---|",
    ]
    out += [f"| {k} | {srv.get(k)} | {inp.get(k)} |" for k in sorted(set(srv) | set(inp))]
    out += [
        "",
        "| paired plans | value |",
        "|---|---|",
        f"| in-process p50 s | {s['in_process_p50_s']} |",
        f"| HTTP p50 s | {s['http_p50_s']} |",
        f"| HTTP - in-process, median of pairs s | {s['diff_median_s']} |",
        f"| overhead (HTTP / in-process - 1), median of pairs | {s['overhead_median']:+.2%} |",
        f"| overhead quartiles | {s['overhead_p25']:+.2%} .. {s['overhead_p75']:+.2%} |",
        f"| overhead range | {s['overhead_min']:+.2%} .. {s['overhead_max']:+.2%} |",
        f"| plans identical on both sides | {s['plans_identical']}/{s['pairs']} |",
        (
            f"| HTTP - server-reported plan time, p50 s (transport and parsing only) | "
            f"{s['http_minus_server_reported_p50_s']} "
            f"({s['http_minus_server_reported_fraction']:.2%}) |"
        ),
        (
            f"| streaming TTFT p50 s, HTTP / in-process | {s['ttft_stream_p50_s']} / "
            f"{s['ttft_in_process_p50_s']} |"
        ),
        "",
        "| repeat | task | first | HTTP s | in-process s | diff s | overhead |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {p['repeat']} | {p['task']} | {p['first']} | {p['http_s']} | {p['in_process_s']} | "
        f"{p['diff_s']} | "
        f"{p['overhead']:+.2%} |"
        for p in doc["pairs"]
    ]
    cmp = doc["batching"]
    ratio = {r["clients"]: r["req_per_s_ratio"] for r in cmp["levels"]}
    out += [
        "",
        f"| clients | requests | req/s, batch {doc['batch']} | p50 s | p99 s | "
        "req/s, one at a time | p50 s | p99 s | req/s ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    one = {r["clients"]: r for r in doc["levels_one_at_a_time"]}
    for r in doc["levels"]:
        o = one.get(r["clients"], {})
        out.append(
            f"| {r['clients']} | {r['requests']} | {r['req_per_s']} | {r['p50_s']} | "
            f"{r['p99_s']} | {o.get('req_per_s')} | {o.get('p50_s')} | {o.get('p99_s')} | "
            f"{ratio.get(r['clients'])} |"
        )
    out += [
        "",
        f"p99 at 4 clients / p50 at 1 client (batched): {cmp['p99_4_over_p50_1']}; "
        f"every task answered with one plan in both modes: {cmp['plans_identical']} "
        f"({cmp['tasks']} tasks)",
    ]
    if doc.get("ceiling"):
        from thor_app.tools.bench_ceiling import markdown_line

        out += ["", markdown_line(doc["ceiling"])]
    return "\n".join(out) + "\n"


def check_same_settings(server: dict, local: dict) -> None:
    """A comparison is only fair between sides that run the same way: refuse any other."""
    differ = sorted(k for k in set(server) | set(local) if server.get(k) != local.get(k))
    if differ or not server:
        raise ThorError(
            "the server and the in-process side run with different settings: "
            + (
                ", ".join(f"{k} {server.get(k)!r} vs {local.get(k)!r}" for k in differ)
                or "the server reported none"
            )
        )


def _levels_arg(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",")]
    except ValueError:
        raise ThorError(f"--serve-clients must be a comma list of integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ThorError("--serve-clients: every client count must be >= 1")
    return levels


async def _replay_paired(base: str, world: str, max_tokens: int, repeats: int) -> None:
    """The plan requests ``_paired`` sent over HTTP, unrecorded: the one-at-a-time server then
    starts its levels as warm as the batched one (``auto`` has seen as many plans)."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        for _ in range(repeats + 1):
            for task in TASKS:
                await _post_plan(s, base, _plan_body(task, world, max_tokens))


def _level_rows(base, levels, repeats, world, max_tokens, plans, label, warm: dict) -> list[dict]:
    # unrecorded: every load task once, one at a time, so both servers start the levels equally
    # warm (prefix cache, auto's acceptance so far); ``warm[label]``: the plans it had answered then
    asyncio.run(_levels(base, 1, len(LOAD_TASKS), world, max_tokens, plans))
    warm[label] = SENT[base]
    rows = []
    for c in levels:
        n = max(2 * c, repeats)  # two waves at least: one wave times its slowest plan
        _log(f"{label}: {c} client(s), {n} plan requests ...")
        rows.append(asyncio.run(_levels(base, c, n, world, max_tokens, plans)))
    return rows


def run_serve(args) -> int:
    import torch

    from thor_app.server.config import LimitsSection, load_config
    from thor_app.tools.bench_ceiling import against, ceiling, row_floor
    from thor_app.tools.bench_report import device_info
    from thor_runtime.config import ModelSettings

    wdt, kv = args.configs.split(",")[0].strip().split("/")
    spec = args.spec.split(",")[0].strip()
    levels = _levels_arg(args.serve_clients)
    batch = LimitsSection.batch if args.serve_batch is None else args.serve_batch
    prefix = ModelSettings().prefix_cache if args.prefix_cache is None else args.prefix_cache
    world, threads_before = args.serve_world, torch.get_num_threads()
    plans: dict = {}
    warm: dict = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cfg_path = _write_config(args, tmp, wdt, kv, spec, prefix, batch)
        one_path = _write_config(args, tmp, wdt, kv, spec, prefix, 1, "one-at-a-time.toml")
        cfg = load_config(str(cfg_path))  # a bad setting fails here, before any load
        port = cfg.server.port
        proc = _start_server(cfg_path, args.threads, tmp / "serve.log")
        base = f"http://127.0.0.1:{port}"
        try:
            torch.set_num_threads(args.threads)
            _log("loading the in-process side (the server loads alongside) ...")
            inproc = InProcess(cfg)
            _log(f"waiting for thor serve on port {port} (load, warm-up, self-test) ...")
            health = _wait_ready(proc, port, tmp / "serve.log")
            served = health.get("runtime") or {}
            check_same_settings(served, inproc.settings)
            _log(f"{args.repeats} x {len(TASKS)} paired plans and {args.repeats} paired TTFTs ...")
            pairs, ttft = asyncio.run(_paired(base, inproc, world, args.max_tokens, args.repeats))
            local = inproc.settings
            _log("the cores' ceiling: seconds per verify row at a plan's context ...")
            context = round(statistics.mean(p["prompt_tokens"] for p in pairs))
            ceil = ceiling(row_floor(inproc.hosted.runtime, context), pairs)
            del inproc  # its memory: not beside the load runs
            rows = _level_rows(
                base, levels, args.repeats, world, args.max_tokens, plans, "batched", warm
            )
            proc.terminate()
            proc.wait(120)
            # the same config but one generation at a time, alone on the machine
            one_port = load_config(str(one_path)).server.port
            proc = _start_server(one_path, args.threads, tmp / "serve-one.log")
            _log(f"waiting for thor serve with batch = 1 on port {one_port} ...")
            check_same_settings(
                _wait_ready(proc, one_port, tmp / "serve-one.log").get("runtime") or {}, served
            )
            asyncio.run(
                _replay_paired(f"http://127.0.0.1:{one_port}", world, args.max_tokens, args.repeats)
            )
            one = _level_rows(
                f"http://127.0.0.1:{one_port}",
                levels,
                args.repeats,
                world,
                args.max_tokens,
                plans,
                "one at a time",
                warm,
            )
        finally:
            torch.set_num_threads(threads_before)
            proc.terminate()
            proc.wait(120)
    doc = {
        "device": device_info(cfg.runtime),
        "model": cfg.model.name,
        "weights": wdt,
        "kv": kv,
        "spec": spec,
        "world": world,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "tasks": list(TASKS),
        "batch": batch,
        "load_tasks": list(LOAD_TASKS),
        "settings": {"server": served, "in_process": local, "identical": served == local},
        "summary": summarize(pairs, ttft),
        "pairs": pairs,
        "ttft_pairs": ttft,
        "levels": rows,
        "levels_one_at_a_time": one,
        "warm_plans": warm,
        "batching": compare_levels(rows, one, plans),
        "ceiling": against(ceil, one),
    }
    out = Path(args.json_out)
    out.write_text(json.dumps(doc, indent=1))
    md = out.with_suffix(".md")
    md.write_text(markdown(doc))
    print(markdown(doc))
    _log(f"results written to {out} and {md}")
    if not doc["batching"]["plans_identical"]:
        raise ThorError(
            "a task got different plans from the batched and the one-at-a-time server: "
            + ", ".join(t for t, v in plans.items() if len(v) > 1)
        )
    return 0
