"""`thor bench --neighbour` — decode speed with and without one CPU-bound process beside it.

On a robot the CPU is shared with perception and control. A runtime whose thread pools spin,
or ask for every core, loses far more than the neighbour's share when one other process is
busy (every barrier waits for the thread that is off its core). This mode measures that:
greedy decode of the same prompt, quiet and beside one busy process (a Python loop, started
here and killed after each run), interleaved so drift on a shared machine hits every mode alike.

Modes (threads.py): ``quiet`` and ``neighbour`` as the runtime runs by default (the row
kernel's pool follows the idle cores, torch's keeps its size); ``neighbour-fixed``: every pool
keeps the threads it was given (THOR_ADAPT_THREADS=0); ``neighbour-adaptive``: torch's pool
follows the idle cores too (THOR_ADAPT_THREADS=1).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("quiet", "neighbour", "neighbour-fixed", "neighbour-adaptive")
ADAPT = {
    "neighbour-fixed": "0",
    "neighbour-adaptive": "1",
}  # THOR_ADAPT_THREADS per mode; else unset
PROMPT = (
    "Plan how a mobile manipulator should move the red mug from the kitchen counter "
    "to the dish rack. "
    "List the steps as JSON with skill names and arguments."
)
# Pure-Python spin: one core, no memory traffic to speak of, no threads of its own; it ends
# with the process that started it, even one killed before it could stop it.
SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"


def start_neighbour() -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL)
    time.sleep(0.3)  # running before the first step is timed (interpreter start-up)
    return p


def stop_neighbour(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def _load() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def measure(rt, ids, params, mode: str) -> dict:
    """One greedy decode in ``mode``; the threads the governor ended on."""
    from thor_runtime.engine import ENV

    before = os.environ.pop(ENV, None)
    if mode in ADAPT:
        os.environ[ENV] = ADAPT[mode]
    nb = start_neighbour() if mode != "quiet" else None
    try:
        res = rt.generate(ids, params)
    finally:
        if nb is not None:
            stop_neighbour(nb)
        os.environ.pop(ENV, None)
        if before is not None:
            os.environ[ENV] = before
    s = res.stats.to_dict()
    rows = getattr(rt.model.runner, "rows", None)
    return {
        "decode_tok_s": s["decode_tok_s"],
        "threads_after": rt.threads.current,
        "row_kernel_threads_after": getattr(rows, "threads", None),
        "decode_kernel": s.get("decode_kernel"),
    }


def summarize(samples: dict[str, list[dict]]) -> dict:
    out = {}
    quiet = (
        statistics.median(x["decode_tok_s"] for x in samples["quiet"])
        if samples.get("quiet")
        else None
    )
    for mode, xs in samples.items():
        tok = [x["decode_tok_s"] for x in xs]
        med = statistics.median(tok)
        out[mode] = {
            "decode_tok_s_median": round(med, 2),
            "decode_tok_s": [round(t, 2) for t in tok],
            "threads_after": [x["threads_after"] for x in xs],
            "row_kernel_threads_after": [x.get("row_kernel_threads_after") for x in xs],
            "vs_quiet": round(med / quiet, 3) if quiet else None,
        }
    return out


def print_table(summary: dict) -> None:
    print(f"{'mode':<17}{'decode tok/s (median)':>22}{'vs quiet':>10}  samples")
    for mode, r in summary.items():
        print(
            f"{mode:<17}{r['decode_tok_s_median']:>22.1f}{r['vs_quiet'] or 0:>10.2f}  "
            f"{', '.join(f'{t:.1f}' for t in r['decode_tok_s'])}"
        )


def run_neighbour(args, config) -> int:
    import torch

    from thor_app.assembly import load_model, make_runtime, with_settings
    from thor_app.tools.bench_report import device_info
    from thor_runtime.engine import SamplingParams

    threads = torch.get_num_threads()  # before any run: the governor may lower it
    loaded = load_model(config)
    # every prompt prefilled whole: only decode is compared, and the same work in every mode
    rt = make_runtime(with_settings(config, model__prefix_cache=0), loaded)
    ids = loaded.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rt.generate(ids, SamplingParams(max_tokens=4))  # warm-up
    torch.set_num_threads(threads)
    load_before = _load()
    samples: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in MODES:
            print(f"bench --neighbour: repeat {r + 1}/{args.repeats}, {mode} ...", file=sys.stderr)
            samples[mode].append(measure(rt, ids, params, mode))
            torch.set_num_threads(threads)  # every run starts from the same pool
    summary = summarize(samples)
    results = {
        "device": device_info(config),
        "model": config.model.name,
        "dtype": config.model.dtype,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "threads": threads,
        "decode_kernel": samples["quiet"][-1]["decode_kernel"],
        "neighbour": SPIN,
        "loadavg_before": load_before,
        "loadavg_after": _load(),
        "modes": summary,
    }
    Path(args.json_out).write_text(json.dumps(results, indent=1))
    print_table(summary)
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0
