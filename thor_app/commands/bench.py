"""`thor bench` — this runtime side by side with transformers' generate, in one run.

Prefill is timed on a long (~400-token) robot prompt; decode on chat prompts with
greedy decoding. Every number is a median over repeats. Speculative rows also pass the
losslessness gate (spec/lossless.py) against the plain rows: identical tokens, or a divergence
that is a numerical tie under a fresh reference forward. Plain rows measure that noise floor:
the same plain decoding at one thread, judged the same way.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from thor_app.assembly import build_speculation, load_model, make_backend, make_runtime, with_settings
from thor_app.flags import add_config_args, config_from_args
from thor_runtime.errors import ThorError
from thor_runtime.runtime_config import ENGINE_BACKENDS, KV_DTYPES
from thor_runtime.speculative import SPEC_METHODS
from .common import non_negative_int, positive_int


BENCH_PROMPTS = [
    "Plan how a mobile manipulator should move the red mug from the kitchen counter to the dish rack. "
    "List the steps as JSON with skill names and arguments.",
    "The robot must pick up the screwdriver from the lab bench and hand it to the technician. "
    "Give a numbered plan with preconditions for each step.",
    "Write a JSON plan: navigate to shelf A3, pick the blue box (1.2 kg), place it on pallet 2, "
    "then return to the charging dock.",
]
LONG_PROMPT = ("World: objects red_mug (0.3 kg) at [0.4, 0.1, 0.9], blue_box (1.2 kg) at [1.1, -0.3, 0.5], "
               "screwdriver (0.1 kg) at [0.2, 0.5, 0.8]; places counter, dish_rack, shelf_a3, pallet_2, dock. "
               "Skills: navigate(place), pick(object), place(object, place), open(object), close(object). ")


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark prefill/decode against transformers (JSON + table)")
    add_config_args(p, ("model",), only={"model.name", "model.device", "model.weight_cache"})
    p.add_argument("--configs", default="fp32/fp32,fp32/fp8,bf16/fp32,bf16/fp8,int8/bf16,int8/fp8",
                   help="comma list of WEIGHTS/KV dtype pairs")
    p.add_argument("--spec", default="none", help=f"comma list of {'|'.join(SPEC_METHODS)}")
    add_config_args(p, ("speculation",), only={"speculation.drafter", "speculation.block_size",
                                                "speculation.window"})
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--prefill-tokens", type=positive_int, default=400)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument("--prefix-cache", type=non_negative_int, default=None,
                   help="plan benches: keep the K/V of this many recent prompts, as `thor plan` and "
                        "`thor serve` do (default 0: every prompt prefilled whole; --serve: the service's "
                        "default, on both sides)")
    p.add_argument("--tie-tol", type=float, default=None,
                   help="losslessness gate: max logit regret for a divergence to count as a numerical tie "
                        "(default: speculative/lossless.py's DEFAULT_TIE_TOL)")
    p.add_argument("--no-baseline", action="store_true", help="skip transformers' generate")
    p.add_argument("--neighbour", action="store_true",
                   help="decode quiet and beside one CPU-bound process (bench_neighbour.py)")
    p.add_argument("--plan", action="store_true",
                   help="benchmark constrained planning (thor plan) on the sample worlds instead")
    p.add_argument("--rollback", action="store_true",
                   help="hybrid (Gated-DeltaNet) target: speculative cycle with checkpoint-slot rollback vs "
                        "snapshot + re-forward, at each K of --ks, on a random ~100M-parameter hybrid")
    p.add_argument("--peers", action="store_true",
                   help="llama.cpp, transformers and thor side by side on the same GGUF, each in its own "
                        "process (JSON, Markdown table and plots in --out-dir); see `make bench-peers`")
    p.add_argument("--short", action="store_true", help="with --peers: tiny counts (a smoke run)")
    p.add_argument("--peers-python", default=None,
                   help="with --peers: the python of the peers' venv (default .venv-peers/bin/python)")
    p.add_argument("--out-dir", default="bench/peers", help="with --peers: where the results go")
    p.add_argument("--threads", type=positive_int, default=2, help="with --peers / --serve: threads of every engine (--serve: the server's and the "
                        "in-process side's)")
    p.add_argument("--peers-repeats", type=positive_int, default=None, help="with --peers: repeats (default 3)")
    p.add_argument("--peers-max-tokens", type=positive_int, default=None,
                   help="with --peers: decode tokens per prompt (default 128)")
    p.add_argument("--peers-plans", type=positive_int, default=None, help="with --peers: plan requests (default 6)")
    p.add_argument("--ks", default="3,7,15", help="with --rollback: comma list of K (drafts per cycle)")
    p.add_argument("--accept", default="half", choices=("half", "none", "all-but-one"),
                   help="with --rollback: drafts accepted per cycle (K//2, 0 or K-1)")
    p.add_argument("--plan-set", choices=["sample", "eval"], default="sample",
                   help="--plan: sample = latency per --spec on the sample worlds; eval = the held-out "
                        "evaluation (agent/evalsets/): task success, refusals, unsafe plans per model")
    p.add_argument("--models", default=None, help="--plan-set eval: comma list of models (default: --model)")
    p.add_argument("--solver", choices=["both", "on", "off"], default="both",
                   help="--plan-set eval: steps completed from the model's goal (on), the model's own (off), or both")
    p.add_argument("--attempts", type=int, default=2, help="--plan-set eval: repair attempts per task")
    p.add_argument("--eval-limit", type=positive_int, default=None, help="--plan-set eval: an evenly spread subset")
    p.add_argument("--eval-dir", default=None,
                   help="--plan-set eval: the evaluation set's directory (tasks.json, worlds/); default the first set, "
                        "the others are agent/evalsets/*")
    p.add_argument("--serve", action="store_true",
                   help="benchmark `thor serve` over loopback (plan req/s, p50/p99, TTFT) against in-process plans")
    p.add_argument("--serve-clients", default="1,4,16", help="--serve: comma list of concurrent client counts")
    p.add_argument("--serve-world", default="kitchen", help="--serve: sample world the plans use")
    p.add_argument("--json", dest="json_out", default="bench.json", help="where to write the JSON results")
    p.add_argument("--backend", default="torch", help=f"comma list of {'|'.join(ENGINE_BACKENDS)}")
    add_config_args(p, ("engine",), only={"engine.cache_dir", "engine.threads", "engine.ort_opt_level",
                                          "engine.trt_precision", "engine.fp8_scales"})
    p.add_argument("--engine-forms", default="segments,fused",
                   help="with a graph backend: comma list of export forms to measure side by side")
    p.add_argument("--ort-sweep", action="store_true",
                   help="with onnxruntime: also measure graph optimization levels and intra-op thread counts")
    p.set_defaults(func=run)


def run_rollback(args) -> int:
    from thor_runtime.hybrid.rollback_bench import bench_rollback

    try:
        ks = [int(x) for x in args.ks.split(",") if x.strip()]
    except ValueError:
        raise ThorError(f"bad --ks {args.ks!r}; expected a comma list of integers like 3,7,15") from None
    if not ks or min(ks) < 1 or max(ks) > 63:
        raise ThorError(f"--ks values must be in 1..63, got {args.ks!r}")
    res = bench_rollback(ks, repeats=args.repeats, accept=args.accept, log=print)
    res["device"] = device_info(config_from_args(args))
    Path(args.json_out).write_text(json.dumps(res, indent=1))
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0


def device_info(config=None) -> dict:
    """The machine, and with a config the device its model runs on (``model_device``)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine()}
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    if config is not None:
        from thor_runtime.device import device_name, resolve_device

        info["model_device"] = device_name(resolve_device(config.model.device))
    return info


