"""`thor bench` by default: this runtime side by side with transformers' generate, in one run.

Prefill is timed on a long (~400-token) robot prompt; decode on chat prompts with
greedy decoding. Every number is a median over repeats. Speculative rows also pass the
losslessness gate (spec/lossless.py) against the plain rows: identical tokens, or a divergence
that is a numerical tie under a fresh reference forward. Plain rows measure that noise floor:
the same plain decoding at one thread, judged the same way.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from thor_app.assembly import build_speculation, load_model, make_runtime, with_settings
from thor_app.tools.bench_report import device_info, median, peak_rss_mb, print_table

BENCH_PROMPTS = [
    "Plan how a mobile manipulator should move the red mug from the kitchen counter "
    "to the dish rack. "
    "List the steps as JSON with skill names and arguments.",
    "The robot must pick up the screwdriver from the lab bench and hand it to the technician. "
    "Give a numbered plan with preconditions for each step.",
    "Write a JSON plan: navigate to shelf A3, pick the blue box (1.2 kg), place it on pallet 2, "
    "then return to the charging dock.",
]
LONG_PROMPT = (
    "World: objects red_mug (0.3 kg) at [0.4, 0.1, 0.9], blue_box (1.2 kg) at [1.1, -0.3, 0.5], "
    "screwdriver (0.1 kg) at [0.2, 0.5, 0.8]; places counter, dish_rack, shelf_a3, pallet_2, dock. "
    "Skills: navigate(place), pick(object), place(object, place), open(object), close(object). "
)


def chat_prompts(tokenizer) -> list[list[int]]:
    """BENCH_PROMPTS as the model's chat template frames a user turn."""
    return [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in BENCH_PROMPTS]


def long_ids(tok, n):
    ids = []
    while len(ids) < n:
        ids += tok.encode(LONG_PROMPT)
    return ids[:n]


def bench_runtime(config, loaded, kv, spec_names, args, prompts) -> list[tuple[dict, list]]:
    """-> (row, outputs) per name of ``spec_names``. The specs take turns prompt by prompt (the
    first rotating), so a machine's drift moves them alike, and each keeps one speculation for
    the whole run, as a service does (``auto`` learns from the requests before). Speculative
    rows are judged against the plain row where ``none`` is among them."""
    import torch

    from thor_runtime.engine import SamplingParams
    from thor_runtime.speculative import judge, summarize

    # every prompt prefilled whole: the prefix cache would time a different prefill per repeat
    rt = make_runtime(with_settings(config, model__kv_dtype=kv, model__prefix_cache=0), loaded)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    long = long_ids(loaded.tokenizer, args.prefill_tokens)
    specs = [
        build_speculation(
            with_settings(
                config,
                speculation__method=name.split("-")[0],
                speculation__seed_window=not name.endswith("noseed"),
            ),
            loaded,
        )
        for name in spec_names
    ]
    runs = [{"decode": [], "accept": [], "per_pos": [], "outputs": []} for _ in spec_names]
    rt.generate(prompts[0][:8], SamplingParams(max_tokens=2))  # warm-up (allocator, kernels)
    turn = 0
    prefill = []  # no speculation runs in a prefill: one timing per repeat serves every row
    for r in range(args.repeats):
        prefill.append(
            rt.generate(long, SamplingParams(max_tokens=1)).stats.to_dict()["prefill_tok_s"]
        )
        for ids in prompts:
            for n in range(len(specs)):
                j = (turn + n) % len(specs)
                res = rt.generate(ids, params, specs[j])
                s, run = res.stats.to_dict(), runs[j]
                run["decode"].append(s["decode_tok_s"])
                if specs[j].proposer is not None:
                    run["accept"].append(s["accept_length_mean"])
                    run["per_pos"].append(s["accept_per_position"])
                if r == 0:
                    run["outputs"].append(res.token_ids)
            turn += 1
    reference = runs[spec_names.index("none")]["outputs"] if "none" in spec_names else None
    out = []
    for name, run in zip(spec_names, runs):
        row = {"prefill_tok_s": median(prefill), "decode_tok_s": median(run["decode"])}
        if run["accept"]:
            per_pos = run["per_pos"]
            width = max(len(p) for p in per_pos)
            row["accept_length_mean"] = median(run["accept"])
            row["accept_per_position"] = [
                round(statistics.mean(p[j] for p in per_pos if len(p) > j), 3) for j in range(width)
            ]
        if name == "none":
            if torch.get_num_threads() > 1:
                row["plain_1thread"] = _one_thread_gate(
                    rt, prompts, run["outputs"], params, args.tie_tol
                )
        elif reference is not None:
            row["tokens_identical_to_plain"] = run["outputs"] == reference
            row.update(
                summarize(
                    [
                        judge(rt, p, a, b, args.tie_tol)
                        for p, a, b in zip(prompts, reference, run["outputs"])
                    ]
                )
            )
        out.append((row, run["outputs"]))
    return out


