"""One peer configuration in one process: python -m thor_app.tools.peers.worker SPEC.json OUT.json
(or ``--prepare CONFIG MODEL``: load once, filling the weight cache).

Runs in the project's venv (thor, transformers) or in the peers' venv (llama.cpp), so this
module imports nothing of ours at the top and the llama.cpp path needs only llama_cpp.
SPEC: {"engine", "config", "model", "requests": {"decode": [ids...], "long": ids,
"plans": [{"ids", "schema"}]}, "max_tokens", "plan_max_tokens", "threads"}.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _decode_rate(n: int, t_first: float, t_end: float) -> float:
    return (n - 1) / max(t_end - t_first, 1e-9) if n > 1 else 0.0


VERIFY_ROWS, VERIFY_REPEATS = 16, 7


def _rows_ratio(run_rows) -> float:
    """Median time of a VERIFY_ROWS-row forward over a 1-row one; run_rows(R) runs R rows on a
    fixed context and rolls them back, so every repeat sees the same cache."""

    def med(r):
        ts = []
        for _ in range(VERIFY_REPEATS):
            t = time.perf_counter()
            run_rows(r)
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2]

    run_rows(1)
    return med(VERIFY_ROWS) / med(1)


def _without_extra_buffers() -> None:
    """llama.cpp's model parameters with ``use_extra_bufts`` off (no AMX or repacked weight
    buffers): the Python binding has no argument for it."""
    import llama_cpp.llama as high

    default = high.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    high.llama_cpp.llama_model_default_params = params


def load_llama(spec: dict, n_ctx: int = 2048):
    """-> (llama_cpp.Llama of spec's model and threads, {"load_s", "version"})."""
    import llama_cpp
    from llama_cpp import Llama

    if not spec.get("llama_extra_buffers", True):
        _without_extra_buffers()
    t0 = time.perf_counter()
    # n_threads_batch too: its default (every core) makes prompt batches crawl on a shared machine
    llm = Llama(
        model_path=spec["model"],
        n_ctx=n_ctx,
        n_threads=spec["threads"],
        n_threads_batch=spec["threads"],
        n_batch=512,
        verbose=False,
    )
    return llm, {
        "load_s": time.perf_counter() - t0,
        "version": f"llama-cpp-python {llama_cpp.__version__}",
    }


def run_llama(spec: dict) -> dict:
    from llama_cpp import LlamaGrammar

    llm, out = load_llama(spec)
    long = spec["requests"]["long"]
    llm.reset()
    t = time.perf_counter()
    llm.eval(long)
    out["prefill_tok_s"] = len(long) / (time.perf_counter() - t)
    ctx = llm.n_tokens

    def rows(r):  # eval starts by dropping the cache from n_tokens on
        llm.n_tokens = ctx
        llm.eval(long[:r])

    out["verify16_x_step"] = _rows_ratio(rows)
    rates = []
    for ids in spec["requests"]["decode"]:
        llm.reset()
        n, t_first = 0, None
        for _ in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            n += 1
            if n == 1:
                t_first = time.perf_counter()
            if n >= spec["max_tokens"]:
                break
        rates.append(_decode_rate(n, t_first, time.perf_counter()))
    out["decode_tok_s"] = rates

    def plan_s(p: dict, warm: bool) -> float:
        grammar = LlamaGrammar.from_json_schema(json.dumps(p["schema"]), verbose=False)
        llm.reset()
        if warm:  # the same world's prompt just evaluated: generate() reuses the common start
            llm.eval(p["warm"])
        t, n = time.perf_counter(), 0
        for tok in llm.generate(p["ids"], top_k=1, temp=0.0, grammar=grammar, reset=True):
            n += 1
            if tok == llm.token_eos() or n >= spec["plan_max_tokens"]:
                break
        return time.perf_counter() - t

    out["plan_latency_s"] = [plan_s(p, False) for p in spec["requests"]["plans"]]
    out["plan_warm_latency_s"] = [plan_s(p, True) for p in spec["requests"]["plans"]]
    return out


def run_transformers(spec: dict) -> dict:
    from pathlib import Path

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    t0 = time.perf_counter()
    p = Path(spec["model"])
    hf = AutoModelForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32
    ).eval()
    out = {
        "load_s": time.perf_counter() - t0,
        "version": f"transformers {transformers.__version__}",
    }
    assist = spec["config"] == "prompt-lookup"
    long = torch.tensor([spec["requests"]["long"]])
    with torch.inference_mode():
        t = time.perf_counter()
        hf(long)
        out["prefill_tok_s"] = long.shape[1] / (time.perf_counter() - t)
        rates = []
        for ids in spec["requests"]["decode"]:
            x = torch.tensor([ids])
            kw = dict(
                do_sample=False,
                min_new_tokens=spec["max_tokens"],
                max_new_tokens=spec["max_tokens"],
            )
            if assist:
                kw["prompt_lookup_num_tokens"] = 8
            t = time.perf_counter()
            hf.generate(x, max_new_tokens=1, do_sample=False)
            t1 = time.perf_counter() - t  # prefill + first token, measured apart
            t = time.perf_counter()
            hf.generate(x, **kw)
            rates.append((spec["max_tokens"] - 1) / max(time.perf_counter() - t - t1, 1e-9))
    out["decode_tok_s"] = rates
    return out