def peak_rss_mb() -> float:
    """This process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS)."""
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(r / (1 << 20 if sys.platform == "darwin" else 1 << 10), 1)


def _median(xs):
    return round(statistics.median(xs), 3) if xs else None


def _long_ids(tok, n):
    ids = []
    while len(ids) < n:
        ids += tok.encode(LONG_PROMPT)
    return ids[:n]


def bench_runtime(config, loaded, kv, spec_name, args, prompts, reference=None):
    import torch

    from thor_runtime.sampling import SamplingParams
    from thor_runtime.speculative.lossless import judge, summarize

    # every prompt prefilled whole: the prefix cache would time a different prefill per repeat
    rt = make_runtime(with_settings(config, model__kv_dtype=kv, model__prefix_cache=0), loaded)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    long_ids = _long_ids(loaded.tokenizer, args.prefill_tokens)
    prefill, decode, accept_len, per_pos, outputs = [], [], [], [], []
    rt.generate(prompts[0][:8], SamplingParams(max_tokens=2))  # warm-up (allocator, kernels)
    for r in range(args.repeats):
        prefill.append(rt.generate(long_ids, SamplingParams(max_tokens=1)).stats.to_dict()["prefill_tok_s"])
        for i, ids in enumerate(prompts):
            spec = build_speculation(with_settings(config, speculation__method=spec_name.split("-")[0],
                                                   speculation__seed_window=not spec_name.endswith("noseed")),
                                     loaded)
            res = rt.generate(ids, params, spec)
            s = res.stats.to_dict()
            decode.append(s["decode_tok_s"])
            if spec.proposer is not None:
                accept_len.append(s["accept_length_mean"])
                per_pos.append(s["accept_per_position"])
            if r == 0:
                outputs.append(res.token_ids)
    row = {"prefill_tok_s": _median(prefill), "decode_tok_s": _median(decode)}
    if accept_len:
        width = max(len(p) for p in per_pos)
        row["accept_length_mean"] = _median(accept_len)
        row["accept_per_position"] = [round(statistics.mean(p[j] for p in per_pos if len(p) > j), 3)
                                      for j in range(width)]
    if reference is not None:
        row["tokens_identical_to_plain"] = outputs == reference
        row.update(summarize([judge(rt, p, a, b, args.tie_tol) for p, a, b in zip(prompts, reference, outputs)]))
    elif spec_name == "none" and torch.get_num_threads() > 1:
        row["plain_1thread"] = _one_thread_gate(rt, prompts, outputs, params, args.tie_tol)
    return row, outputs


