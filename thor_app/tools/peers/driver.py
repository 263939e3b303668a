"""`thor bench --peers`: every peer configuration in its own process, repeats interleaved.

Writes peers.json (machine, versions, raw and median figures), peers.md (the table) and PNG
plots (decode tok/s, plan latency, acceptance by draft position) into --out-dir. A peer that
is not installed is skipped with the reason printed. With ``neighbour``, every configuration
also runs beside one CPU-bound process (bench_neighbour.py's), interleaved with its quiet run,
so each engine is measured under the same load.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from thor_runtime.errors import ThorError

# free-text chat, planning in other wordings (the drafter's off-distribution cases)
DECODE_PROMPTS = [
    "Tell me a short story about a lighthouse keeper who befriends a seagull.",
    "What are three good habits for staying focused while studying?",
    "Our warehouse robot should fetch the blue crate from aisle 4 "
    "and drop it at packing station 2. "
    "Describe the steps it should take.",
    "Plan how a mobile manipulator should move the red mug from the kitchen counter "
    "to the dish rack. "
    "List the steps as JSON with skill names and arguments.",
]
FULL = {"max_tokens": 128, "plan_max_tokens": 384, "decode_prompts": 4, "plans": 6, "repeats": 3}
SHORT = {"max_tokens": 8, "plan_max_tokens": 24, "decode_prompts": 1, "plans": 1, "repeats": 1}
THOR_FULL = [
    "int4/none",
    "int4/ngram",
    "int4/dflash",
    "int4/hybrid",
    "int4/auto",
    "int4@torch/none",
    "int8/none",
    "bf16/none",
    "fp32/none",
]
THOR_SHORT = ["int4/none", "int4/auto"]


def parse_configs(text: str | None) -> list[str] | None:
    """--peers-configs: "int4/none,int4@torch/auto" -> the list, each checked (None: the
    defaults)."""
    from thor_app.tools.bench_report import BENCH_WEIGHTS
    from thor_runtime.speculative import SPEC_METHODS

    if text is None:
        return None
    out = [c.strip() for c in text.split(",") if c.strip()]
    for c in out:
        weights, _, method = c.partition("/")
        dtype, _, kernel = weights.partition("@")
        if (
            dtype not in BENCH_WEIGHTS
            or method not in SPEC_METHODS
            or kernel not in ("", "auto", "ort", "torch")
            or (kernel and dtype != "int4")
        ):
            raise ThorError(
                f"bad --peers-configs entry {c!r}; "
                f"expected WEIGHTS[@KERNEL]/SPEC like int4/none or "
                f"int4@torch/auto (SPEC one of {', '.join(SPEC_METHODS)})"
            )
    if not out:
        raise ThorError("--peers-configs is empty")
    return out


def peers_python(arg: str | None) -> str | None:
    p = arg or os.environ.get("THOR_PEERS_PYTHON") or ".venv-peers/bin/python"
    return p if Path(p).is_file() else None


def _has(python: str, module: str) -> str | None:
    """None when ``python`` can import ``module``, else the reason."""
    r = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["import failed"])[-1]


# The request before each timed one in the warm measure: same world and skills, another task.
WARM_TASK = "wait here for the next instruction"


def make_requests(model: str, cfg: dict) -> dict:
    from agent.planner.planner import prepare_request
    from agent.planner.prompt import build_messages
    from agent.schema.grammar import GrammarTokenizer
    from evals.plan_bench import plan_cases
    from thor_runtime.loading import gguf_config_and_tokenizer, resolve

    tok = gguf_config_and_tokenizer(resolve(model))[2]
    gtok = GrammarTokenizer(tok)
    plans = []
    for _, task, world, skills in plan_cases(cfg["plans"]):
        plans.append(
            {
                "ids": tok.encode_chat(build_messages(task, world, skills)),
                "schema": prepare_request(gtok, world, skills, task=task).schema,
                # another request in the same world, run just before for the warm latency
                "warm": tok.encode_chat(build_messages(WARM_TASK, world, skills)),
            }
        )
    long = []
    while len(long) < 400:
        long += tok.encode(" ".join(DECODE_PROMPTS))
    return {
        "decode": [
            tok.encode_chat([{"role": "user", "content": p}])
            for p in DECODE_PROMPTS[: cfg["decode_prompts"]]
        ],
        "long": long[:400],
        "plans": plans,
    }


def _run(python: str, spec: dict, env: dict) -> dict:
    with tempfile.TemporaryDirectory() as d:
        sp, op = Path(d) / "spec.json", Path(d) / "out.json"
        sp.write_text(json.dumps(spec))
        r = subprocess.run(
            [python, "-m", "thor_app.tools.peers.worker", str(sp), str(op)],
            env=env,
            capture_output=True,
            text=True,
        )
        if (
            r.returncode < 0
            and spec["engine"] == "llama.cpp"
            and spec.get("llama_extra_buffers", True)
        ):
            # llama.cpp's AMX buffer type crashes on some CPUs that report AMX (seen: signal 11 in
            # its first decode on a 2-vCPU Xeon VM); its plain CPU buffers run there
            out = _run(python, {**spec, "llama_extra_buffers": False}, env)
            if "error" not in out:
                out["version"] += (
                    f", extra buffer types off (with them: killed by signal {-r.returncode})"
                )
            return out
        if r.returncode != 0:
            return {"error": (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]}
        return json.loads(op.read_text())


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def _p90(xs):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))], 3) if xs else None


def run_peers(
    model: str,
    out_dir: Path,
    short: bool = False,
    peers_py: str | None = None,
    threads: int = 2,
    log=print,
    configs: list[str] | None = None,
    neighbour: bool = False,
    transformers: bool = True,
    **counts,
) -> dict:
    """configs: thor's configurations (default THOR_FULL or THOR_SHORT); transformers: run it
    too; counts: overrides of max_tokens, plan_max_tokens, decode_prompts, plans, repeats."""
    from thor_app.tools.bench_neighbour import start_neighbour, stop_neighbour
    from thor_app.tools.bench_report import device_info
    from thor_runtime.loading import resolve

    cfg = {**(SHORT if short else FULL), **{k: v for k, v in counts.items() if v is not None}}
    path = str(resolve(model))
    if not path.endswith(".gguf"):
        raise ThorError(
            "--peers compares engines on one GGUF file: pass --model default or a .gguf"
        )
    requests = make_requests(model, cfg)
    root = str(Path(__file__).resolve().parents[3])
    env = {
        **os.environ,
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": str(threads),
    }
    runs: list[tuple[str, str, str]] = []  # (engine, config, python)
    skipped = {}
    lp = peers_python(peers_py)
    reason = "no peers venv (run `make bench-peers`)" if lp is None else _has(lp, "llama_cpp")
    if reason:
        skipped["llama.cpp"] = reason
    else:
        runs.append(("llama.cpp", "greedy", lp))
    reason = (
        _has(sys.executable, "transformers") if transformers else "not asked for (--no-baseline)"
    )
    if reason:
        skipped["transformers"] = reason
    else:
        runs += [
            ("transformers", c, sys.executable)
            for c in (["greedy"] if short else ["greedy", "prompt-lookup"])
        ]
    runs += [("thor", c, sys.executable) for c in (configs or (THOR_SHORT if short else THOR_FULL))]
    for k, v in skipped.items():
        log(f"peers: {k} skipped: {v}")
    if any(c.startswith(("int4", "auto")) for e, c, _ in runs if e == "thor"):
        log(
            "peers: preparing thor's weight cache "
            "(a first start builds it; the runs measure warm starts)"
        )
        for kernel in ("auto", "torch"):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "thor_app.tools.peers.worker",
                    "--prepare",
                    f"int4@{kernel}/none",
                    path,
                ],
                env=env,
                check=True,
            )
    loads = ("quiet", "neighbour") if neighbour else ("quiet",)
    raw: dict[str, list[dict]] = {_key(e, c, ld): [] for e, c, _ in runs for ld in loads}
    for rep, (engine, config, python), load in (
        (r, x, ld) for r in range(cfg["repeats"]) for x in runs for ld in loads
    ):
        # interleaved: one repeat of every peer (quiet, then beside the neighbour) at a time
        log(
            f"peers: repeat {rep + 1}/{cfg['repeats']} {engine} {config}"
            + (f" ({load})" if neighbour else "")
        )
        spec = {
            "engine": engine,
            "config": config,
            "model": path,
            "requests": requests,
            "threads": threads,
            "max_tokens": cfg["max_tokens"],
            "plan_max_tokens": cfg["plan_max_tokens"],
        }
        if engine == "transformers" or (
            engine == "thor" and config.endswith("none") and not config.startswith("int4")
        ):
            spec["requests"] = {**requests, "plans": []}  # plans: llama.cpp vs thor's int4 rows
        busy = start_neighbour() if load == "neighbour" else None
        try:
            raw[_key(engine, config, load)].append(_run(python, spec, env))
        finally:
            if busy is not None:
                stop_neighbour(busy)
    rows = []
    for (engine, config, _), load in ((x, ld) for x in runs for ld in loads):
        key = _key(engine, config, load)
        rs = [r for r in raw[key] if "error" not in r]
        if not rs:
            log(f"peers: {engine} {config} ({load}) failed: {raw[key][0]['error']}")
            continue
        lat = [x for r in rs for x in r.get("plan_latency_s", [])]
        acc = [x for r in rs for x in r.get("accept_length", [])]
        pos = [r["accept_by_position"] for r in rs if r.get("accept_by_position")]
        rows.append(
            {
                "engine": engine,
                "config": config,
                "load": load,
                "version": rs[0].get("version"),
                "load_s": _median([r["load_s"] for r in rs]),
                "peak_rss_mb": _median([r["peak_rss_mb"] for r in rs]),
                "prefill_tok_s": _median([r["prefill_tok_s"] for r in rs]),
                "decode_tok_s": _median([x for r in rs for x in r["decode_tok_s"]]),
                "decode_tok_s_per_prompt": [
                    _median([r["decode_tok_s"][i] for r in rs])
                    for i in range(len(rs[0]["decode_tok_s"]))
                ],
                "plan_latency_median_s": _median(lat),
                "plan_latency_p90_s": _p90(lat),
                "plan_warm_median_s": _median(
                    [x for r in rs for x in r.get("plan_warm_latency_s", [])]
                ),
                "prefix_cache_mb": _median([r.get("prefix_cache_mb") for r in rs]),
                "accept_length": _median(acc) if acc else None,
                # per prompt, the median over repeats of speculative / plain in one process;
                # the lowest prompt is what "never slower" is judged on
                "vs_plain_paired_min": min(
                    _median([r["vs_plain_paired"][i] for r in rs])
                    for i in range(len(rs[0]["vs_plain_paired"]))
                )
                if rs[0].get("vs_plain_paired")
                else None,
                "verify16_x_step": _median([r.get("verify16_x_step") for r in rs]),
                "accept_by_position": [round(statistics.mean(v), 3) for v in zip(*pos)]
                if pos
                else None,
            }
        )
    quiet = {(r["engine"], r["config"]): r["decode_tok_s"] for r in rows if r["load"] == "quiet"}
    for r in rows:
        q = quiet.get((r["engine"], r["config"]))
        r["decode_vs_quiet"] = round(r["decode_tok_s"] / q, 3) if q and r["decode_tok_s"] else None
    doc = {
        "machine": device_info(),
        "model": Path(path).name,
        "threads": threads,
        "short": short,
        **cfg,
        "neighbour": neighbour,
        "skipped": skipped,
        "rows": rows,
        "raw": raw,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "peers.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "peers.md").write_text(markdown_table(rows))
    plots(rows, out_dir, log)
    log(markdown_table(rows))
    return doc


def _key(engine: str, config: str, load: str) -> str:
    return f"{engine}:{config}" + ("" if load == "quiet" else f"+{load}")


COLUMNS = [
    "engine",
    "config",
    "load",
    "decode_vs_quiet",
    "load_s",
    "peak_rss_mb",
    "prefill_tok_s",
    "decode_tok_s",
    "verify16_x_step",
    "plan_latency_median_s",
    "plan_latency_p90_s",
    "plan_warm_median_s",
    "accept_length",
    "vs_plain_paired_min",
]


def markdown_table(rows) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append(
            "| " + " | ".join("" if r.get(c) is None else str(r[c]) for c in COLUMNS) + " |"
        )
    return "\n".join(lines) + "\n"


def plots(rows, out_dir: Path, log) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("peers: matplotlib not installed, no plots")
        return
    names = [f"{r['engine']}\n{r['config']}" for r in rows]
    for key, fname, label in (
        ("decode_tok_s", "peers-decode.png", "decode tok/s (median)"),
        ("plan_latency_median_s", "peers-plan-latency.png", "plan latency s (median)"),
    ):
        sel = [(n, r[key]) for n, r in zip(names, rows) if r.get(key)]
        if not sel:
            continue
        fig, ax = plt.subplots(figsize=(max(6, len(sel) * 1.1), 4))
        ax.bar([n for n, _ in sel], [v for _, v in sel], color="#4477aa")
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
    sel = [
        (n.replace("\n", " "), r["accept_by_position"])
        for n, r in zip(names, rows)
        if r.get("accept_by_position")
    ]
    if sel:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n, v in sel:
            ax.plot(range(1, len(v) + 1), v, marker="o", label=n)
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "peers-acceptance.png", dpi=110)
        plt.close(fig)