def run_thor(spec: dict) -> dict:
    import torch

    from evals.plan_bench import plan_bench
    from thor_app.assembly import (
        build_speculation,
        load_model,
        make_runtime,
        with_settings,
    )
    from thor_app.tools.bench_plan import spec_sessions
    from thor_runtime.engine import SamplingParams

    torch.set_num_threads(spec["threads"])
    config = worker_config(spec)
    t0 = time.perf_counter()
    loaded = load_model(config)
    m = loaded.model
    out = {
        "load_s": time.perf_counter() - t0,
        "version": f"thor (torch {torch.__version__})",
        "weights": (m.quant + (f"-{m.int4_kernel}" if getattr(m, "int4_kernel", None) else ""))
        if m.quant
        else str(m.dtype).replace("torch.", ""),
        "decode_kernel": getattr(m, "decode_kernel", "torch"),
        "prefill_kernel": getattr(m, "prefill_kernel", "torch"),
    }
    rt = make_runtime(with_settings(config, model__prefix_cache=0), loaded)
    out["prefill_tok_s"] = rt.generate(
        spec["requests"]["long"], SamplingParams(max_tokens=1)
    ).stats.to_dict()["prefill_tok_s"]
    from thor_runtime.cache import KVCache

    long = torch.tensor(spec["requests"]["long"])
    kv = KVCache(m.cfg, len(long) + VERIFY_ROWS + 1, "fp32", m.dtype)
    m.prefill(long, kv)
    ctx = kv.length

    def rows(r):  # the decode cycle's forward, rolled back
        m.verify(long[:r], kv)
        kv.crop(ctx)

    out["verify16_x_step"] = _rows_ratio(rows)
    method = config.speculation.method
    speculation = build_speculation(config, loaded)
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True)
    rates, acc, per_pos, paired = [], [], {}, []
    plain = (
        build_speculation(with_settings(config, speculation__method="none"), loaded)
        if method != "none"
        else None
    )
    for i, ids in enumerate(spec["requests"]["decode"]):
        if plain is not None and i % 2:  # the paired plain run, before or after, by turns
            base = rt.generate(ids, params, plain).stats.to_dict()["decode_tok_s"]
        s = rt.generate(ids, params, speculation).stats.to_dict()
        if plain is not None and not i % 2:
            base = rt.generate(ids, params, plain).stats.to_dict()["decode_tok_s"]
        if plain is not None:
            # in one process, same prompt, back to back: what "never slower than plain" asks,
            # without the between-process noise of comparing two rows of the table
            paired.append(s["decode_tok_s"] / base)
        rates.append(s["decode_tok_s"])
        acc.append(s.get("accept_length_mean") or 1.0)
        for i, r in enumerate(s.get("accept_per_position") or []):
            per_pos.setdefault(i, []).append(r)
    out.update(
        decode_tok_s=rates,
        accept_length=acc,
        vs_plain_paired=paired or None,
        accept_by_position=[sum(v) / len(v) for _, v in sorted(per_pos.items())],
    )
    if spec["requests"]["plans"]:
        rows = plan_bench(
            spec_sessions(config, loaded, rt, max_tokens=spec["plan_max_tokens"]),
            [method],
            repeats=1,
            limit=len(spec["requests"]["plans"]),
        )
        out["plan_latency_s"] = rows[0]["latencies_s"]
        out["plan_accept_length"] = rows[0]["accept_length_mean"]
        # the peak RSS of the configuration itself; the warm measure's kept prompts are apart
        out["peak_rss_mb"] = _rss_mb()
        out["plan_warm_latency_s"], out["prefix_cache_mb"] = _warm_plans(
            config, loaded, speculation, spec
        )
    return out


def worker_config(spec: dict):
    """The RuntimeConfig of one thor configuration: "WEIGHTS[@KERNEL]/SPEC" (int4@torch/none)
    on the CPU, where the peers run; the prefix cache as the service has it."""
    from thor_app.assembly import with_settings
    from thor_runtime.config import RuntimeConfig

    weights, method = spec["config"].split("/")
    weights, _, kernel = weights.partition("@")  # int4@torch: a named int4 kernel
    cache = spec.get("cache_dir")
    return with_settings(
        RuntimeConfig(),
        model__name=spec["model"],
        model__dtype=weights,
        model__int4_kernel=kernel or "auto",
        model__device=spec.get("device", "cpu"),
        model__weight_cache="auto" if cache is None else cache,
        speculation__method=method,
    )


def _warm_plans(config, loaded, speculation, spec: dict) -> tuple[list[float], float]:
    """Plan latency with the same world's prompt just run (the prefix cache of `thor plan` and
    `thor serve`), request by request as llama.cpp's warm measure."""
    from agent.planner.planner import Planner
    from evals.plan_bench import plan_cases
    from thor_app.assembly import make_runtime
    from thor_runtime.engine import SamplingParams

    rt = make_runtime(config, loaded)  # kv fp32, the config's prefix cache
    planner = Planner(
        rt, loaded.tokenizer, speculation, max_tokens=spec["plan_max_tokens"], attempts=0
    )
    out = []
    cases = plan_cases(len(spec["requests"]["plans"]))
    for (_, task, world, skills), p in zip(cases, spec["requests"]["plans"]):
        rt.generate(p["warm"], SamplingParams(max_tokens=1))
        out.append(planner.plan(task, world, skills).stats["plan_latency_s"])
    return out, round(rt.prefixes.nbytes() / 2**20, 1)


ENGINES = {"llama.cpp": run_llama, "transformers": run_transformers, "thor": run_thor}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "--prepare":  # load once: a first load fills the weight cache the runs time
        from thor_app.assembly import load_model

        load_model(worker_config({"config": argv[1], "model": argv[2]}))
        return 0
    spec = json.loads(open(argv[0]).read())
    out = ENGINES[spec["engine"]](spec)
    out.setdefault("peak_rss_mb", _rss_mb())
    with open(argv[1], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