def _one_thread_gate(rt, prompts, outputs, params, tol) -> dict:
    """Plain decoding again at one thread, judged against itself: the numerical noise floor a
    speculative row's divergences are compared with."""
    import torch

    from thor_runtime.speculative.lossless import judge, summarize

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        again = [rt.generate(ids, params).token_ids for ids in prompts]
    finally:
        torch.set_num_threads(n)
    return summarize([judge(rt, p, a, b, tol) for p, a, b in zip(prompts, outputs, again)])


def bench_transformers(path, dtype, args, prompts, long_ids):
    import torch

    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    p = Path(path)
    kw = {"gguf_file": p.name} if p.suffix == ".gguf" else {}
    src = p.parent if p.suffix == ".gguf" else p
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=dtype, **kw).eval()
    hf.generation_config.eos_token_id = None
    torch_ids = [torch.tensor([ids]) for ids in prompts]

    def gen(ids, n):
        t = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(ids), pad_token_id=0)
        return time.perf_counter() - t

    gen(torch_ids[0][:, :8], 2)
    prefill, decode = [], []
    for _ in range(args.repeats):
        prefill.append(len(long_ids) / gen(torch.tensor([long_ids]), 1))
        for ids in torch_ids:
            t1, tn = gen(ids, 1), gen(ids, args.max_tokens)
            decode.append((args.max_tokens - 1) / max(tn - t1, 1e-9))
    return {"prefill_tok_s": _median(prefill), "decode_tok_s": _median(decode)}


EVAL_COLUMNS = ["model", "solver", "tasks", "task_success", "feasible_success", "correct_refusals", "valid",
                "executable", "completed_by_solver", "first_attempt_model_alone", "unsafe_on_exit0", "attempts_mean",
                "latency_median_s"]


