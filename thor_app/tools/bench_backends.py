"""`thor bench --backend B,...`: torch beside the graph backends (per-segment and fused export,
and with --ort-sweep onnxruntime's optimization levels and thread counts), on the same prompts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from thor_app.assembly import load_model, make_backend, with_settings
from thor_app.flags import config_from_args
from thor_app.tools.bench_decode import bench_runtime, chat_prompts
from thor_app.tools.bench_report import device_info, print_table
from thor_runtime.config import ENGINE_BACKENDS
from thor_runtime.errors import ThorError


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
    prompts = chat_prompts(loaded.tokenizer)
    rows, reference = [], None
    for label, name, form, threads, level in _backend_variants(args, backends):
        print(f"bench: {label} ({wdt} weights, {kv} KV) ...", file=sys.stderr)
        t0 = time.perf_counter()
        b = make_backend(config, loaded, name=name, form=form, threads=threads, opt_level=level)
        load_s = time.perf_counter() - t0
        try:
            ((row, outs),) = bench_runtime(config, loaded, kv, ["none"], args, prompts)
        finally:
            attach(loaded.model, None)
            if b is not None:
                b.close()
        if reference is None:
            reference = outs
        rows.append(
            {
                "engine": label,
                "weights": wdt,
                "kv": kv,
                "spec": "none",
                "load_s": round(load_s, 2),
                **row,
                "tokens_identical_to_first": outs == reference,
            }
        )
        Path(args.json_out).write_text(
            json.dumps({"rows": rows}, indent=1)
        )  # partial results survive a kill
    base = rows[0]
    for r in rows:
        for k in ("prefill_tok_s", "decode_tok_s"):
            if base.get(k) and r.get(k):
                r[k.replace("_tok_s", "_vs_first")] = round(r[k] / base[k], 2)
    doc = {
        "device": device_info(config),
        "model": config.model.name,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "prefill_tokens": args.prefill_tokens,
        "rows": rows,
    }
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print_table(
        rows,
        [
            "engine",
            "weights",
            "kv",
            "load_s",
            "prefill_tok_s",
            "prefill_vs_first",
            "decode_tok_s",
            "decode_vs_first",
            "tokens_identical_to_first",
        ],
    )
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0