def _one_thread_gate(rt, prompts, outputs, params, tol) -> dict:
    """Plain decoding again at one thread, judged against itself: the numerical noise floor a
    speculative row's divergences are compared with."""
    import torch

    from thor_runtime.speculative import judge, summarize

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        again = [rt.generate(ids, params).token_ids for ids in prompts]
    finally:
        torch.set_num_threads(n)
    return summarize([judge(rt, p, a, b, tol) for p, a, b in zip(prompts, outputs, again)])


def bench_transformers(path, dtype, args, prompts, long: list[int]):
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
            hf.generate(
                ids,
                max_new_tokens=n,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
                pad_token_id=0,
            )
        return time.perf_counter() - t

    gen(torch_ids[0][:, :8], 2)
    prefill, decode = [], []
    for _ in range(args.repeats):
        prefill.append(len(long) / gen(torch.tensor([long]), 1))
        for ids in torch_ids:
            t1, tn = gen(ids, 1), gen(ids, args.max_tokens)
            decode.append((args.max_tokens - 1) / max(tn - t1, 1e-9))
    return {"prefill_tok_s": median(prefill), "decode_tok_s": median(decode)}


def run_decode(args, config, configs, specs) -> int:
    """Every WEIGHTS/KV pair of ``configs`` and every proposer of ``specs``; transformers beside
    each weight dtype it can run (not --no-baseline)."""
    from thor_runtime.loading import DTYPES, resolve

    if "dflash" in specs:  # the window seeding is measured both ways
        specs.insert(specs.index("dflash") + 1, "dflash-noseed")
    path = resolve(config.model.name)
    rows: list[dict] = []
    results = {
        "device": device_info(config),
        "model": config.model.name,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "prefill_tokens": args.prefill_tokens,
        "rows": rows,
    }
    for wdt in dict.fromkeys(c[0] for c in configs):
        t0 = time.perf_counter()
        loaded = load_model(with_settings(config, model__dtype=wdt))
        results.setdefault("load_s", {})[wdt] = round(time.perf_counter() - t0, 3)
        prompts = chat_prompts(loaded.tokenizer)
        plain_fp32kv = None
        for kv in [c[1] for c in configs if c[0] == wdt]:
            print(
                f"bench: {wdt} weights, {kv} KV, specs {', '.join(specs)} in turn ...",
                file=sys.stderr,
            )
            for spec, (row, outs) in zip(
                specs, bench_runtime(config, loaded, kv, specs, args, prompts)
            ):
                if spec == "none":
                    if kv == "fp32":
                        plain_fp32kv = outs
                    elif plain_fp32kv is not None:
                        row["greedy_agreement_vs_fp32_kv"] = _agreement(outs, plain_fp32kv)
                rows.append(
                    {
                        "engine": "thor",
                        "weights": wdt,
                        "layout": loaded.model.layout,
                        "kv": kv,
                        "spec": spec,
                        **row,
                    }
                )
        if not args.no_baseline and wdt in DTYPES:  # transformers has no int8 weight-only CPU path
            print(f"bench: transformers generate, {wdt} weights ...", file=sys.stderr)
            hf = bench_transformers(
                path, DTYPES[wdt], args, prompts, long_ids(loaded.tokenizer, args.prefill_tokens)
            )
            if hf is not None:
                rows.append(
                    {"engine": "transformers", "weights": wdt, "kv": wdt, "spec": "none", **hf}
                )
    _ratios(rows)
    results["peak_rss_mb"] = peak_rss_mb()
    print(f"load s: {results['load_s']}  peak RSS: {results['peak_rss_mb']} MB", file=sys.stderr)
    Path(args.json_out).write_text(json.dumps(results, indent=1))
    print_table(rows)
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0


def _agreement(outs, ref) -> dict:
    """Token agreement and mean first-divergence position of outs vs ref (per prompt)."""
    from thor_runtime.speculative import first_divergence

    agree, first = [], []
    for a, b in zip(outs, ref):
        n = min(len(a), len(b))
        d = first_divergence(a, b)
        first.append(n if d is None else d)
        agree.append(sum(x == y for x, y in zip(a, b)) / max(n, 1))
    return {
        "token_agreement": round(statistics.mean(agree), 3),
        "mean_first_divergence": statistics.mean(first),
    }


def _ratios(rows) -> None:
    base = {r["weights"]: r for r in rows if r["engine"] == "transformers"}
    plain = {
        (r["weights"], r["kv"]): r for r in rows if r["engine"] == "thor" and r["spec"] == "none"
    }
    for r in rows:
        if r["engine"] != "thor":
            continue
        b = base.get(r["weights"])
        if b and b["decode_tok_s"]:
            r["decode_vs_transformers"] = round(r["decode_tok_s"] / b["decode_tok_s"], 2)
        p = plain.get((r["weights"], r["kv"]))
        if p and r is not p and p["decode_tok_s"]:
            r["decode_vs_plain"] = round(r["decode_tok_s"] / p["decode_tok_s"], 2)