def _eval_dir(given: str | None) -> tuple[Path, str]:
    """-> (the evaluation set's directory, how the results name it). A relative path that is
    not under the working directory is looked up in the source tree, so `agent/evalsets/NAME` works
    from anywhere."""
    from agent.evaluation import EVAL_DIR

    if given is None:
        return EVAL_DIR, "agent/evalsets/1-greenhouse-workshop-pharmacy-depot"
    p = Path(given)
    if not p.is_dir() and not p.is_absolute() and (EVAL_DIR.parents[2] / p).is_dir():
        p = EVAL_DIR.parents[2] / p
    if not (p / "tasks.json").is_file():
        raise ThorError(f"--eval-dir {given}: no tasks.json there (an evaluation set is tasks.json + worlds/)")
    return p, given


def run_eval(args, specs) -> int:
    from agent.bench import eval_bench
    from agent.evaluation import load_eval_set

    if args.attempts < 0:
        raise ThorError(f"--attempts must be >= 0, got {args.attempts}")
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.solver]
    eval_dir, eval_name = _eval_dir(args.eval_dir)
    load_eval_set(eval_dir)             # a bad set fails here, before any model is loaded
    wdt, kv = args.configs.split(",")[0].strip().split("/")
    config = _plan_config(args, wdt, kv)
    models = [m.strip() for m in (args.models or config.model.name).split(",") if m.strip()]
    rows = []
    for m in models:
        loaded = load_model(config, name=m)
        rt = make_runtime(config, loaded)
        for r in eval_bench(rt, loaded.tokenizer, specs[0], config.speculation.drafter or None, modes, args.attempts,
                            limit=args.eval_limit, directory=eval_dir):
            rows.append({"model": m, **r, "solver": "on" if r["solver"] else "off"})
    doc = {"device": device_info(config), "weights": wdt, "kv": kv, "spec": specs[0], "attempts": args.attempts,
           "prefix_cache": args.prefix_cache,
           "eval_dir": eval_name, "eval_rows": rows}
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print_table(rows, EVAL_COLUMNS)
    return 0


def _plan_config(args, wdt: str, kv: str):
    """The plan benches' runtime: the first --configs pair, --prefix-cache (default 0)."""
    return with_settings(config_from_args(args), model__dtype=wdt, model__kv_dtype=kv,
                         model__prefix_cache=args.prefix_cache)


def run_plan(args, specs) -> int:
    from agent.bench import plan_bench

    if args.plan_set == "eval":
        return run_eval(args, specs)

    wdt, kv = args.configs.split(",")[0].strip().split("/")
    config = _plan_config(args, wdt, kv)
    loaded = load_model(config)
    rt = make_runtime(config, loaded)
    rows = plan_bench(rt, loaded.tokenizer, specs, args.repeats, drafter=config.speculation.drafter or None)
    doc = {"device": device_info(config), "model": config.model.name, "weights": wdt, "layout": loaded.model.layout, "kv": kv,
           "repeats": args.repeats, "plan_rows": rows, "peak_rss_mb": peak_rss_mb()}
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print_table(rows, ["spec", "plans", "valid", "latency_median_s", "latency_p90_s", "decode_tok_s",
                       "decode_vs_first", "accept_length_mean", "jump_forward_tokens", "plans_identical_to_first"])
    return 0


def _on_accelerator(config) -> bool:
    """The resolved device is not the CPU: the device benchmark (bench_device.py) runs."""
    from thor_runtime.device import resolve_device

    return resolve_device(config.model.device).type != "cpu"


