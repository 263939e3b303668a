"""`thor bench --tools`: the Berkeley Function Calling Leaderboard's categories through the
service's /v1/chat/completions, scored the way the leaderboard scores them.

The data is the leaderboard's own, from the ``bfcl-eval`` package (installed for this bench
only, data alone: ``pip install --no-deps bfcl-eval==2026.3.23``): each entry's question, its
functions and its possible answers. The functions go to the service as OpenAI tools, as the
leaderboard's OpenAI handler sends them (its types read as JSON Schema's: ``dict`` an object,
``float`` a number, ``tuple`` an array, ``any`` a string; ``.`` in a name as ``_``).

Two ways of answering, one `thor serve` (a subprocess on a loopback port):

- ``grammar``: the request carries the tools (tool_choice ``auto``); the service decodes calls
  under each function's schema and answers ``tool_calls``.
- ``plain``: the same prompt written by the client (the tools in the system turn, as the
  model's template writes them), no tools in the request, so no grammar; the calls are read
  from the text leniently: ``<tool_call>`` blocks, else a fenced or bare JSON object with a
  ``name`` and ``arguments``. Both prompts count the same tokens where the model's template is
  the format's (``prompt_tokens_equal`` in the results).

The check is the leaderboard's AST check for Python, rewritten here (its module imports every
model handler): the function's name; every required parameter; no parameter that is not in
the function or its answer; each value's type (an int where a float is expected passes); a
value among the possible ones, strings compared without case, spaces or ``,./-_*^``, lists and
dicts element by element; an optional parameter left out only where its answer allows it.
``parallel`` matches calls in any order, ``multiple`` has one call to pick, ``irrelevance``
passes when no call is made.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from thor_runtime.errors import ThorError

BFCL_VERSION = "2026.3.23"
CATEGORIES = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
    "irrelevance": "irrelevance",
}
MODES = ("grammar", "plain")
PEER = "llama.cpp"
# the leaderboard's types as JSON Schema's (its GORILLA_TO_OPENAPI) and as Python's
TO_SCHEMA = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}
PY_TYPES = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
SCHEMA_KEYS = ("type", "description", "properties", "required", "items", "enum", "default")
# the system turn the model's template writes without a system message (Qwen2.5's)
DEFAULT_SYSTEM = {"qwen": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- the data -------------------------------------------------------------------------------
def data_dir(given: str | None) -> Path:
    """bfcl-eval's data folder: ``given``, else the installed package's."""
    roots = [Path(given)] if given else [Path(p) / "bfcl_eval" / "data" for p in sys.path if p]
    for d in roots:
        if (d / "possible_answer").is_dir():
            return d
    raise ThorError(
        "the leaderboard's data is not installed: pip install --no-deps "
        f"bfcl-eval=={BFCL_VERSION} (or --tools-data DIR)"
    )


def load_category(root: Path, category: str, limit: int | None) -> list[tuple[dict, list | None]]:
    """-> [(entry, possible answer or None)] of one category, in file order."""
    name = f"BFCL_v4_{CATEGORIES[category]}.json"

    def rows(p: Path) -> list[dict]:
        lines = p.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    entries = rows(root / name)[:limit]
    answers = {}
    if (root / "possible_answer" / name).is_file():
        answers = {a["id"]: a["ground_truth"] for a in rows(root / "possible_answer" / name)}
    return [(e, answers.get(e["id"])) for e in entries]


def schema_of(node):
    """A leaderboard parameter description as JSON Schema (its OpenAI handler's reading)."""
    if not isinstance(node, dict):
        return node
    out = {k: node[k] for k in SCHEMA_KEYS if k in node}
    if "type" in out:
        out["type"] = TO_SCHEMA.get(out["type"], "string")
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: schema_of(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = schema_of(out["items"])
    if out.get("type") == "number" and "description" in out:
        out["description"] += " This is a float type value."
    return out


def openai_name(name: str) -> str:
    return re.sub(r"\.", "_", name)


def tools_of(functions: list[dict]) -> list[dict]:
    out = []
    for f in functions:
        params = schema_of(f["parameters"])
        params["type"] = "object"
        out.append(
            {
                "type": "function",
                "function": {
                    "name": openai_name(f["name"]),
                    "description": f.get("description", ""),
                    "parameters": params,
                },
            }
        )
    return out


# ---- the leaderboard's check (Python) -------------------------------------------------------
def _std(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _std_list(values: list) -> list:
    return [_std(v) if isinstance(v, str) else v for v in values]


def _answer_type(possible: list):
    return next((type(a) for a in possible if a != ""), None)


def _type_ok(value, expected, nested, possible: list) -> tuple[bool, bool]:
    """-> (valid, a variable): the value has the described type, its items too (one level), or
    the type of the possible answers (a variable's name written as a string). As the
    leaderboard's type_checker, including where a failed item check falls through."""
    answer_type = _answer_type(possible)
    variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, variable
        for a in possible:
            if not isinstance(a, list) or all(
                type(v) is nested or type(v) is _answer_type(a) for v in value
            ):
                return True, variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, variable


def _dict_ok(value: dict, possible: list) -> bool:
    for answer in possible:
        if answer == "" or not isinstance(answer, dict):
            continue
        if all(
            k in answer and (_std(v) if isinstance(v, str) else v) in _std_list(answer[k])
            for k, v in value.items()
        ) and all(k in value or "" in v for k, v in answer.items()):
            return True
    return False


def check_call(desc: dict, call: dict, answer: dict) -> str | None:
    """One call against one possible answer ({name: {param: [values]}}): None when it passes,
    else why not."""
    ((_, expected),) = answer.items()
    if desc["name"] not in call:
        return "wrong function"
    params, props = call[desc["name"]], desc["parameters"].get("properties", {})
    if not isinstance(params, dict):
        return "arguments not an object"
    for p in desc["parameters"].get("required", []):
        if p not in params:
            return f"missing required {p}"
    for p, value in params.items():
        if p not in props or p not in expected:
            return f"unexpected parameter {p}"
        kind = props[p].get("type", "string")
        py = PY_TYPES.get(kind, str)
        nested = (
            PY_TYPES.get((props[p].get("items") or {}).get("type", "string"), str)
            if kind in ("array", "tuple")
            else None
        )
        if kind == "float" and type(value) is int:
            value = float(value)
        ok, variable = _type_ok(value, py, nested, expected[p])
        if not ok:
            return f"wrong type for {p}"
        if not variable:
            if py is dict:
                if not _dict_ok(value, expected[p]):
                    return f"wrong value for {p}"
                continue
            if py is list and nested is dict:
                if not any(
                    isinstance(a, list)
                    and len(a) == len(value)
                    and all(_dict_ok(v, [d]) for v, d in zip(value, a))
                    for a in expected[p]
                ):
                    return f"wrong value for {p}"
                continue
            if py is str:
                if _std(value) not in [_std(a) for a in expected[p] if isinstance(a, str)]:
                    return f"wrong value for {p}"
                continue
            if py is list:
                lists = [_std_list(a) if isinstance(a, list) else a for a in expected[p]]
                if _std_list(value) not in lists:
                    return f"wrong value for {p}"
                continue
        if value not in expected[p]:
            return f"wrong value for {p}"
    for p, values in expected.items():
        if p not in params and "" not in values:
            return f"missing optional {p}"
    return None


def score(
    category: str, functions: list[dict], calls: list[dict], answer: list | None
) -> str | None:
    """The leaderboard's verdict on an entry's calls ([{name: args}]): None passes, else why."""
    if category == "irrelevance":
        return "made a call" if calls else None
    by_name = {f["name"]: f for f in functions}
    if len(calls) != len(answer):
        return f"{len(calls)} calls for {len(answer)}"
    if category in ("simple", "multiple"):
        ((name, _),) = answer[0].items()
        return check_call(by_name[name], calls[0], answer[0])
    used: set[int] = set()
    for a in answer:  # each answer takes the first unused call that fits
        ((name, _),) = a.items()
        hit = next(
            (
                i
                for i, c in enumerate(calls)
                if i not in used and check_call(by_name[name], c, a) is None
            ),
            None,
        )
        if hit is None:
            return f"no call matches {name}"
        used.add(hit)
    return None


# ---- reading answers ------------------------------------------------------------------------
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


def calls_in_text(text: str) -> list[dict] | None:
    """Calls written in the text (``plain``): -> [{"name", "arguments"}], [] for none, None when
    something call-like does not parse (a malformed call)."""
    blocks = _BLOCK.findall(text) or _FENCE.findall(text)
    if not blocks and text.strip().startswith("{"):
        blocks = [text.strip()]
    if not blocks:
        return []
    out = []
    for b in blocks:
        try:
            doc = json.loads(b)
        except ValueError:
            return None
        for d in doc if isinstance(doc, list) else [doc]:
            if not (
                isinstance(d, dict)
                and isinstance(d.get("name"), str)
                and isinstance(d.get("arguments"), dict)
            ):
                return None
            out.append(d)
    return out


def tools_system(tools: list[dict], model: str) -> str:
    """The system turn of the ``plain`` prompt: the model's default system text, then the tools
    as the format writes them (thor_app/server/tool_calls.py)."""
    from thor_app.server.tool_calls import TOOLS_SYSTEM

    head = next((v for k, v in DEFAULT_SYSTEM.items() if k in model.lower()), "")
    listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    section = TOOLS_SYSTEM.format(tools=listed)
    return f"{head}\n\n{section}" if head else section


# ---- the run --------------------------------------------------------------------------------
def _post(base: str, body: dict, timeout_s: float = 600) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def request_body(model: str, mode: str, entry: dict, max_tokens: int) -> dict:
    """The /v1/chat/completions body of one entry: ``grammar`` sends the tools, ``plain`` writes
    them into the system turn as the model's template would."""
    tools = tools_of(entry["function"])
    messages = [dict(m) for m in entry["question"][0]]
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if mode == "grammar":
        body.update(messages=messages, tools=tools)
    else:
        first = messages[0]["content"] if messages[0]["role"] == "system" else None
        system = (
            tools_system(tools, model) if first is None else f"{first}\n\n{tools_system(tools, '')}"
        )
        rest = [m for m in messages if m["role"] != "system"]
        body["messages"] = [{"role": "system", "content": system}] + rest
    return body


def ask(base: str, model: str, mode: str, entry: dict, max_tokens: int) -> dict:
    """One entry through the endpoint -> {"calls": [{name: args}], "malformed", "status",
    "latency_s", "prompt_tokens", "text"}."""
    body = request_body(model, mode, entry, max_tokens)
    tools = tools_of(entry["function"])
    t0 = time.perf_counter()
    status, doc = _post(base, body)
    out = {
        "status": status,
        "latency_s": time.perf_counter() - t0,
        "calls": [],
        "malformed": 0,
        "text": None,
        "prompt_tokens": (doc.get("usage") or {}).get("prompt_tokens"),
    }
    if status != 200:
        out["text"] = (doc.get("error") or {}).get("message")
        return out
    msg = doc["choices"][0]["message"]
    out["text"], out["finish_reason"] = msg.get("content"), doc["choices"][0]["finish_reason"]
    if mode == "grammar":
        found = []
        for c in msg.get("tool_calls") or []:
            try:
                args = json.loads(c["function"]["arguments"])
            except ValueError:
                out["malformed"] += 1
                continue
            found.append({"name": c["function"]["name"], "arguments": args})
    else:
        found = calls_in_text(msg.get("content") or "")
        if found is None:
            out["malformed"], found = 1, []
    calls, bad = checked_calls(found, tools)
    out["calls"], out["malformed"] = calls, out["malformed"] + bad
    return out


def checked_calls(found: list[dict], tools: list[dict]) -> tuple[list[dict], int]:
    """[{"name", "arguments"}] -> ([{name: arguments}], how many break their function's schema
    or name no function)."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    return [{c["name"]: c["arguments"]} for c in found], sum(not _valid(c, schemas) for c in found)


def _valid(call: dict, schemas: dict) -> bool:
    import jsonschema

    if call["name"] not in schemas:
        return False
    try:
        jsonschema.validate(call["arguments"], schemas[call["name"]])
    except jsonschema.ValidationError:
        return False
    return True


def _write_config(path: Path, model: str, spec: str, max_tokens: int) -> int:
    from thor_app.tools.bench_serve import _free_port

    port = _free_port()
    path.write_text(
        f"[server]\nport = {port}\n[model]\nname = {json.dumps(model)}\n"
        f"[speculation]\nmethod = {json.dumps(spec)}\n"
        f"[limits]\nqueue_size = 8\nrequest_timeout_s = 3600\nbatch = 1\n"
        f"max_tokens = {max(max_tokens, 16)}\n"
    )
    return port


def row_mode(r: dict) -> str:
    """A result row's column: thor's modes by name, a peer's as ``engine mode``."""
    engine = r.get("engine", "thor")
    return r["mode"] if engine == "thor" else f"{engine} {r['mode']}"


def summarize(rows: list[dict]) -> dict:
    """Per category and mode: accuracy, malformed calls, refused requests, latency."""
    out: dict = {}
    for r in rows:
        out.setdefault(r["category"], {}).setdefault(row_mode(r), []).append(r)
    table = {}
    for cat, modes in out.items():
        for mode, rs in modes.items():
            lat = [r["latency_s"] for r in rs if r["status"] == 200]
            table.setdefault(cat, {})[mode] = {
                "n": len(rs),
                "correct": sum(r["verdict"] is None for r in rs),
                "accuracy": sum(r["verdict"] is None for r in rs) / len(rs),
                "malformed": sum(r["malformed"] for r in rs),
                "refused": sum(r["status"] != 200 for r in rs),
                "latency_p50_s": statistics.median(lat) if lat else None,
                "latency_mean_s": statistics.fmean(lat) if lat else None,
            }
        if {"grammar", "plain"} <= set(modes):
            g = {r["id"]: r["prompt_tokens"] for r in modes["grammar"]}
            table[cat]["prompt_tokens_equal"] = all(
                g.get(r["id"]) == r["prompt_tokens"] for r in modes["plain"]
            )
    return table


def markdown(table: dict, meta: dict) -> str:
    lines = [
        f"model {meta['model']}, speculation {meta['spec']}, {meta['limit']} per category "
        f"(first in file order), max_tokens {meta['max_tokens']}",
        "",
        "| category | mode | accuracy | malformed | refused | p50 latency | mean latency |",
        "|---|---|---|---|---|---|---|",
    ]
    for cat, modes in table.items():
        for mode in [*MODES, *(f"{PEER} {m}" for m in MODES)]:
            s = modes.get(mode)
            if s is None:
                continue
            p50 = f"{s['latency_p50_s']:.2f} s" if s["latency_p50_s"] is not None else "-"
            mean = f"{s['latency_mean_s']:.2f} s" if s["latency_mean_s"] is not None else "-"
            acc = f"{s['correct']}/{s['n']} ({100 * s['accuracy']:.0f}%)"
            lines.append(
                f"| {cat} | {mode} | {acc} | {s['malformed']} | {s['refused']} | {p50} | {mean} |"
            )
    ratios = [
        f"{cat} {m}: {s[f'{PEER} {m}']['latency_p50_s'] / s[m]['latency_p50_s']:.2f}x"
        for cat, s in table.items()
        for m in MODES
        if s.get(m, {}).get("latency_p50_s") and (s.get(f"{PEER} {m}") or {}).get("latency_p50_s")
    ]
    if ratios:
        lines += ["", f"{PEER}'s p50 latency over thor's: " + ", ".join(ratios)]
    if meta.get("peer_skipped"):
        lines += ["", f"{PEER} not run: {meta['peer_skipped']}"]
    return "\n".join(lines) + "\n"


def run_tools(args) -> int:
    import tempfile

    from thor_app.flags import config_from_args
    from thor_app.tools.bench_report import write_results
    from thor_app.tools.bench_serve import _start_server, _wait_ready

    cats = [c.strip() for c in args.tools_categories.split(",") if c.strip()]
    modes = [m.strip() for m in args.tools_modes.split(",") if m.strip()]
    for c in cats:
        if c not in CATEGORIES:
            raise ThorError(
                f"unknown --tools-categories entry {c!r}; choose from {', '.join(CATEGORIES)}"
            )
    for m in modes:
        if m not in MODES:
            raise ThorError(f"unknown --tools-modes entry {m!r}; choose from {', '.join(MODES)}")
    root = data_dir(args.tools_data)
    model = config_from_args(args).model.name
    spec = args.spec.split(",")[0].strip()
    data = {c: load_category(root, c, args.tools_limit) for c in cats}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "thor.toml"
        port = _write_config(cfg, model, spec, args.max_tokens)
        proc = _start_server(cfg, args.threads, Path(tmp) / "serve.log")
        try:
            _log(f"waiting for thor serve on port {port} (load, warm-up, self-test) ...")
            _wait_ready(proc, port, Path(tmp) / "serve.log")
            base = f"http://127.0.0.1:{port}"
            for cat in cats:
                for mode in modes:
                    for entry, answer in data[cat]:
                        r = ask(base, model, mode, entry, args.max_tokens)
                        calls = _original_names(r["calls"], entry)
                        verdict = (
                            score(cat, entry["function"], calls, answer)
                            if r["status"] == 200
                            else f"HTTP {r['status']}"
                        )
                        r.update(id=entry["id"], category=cat, mode=mode, verdict=verdict)
                        rows.append(r)
                    done = [r for r in rows if r["category"] == cat and r["mode"] == mode]
                    _log(f"{cat} {mode}: {sum(r['verdict'] is None for r in done)}/{len(done)}")
        finally:
            proc.terminate()
            proc.wait(60)
    # the peer after thor's server has gone: neither shares the CPU with the other
    peer_rows, peer_meta = run_llama(args, model, data, modes)
    rows += peer_rows
    meta = {
        "model": model,
        "spec": spec,
        "limit": args.tools_limit or "all",
        "max_tokens": args.max_tokens,
        "bfcl_eval": BFCL_VERSION,
        "threads": args.threads,
        **peer_meta,
    }
    table = summarize(rows)
    doc = {"settings": meta, "summary": table, "entries": rows}
    return write_results(args.json_out, doc, markdown(table, meta))


def _original_names(calls: list[dict], entry: dict) -> list[dict]:
    """The service's names (``.`` as ``_``) back to the leaderboard's."""
    names = {openai_name(f["name"]): f["name"] for f in entry["function"]}
    return [{names.get(k, k): v for k, v in c.items()} for c in calls]


# ---- llama.cpp on the same GGUF (thor_app/tools/peers/llama_tools.py) -------------------------
def prompt_ids(tok, model: str, mode: str, entry: dict) -> list[int]:
    """The token ids thor's service decodes for this entry in this mode: its chat template over
    the same messages, the tools rendered as the service renders them."""
    from thor_app.server.tool_calls import conversation, template_knows_tools

    body = request_body(model, mode, entry, 0)
    native = template_knows_tools(tok.chat_template)
    messages, extra = conversation(body["messages"], body.get("tools") or [], native)
    return tok.encode_chat(messages, **extra)


def run_llama(args, model: str, data: dict, modes: list[str]) -> tuple[list[dict], dict]:
    """llama.cpp's answers to the same entries, on the same GGUF and prompt tokens, read and
    scored as thor's ``plain`` answers -> (rows, settings)."""
    import os
    import subprocess
    import tempfile

    from thor_app.tools.peers.driver import _has, peers_python
    from thor_runtime.loading import gguf_config_and_tokenizer, resolve

    path = resolve(model)
    python = peers_python(getattr(args, "peers_python", None))
    why = "no peers venv (run `make bench-peers`)" if python is None else _has(python, "llama_cpp")
    if why is None and path.suffix != ".gguf":
        why = f"{model} is not a GGUF file"
    if why:
        _log(f"{PEER} skipped: {why}")
        return [], {"peer_skipped": why}
    tok = gguf_config_and_tokenizer(path)[2]
    entries, index = [], {}
    for cat, rows in data.items():
        for mode in modes:
            for entry, answer in rows:
                key = f"{cat}/{mode}/{entry['id']}"
                ids = prompt_ids(tok, model, mode, entry)
                index[key] = (cat, mode, entry, answer, len(ids))
                entries.append(
                    {"key": key, "mode": mode, "ids": ids, "tools": tools_of(entry["function"])}
                )
    spec = {
        "model": str(path),
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "entries": entries,
    }
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": str(args.threads)}
    _log(f"{PEER}: {len(entries)} requests on {path.name} ...")
    with tempfile.TemporaryDirectory() as d:
        sp, op = Path(d) / "spec.json", Path(d) / "out.json"
        sp.write_text(json.dumps(spec))
        cmd = [python, "-m", "thor_app.tools.peers.llama_tools", str(sp), str(op)]
        r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=None)
        if r.returncode != 0:
            why = f"{PEER} exited with status {r.returncode}"
            _log(why)
            return [], {"peer_skipped": why}
        done = json.loads(op.read_text())
    rows = []
    for a in done["answers"]:
        cat, mode, entry, answer, n_prompt = index[a["key"]]
        tools = tools_of(entry["function"])
        found = calls_in_text(a["text"])
        calls, bad = checked_calls(found or [], tools)
        calls = _original_names(calls, entry)
        rows.append(
            {
                "engine": PEER,
                "id": entry["id"],
                "category": cat,
                "mode": mode,
                "status": 200,
                "latency_s": a["latency_s"],
                "text": a["text"],
                "calls": calls,
                "malformed": bad + (found is None),
                "prompt_tokens": n_prompt,
                "verdict": score(cat, entry["function"], calls, answer),
            }
        )
    for cat in data:
        for mode in modes:
            got = [r for r in rows if r["category"] == cat and r["mode"] == mode]
            _log(f"{cat} {PEER} {mode}: {sum(r['verdict'] is None for r in got)}/{len(got)}")
    return rows, {"peer": done["version"], "peer_load_s": done["load_s"]}