def run(args) -> int:
    from thor_runtime.loading import DTYPES, resolve
    from thor_runtime.speculative.lossless import DEFAULT_TIE_TOL

    config = config_from_args(args)             # a bad flag value fails before anything loads
    if args.tie_tol is None:
        args.tie_tol = DEFAULT_TIE_TOL
    if args.rollback:
        return run_rollback(args)
    if _on_accelerator(config) and not (args.plan or args.serve or args.peers or args.backend != "torch"):
        from .bench_device import side_by_side
        return side_by_side(config.model.device, Path(args.json_out), args.repeats)
    if args.neighbour:
        from .bench_neighbour import run_neighbour
        return run_neighbour(args, config)
    if args.peers:
        from thor_app.peers.driver import run_peers
        run_peers(config.model.name, Path(args.out_dir), short=args.short, peers_py=args.peers_python,
                  threads=args.threads, repeats=args.peers_repeats, max_tokens=args.peers_max_tokens,
                  plans=args.peers_plans)
        return 0
    configs = [c.strip().split("/") for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if len(c) != 2 or c[0] not in ("fp32", "bf16", "int8", "int4") or c[1] not in KV_DTYPES:
            raise ThorError(f"bad --configs entry {'/'.join(c)!r}; expected WEIGHTS/KV like bf16/fp8")
    specs = [s.strip() for s in args.spec.split(",") if s.strip()]
    for s in specs:
        if s not in SPEC_METHODS:
            raise ThorError(f"unknown --spec {s!r}; choose from {', '.join(SPEC_METHODS)}")
    if args.serve:
        from .bench_serve import run_serve

        return run_serve(args)
    if args.prefix_cache is None:
        args.prefix_cache = 0
    if args.plan:
        return run_plan(args, specs)
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if backends != ["torch"]:
        return run_backends(args, configs, backends)
    if "dflash" in specs:  # the window seeding is measured both ways
        specs.insert(specs.index("dflash") + 1, "dflash-noseed")
    path = resolve(config.model.name)
    rows: list[dict] = []
    results = {"device": device_info(config), "model": config.model.name, "max_tokens": args.max_tokens,
                         "repeats": args.repeats, "prefill_tokens": args.prefill_tokens, "rows": rows}
    for wdt in dict.fromkeys(c[0] for c in configs):
        t0 = time.perf_counter()
        loaded = load_model(with_settings(config, model__dtype=wdt))
        results.setdefault("load_s", {})[wdt] = round(time.perf_counter() - t0, 3)
        prompts = [loaded.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in BENCH_PROMPTS]
        plain_fp32kv = None
        for kv in [c[1] for c in configs if c[0] == wdt]:
            reference = None
            for spec in specs:
                print(f"bench: {wdt} weights, {kv} KV, spec={spec} ...", file=sys.stderr)
                row, outs = bench_runtime(config, loaded, kv, spec, args, prompts, reference)
                if spec == "none":
                    reference = outs
                    if kv == "fp32":
                        plain_fp32kv = outs
                    elif plain_fp32kv is not None:
                        row["greedy_agreement_vs_fp32_kv"] = _agreement(outs, plain_fp32kv)
                rows.append({"engine": "thor", "weights": wdt, "layout": loaded.model.layout, "kv": kv, "spec": spec,
                             **row})
        if not args.no_baseline and wdt in DTYPES:  # transformers has no int8 weight-only CPU path
            print(f"bench: transformers generate, {wdt} weights ...", file=sys.stderr)
            hf = bench_transformers(path, DTYPES[wdt], args, prompts, _long_ids(loaded.tokenizer, args.prefill_tokens))
            if hf is not None:
                rows.append({"engine": "transformers", "weights": wdt, "kv": wdt, "spec": "none", **hf})
    _ratios(rows)
    results["peak_rss_mb"] = peak_rss_mb()
    print(f"load s: {results['load_s']}  peak RSS: {results['peak_rss_mb']} MB", file=sys.stderr)
    Path(args.json_out).write_text(json.dumps(results, indent=1))
    print_table(rows)
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0


def _agreement(outs, ref) -> dict:
    """Token agreement and mean first-divergence position of outs vs ref (per prompt)."""
    from thor_runtime.speculative.lossless import first_divergence

    agree, first = [], []
    for a, b in zip(outs, ref):
        n = min(len(a), len(b))
        d = first_divergence(a, b)
        first.append(n if d is None else d)
        agree.append(sum(x == y for x, y in zip(a, b)) / max(n, 1))
    return {"token_agreement": round(statistics.mean(agree), 3), "mean_first_divergence": statistics.mean(first)}


def _ratios(rows) -> None:
    base = {r["weights"]: r for r in rows if r["engine"] == "transformers"}
    plain = {(r["weights"], r["kv"]): r for r in rows if r["engine"] == "thor" and r["spec"] == "none"}
    for r in rows:
        if r["engine"] != "thor":
            continue
        b = base.get(r["weights"])
        if b and b["decode_tok_s"]:
            r["decode_vs_transformers"] = round(r["decode_tok_s"] / b["decode_tok_s"], 2)
        p = plain.get((r["weights"], r["kv"]))
        if p and r is not p and p["decode_tok_s"]:
            r["decode_vs_plain"] = round(r["decode_tok_s"] / p["decode_tok_s"], 2)


TABLE_COLUMNS = ["engine", "weights", "kv", "spec", "prefill_tok_s", "decode_tok_s", "decode_vs_transformers",
                 "decode_vs_plain", "accept_length_mean", "tokens_identical_to_plain", "gate"]


def _cell(r: dict, c: str) -> str:
    if c == "gate":  # spec rows: their own verdict; plain rows: the one-thread noise floor
        g = r.get("plain_1thread", r)
        if "gate" not in g:
            return ""
        regret = max((d.get("regret", 0.0) for d in g["divergences"]), default=None)
        tag = "" if regret is None else f" {regret:.3g}"
        return ("1-thread: " if g is not r else "") + g["gate"] + tag
    return "" if r.get(c) is None else str(r.get(c))


def print_table(rows, cols=TABLE_COLUMNS) -> None:
    table = [[_cell(r, c) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for t in table:
        print("  ".join(x.ljust(w) for x, w in zip(t, widths)))


def _backend_variants(args, backends):
    """(label, backend, form, threads, opt_level) rows to measure."""
    import torch

    forms = [f.strip() for f in args.engine_forms.split(",") if f.strip()]
    rows = []
    for b in backends:
        if b == "torch":
            rows.append(("torch", "torch", None, None, None))
            continue
        for form in forms:
            rows.append((f"{b} {form}", b, form, None, None))
        if b == "onnxruntime" and args.ort_sweep:
            n = torch.get_num_threads()
            for level in ("disable", "basic"):
                rows.append((f"{b} {forms[0]} opt={level}", b, forms[0], None, level))
            for t in sorted({1, n} - {0}):
                rows.append((f"{b} {forms[0]} threads={t}", b, forms[0], t, None))
    return rows


def run_backends(args, configs, backends) -> int:
    """torch vs the graph backends (per-segment and fused export), one run, same prompts."""
    from engines.backend import attach

    for b in backends:
        if b not in ENGINE_BACKENDS:
            raise ThorError(f"unknown backend {b!r}; choose from {', '.join(ENGINE_BACKENDS)}")
    wdt, kv = configs[0]
    # graph backends and torch side by side on one copy of dense weights
    config = with_settings(config_from_args(args), model__dtype=wdt, model__weights_layout="dense")
    loaded = load_model(config)
    prompts = [loaded.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in BENCH_PROMPTS]
    rows, reference = [], None
    for label, name, form, threads, level in _backend_variants(args, backends):
        print(f"bench: {label} ({wdt} weights, {kv} KV) ...", file=sys.stderr)
        t0 = time.perf_counter()
        b = make_backend(config, loaded, name=name, form=form, threads=threads, opt_level=level)
        load_s = time.perf_counter() - t0
        try:
            row, outs = bench_runtime(config, loaded, kv, "none", args, prompts)
        finally:
            attach(loaded.model, None)
            if b is not None:
                b.close()
        if reference is None:
            reference = outs
        rows.append({"engine": label, "weights": wdt, "kv": kv, "spec": "none", "load_s": round(load_s, 2),
                     **row, "tokens_identical_to_first": outs == reference})
        Path(args.json_out).write_text(json.dumps({"rows": rows}, indent=1))  # partial results survive a kill
    base = rows[0]
    for r in rows:
        for k in ("prefill_tok_s", "decode_tok_s"):
            if base.get(k) and r.get(k):
                r[k.replace("_tok_s", "_vs_first")] = round(r[k] / base[k], 2)
    doc = {"device": device_info(config), "model": config.model.name, "max_tokens": args.max_tokens, "repeats": args.repeats,
           "prefill_tokens": args.prefill_tokens, "rows": rows}
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print_table(rows, ["engine", "weights", "kv", "load_s", "prefill_tok_s", "prefill_vs_first", "decode_tok_s",
                       "decode_vs_first", "tokens_identical_to_first"])
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0
