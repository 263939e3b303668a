"""`thor bench --device DEVICE`: the decode path on one device at the real models' shapes.

Random weights at each shape (made on the device: real checkpoints of 8B do not need to
exist here, and speed does not depend on the values), timed with the device synchronised:
prefill tok/s, eager step vs fixed-shape (CUDA-graph) step, the 16-row verify against the
1-row step, decode tok/s and its share of the measured copy bandwidth (weights + KV bytes
read per token), and a plan-shaped request (prompt and output lengths of `make demo`'s
plan). Medians of repeats. JSON + table + plot.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from thor_app.tools.bench_device_probes import kernel_probe, quant_options
from thor_app.tools.bench_device_shapes import (
    PLAN_SHAPE,
    SHAPES,
    NullTokenizer,
    copy_bandwidth,
    random_model,
    shape_config,
    sync,
    timed,
    weight_bytes,
)


def bench_shape(
    name: str,
    device,
    dtype_name: str,
    kv: str,
    repeats: int,
    new_tokens: int,
    clients: tuple[int, ...] = (),
) -> dict:
    """clients: also plan-shaped requests that many at once (bench_device_batch.py)."""
    import torch

    from thor_runtime.cache import KVCache
    from thor_runtime.engine import FixedShapeDecoder
    from thor_runtime.loading import DTYPES

    cfg = shape_config(name)
    dtype = DTYPES[dtype_name]
    model = random_model(cfg, device, dtype)
    row = {
        "model_shape": name,
        "device": str(device),
        "weights": dtype_name,
        "kv_dtype": kv,
        "weight_bytes": weight_bytes(model),
    }
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (PLAN_SHAPE[0],), generator=g)
    ctx = PLAN_SHAPE[0] + new_tokens + 16

    def prefill():
        c = KVCache(cfg, ctx, kv, model.dtype, None, device)
        model.prefill(prompt, c, chunk=256)
        return c

    row["prefill_tok_s"] = round(PLAN_SHAPE[0] / timed(prefill, device, repeats, 1), 1)

    # eager 1-row step: the reference path, one kernel launch per op
    cache = prefill()
    one = torch.tensor([5])

    def eager_step():
        model.forward(one, cache, logits_rows="all")
        cache.crop(PLAN_SHAPE[0])

    row["eager_step_ms"] = round(1e3 * timed(eager_step, device, repeats * 5), 3)

    graphs = device.type == "cuda"
    steps = {}
    for rows in (1, 8, 16):
        dec = FixedShapeDecoder(model, rows=rows, max_context=ctx + 16, kv_dtype=kv, graphs=graphs)
        c = dec.new_cache(PLAN_SHAPE[0] + new_tokens)
        model.prefill(prompt, c, chunk=256)
        ids = torch.full((rows,), 5)

        def step():
            dec.verify(ids, c)
            c.crop(PLAN_SHAPE[0])

        steps[rows] = timed(step, device, repeats * 5)
        row["key_span"] = dec.span
    row["step_8rows_ms"] = round(1e3 * steps[8], 3)
    row["step_1row_ms"] = round(1e3 * steps[1], 3)
    row["verify_16rows_ms"] = round(1e3 * steps[16], 3)
    row["verify16_over_step1"] = round(steps[16] / steps[1], 3)
    # The padded plain step IS the 16-row forward (one shape), so its ratio to the 1-row step
    # is the same figure.
    row["padded_over_unpadded_step"] = row["verify16_over_step1"]
    row["graph_speedup_1row"] = round(1e-3 * row["eager_step_ms"] / steps[1], 2) if graphs else None

    row.update(drafter_block(model, prompt, device, repeats))

    # decode through the runtime (padded, graphed), a plan-shaped request
    from thor_runtime.engine import Runtime, SamplingParams

    rt = Runtime(
        model, NullTokenizer(), kv_dtype=kv, fixed_shape=graphs or None, max_context=ctx + 16
    )
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    results = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        r = rt.generate(prompt.tolist(), params)
        sync(device)
        results.append((time.perf_counter() - t, r.stats))
    wall, st = sorted(results, key=lambda x: x[0])[len(results) // 2]
    row.update(auto_block(rt))
    decode_tok_s = (st.generated - 1) / st.decode_s if st.decode_s else 0.0
    row["plan_shaped_latency_s"] = round(wall, 4)
    row["decode_tok_s"] = round(decode_tok_s, 1)
    kv_elem = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[kv]
    span = row["key_span"] if rt.decoder is not None else PLAN_SHAPE[0] + new_tokens // 2
    kv_read = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * span * kv_elem
    row["bytes_per_token"] = row["weight_bytes"] + kv_read
    if clients:
        from thor_app.tools.bench_device_batch import batch_block

        row.update(batch_block(model, prompt, device, kv, ctx + 16, new_tokens, clients, repeats))
    return row


def auto_block(rt, rows: int = 16) -> dict:
    """The verify cost curve `--spec auto` measures on this device (1..rows rows, in one-row
    steps) and the block it then picks for a drafter whose every position is accepted with
    probability a: short where rows cost more (a CPU), long where they cost the same (a GPU)."""
    from thor_runtime.speculative import Arm, measure

    curve = measure(rt, rows)
    return {
        "verify_cost_curve": [round(c, 3) for c in curve.costs],
        **{
            f"auto_k_at_accept_{a}": Arm("drafter", object(), rows - 1, prior=a).best_k(
                curve, rows - 1, 0, 0.0
            )[0]
            for a in (0.6, 0.8, 0.9)
        },
    }


def drafter_block(model, prompt, device, repeats: int) -> dict:
    """One DFlash propose (a 1-layer drafter, block 16, window 128 seeded from the prompt) at
    this target's shape: eager over the filled window, and at one shape (a CUDA graph on CUDA)."""
    import torch

    from thor_runtime.cache import KVCache
    from thor_runtime.speculative import (
        DFlashConfig,
        DFlashDrafter,
        DFlashProposer,
        default_tap_layers,
    )

    c = model.cfg
    taps = default_tap_layers(c.num_layers, min(3, c.num_layers))
    dc = DFlashConfig(
        tap_layers=taps,
        mask_token_id=c.vocab_size - 1,
        hidden_size=c.hidden_size,
        num_layers=1,
        num_heads=c.num_heads,
        num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        block_size=16,
        rms_eps=c.rms_eps,
        rope_theta=c.rope_theta,
        target_id=c.name,
        window=128,
    )
    d = DFlashDrafter(dc)
    with torch.no_grad():
        for name, p in d.named_parameters():
            p.copy_(
                torch.ones_like(p) if name.endswith("norm.weight") else torch.randn_like(p) * 0.02
            )
    cache = KVCache(c, len(prompt) + 1, "bf16", model.dtype, None, device)
    out = model.prefill(prompt, cache, chunk=256, taps=taps, tap_rows=128)
    seq = prompt.tolist() + [5]  # the prompt, then the anchor
    res = {}
    for fixed in (False, True):
        p = DFlashProposer(d, model, fixed_block=fixed)
        p.start(seq[:-1], out.taps)
        res["drafter_block_fixed_ms" if fixed else "drafter_block_eager_ms"] = round(
            1e3 * timed(lambda: p.propose(seq, 15), device, repeats * 5), 3
        )
    return res


def run(
    device_spec: str,
    shapes: list[str],
    dtype: str,
    kv: str,
    repeats: int,
    new_tokens: int,
    out: Path | None,
    weight_formats: bool = True,
    clients: tuple[int, ...] = (),
) -> dict:
    """weight_formats: also time the formats a quantized GGUF could run as (quant_options).
    clients: requests at once for the batch columns (none: not run)."""
    import torch

    from thor_runtime.device import device_name, resolve_device

    device = resolve_device(device_spec)
    torch.manual_seed(0)
    bw = copy_bandwidth(device)
    doc = {
        "device": device_name(device),
        "torch": torch.__version__,
        "copy_bandwidth_GBps": round(bw / 1e9, 1),
        "plan_shape": {"prompt_tokens": PLAN_SHAPE[0], "new_tokens": new_tokens},
        "rows": [],
    }
    for name in shapes:
        row = bench_shape(name, device, dtype, kv, repeats, new_tokens, clients)
        row["decode_bandwidth_share"] = round(row["bytes_per_token"] * row["decode_tok_s"] / bw, 3)
        doc["rows"].append(row)
        print(json.dumps(row), flush=True)
        del row
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if weight_formats:
        doc["quantized_weight_options"] = quant_options(device, repeats)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


COLUMNS = (
    "model_shape",
    "weights",
    "kv_dtype",
    "prefill_tok_s",
    "eager_step_ms",
    "step_1row_ms",
    "step_8rows_ms",
    "verify_16rows_ms",
    "verify16_over_step1",
    "graph_speedup_1row",
    "drafter_block_eager_ms",
    "drafter_block_fixed_ms",
    "decode_tok_s",
    "decode_bandwidth_share",
    "plan_shaped_latency_s",
    "auto_k_at_accept_0.8",
)


def table(doc: dict) -> str:
    lines = [
        f"device: {doc['device']}  copy bandwidth {doc['copy_bandwidth_GBps']} GB/s",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in doc["rows"]:
        lines.append("| " + " | ".join(str(r.get(c)) for c in COLUMNS) + " |")
    for r in doc["rows"]:
        for n, b in (r.get("batch") or {}).items():
            if n.startswith("clients_"):
                lines.append(
                    f"  {r['model_shape']}, {n.split('_')[1]} requests at once: "
                    f"{b['tok_s']} tok/s, "
                    f"{b['speedup_vs_one_at_a_time']}x one at a time "
                    f"({r['batch']['one_at_a_time_tok_s']} tok/s), "
                    f"latency p50 {b['latency_p50_s']} s"
                )
    for q in doc.get("quantized_weight_options", []):
        lines.append(
            f"  {q['shape']}, {q['rows']} rows, {q['format']}: "
            + (f"{q['ms']} ms, rel. error {q['rel_error_vs_fp32']}" if "ms" in q else q["error"])
        )
    return "\n".join(lines)


def plot(docs: list[dict], path: Path) -> None:
    """Decode tok/s per shape, one bar group per device."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["model_shape"] for d in docs for r in d["rows"]})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(len(docs), 1)
    for j, d in enumerate(docs):
        by = {r["model_shape"]: r["decode_tok_s"] for r in d["rows"]}
        ax.bar(
            [i + j * width for i in range(len(shapes))],
            [by.get(s, 0) for s in shapes],
            width,
            label=d["device"],
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], shapes)
    ax.set_ylabel("decode tok/s (batch 1, greedy)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


BATCH_CLIENTS = (1, 2, 4, 8)  # on the device: requests at once, through a KV slot each


def side_by_side(device_spec: str, out: Path, repeats: int = 3) -> int:
    """`thor bench --device cuda`: every shape on the device, the small ones on this host's CPU
    (its usual weights and fewer tokens: the CPU is 10-100x slower), one JSON, tables, a plot."""
    docs = [
        run(
            device_spec,
            list(SHAPES),
            "bf16",
            "bf16",
            repeats,
            PLAN_SHAPE[1],
            None,
            clients=BATCH_CLIENTS,
        ),
        run("cpu", ["smollm2-135m", "qwen2.5-0.5b"], "fp32", "bf16", max(1, repeats - 1), 32, None),
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": docs}, indent=1) + "\n")
    for d in docs:
        print(table(d))
    plot(docs, out.with_suffix(".png"))
    print(f"results written to {out} and {out.with_suffix('.png')}")
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="thor bench --device")
    p.add_argument("--device", default="auto")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--dtype", default=None, help="weights (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--kv-dtype", default="bf16")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=PLAN_SHAPE[1])
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        help="earlier result JSON (another device) to put beside this one in the plot",
    )
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument(
        "--clients", default="", help="comma list: plan-shaped requests at once (e.g. 1,2,4,8)"
    )
    p.add_argument(
        "--kernel-probe", action="store_true", help="kernels per step, and torch.compile's effect"
    )
    p.add_argument(
        "--probe-rows", default="1,16", help="--kernel-probe: comma list of step row counts"
    )
    a = p.parse_args(argv)
    if a.kernel_probe:
        from thor_runtime.device import resolve_device

        counts = tuple(int(r) for r in a.probe_rows.split(","))
        rows = [
            kernel_probe(s, resolve_device(a.device), a.repeats, counts)
            for s in a.shapes.split(",")
        ]
        if a.json is not None:
            a.json.write_text(json.dumps({"kernel_probe": rows}, indent=1) + "\n")
        return 0
    dtype = a.dtype or ("bf16" if a.device.startswith("cuda") else "fp32")
    clients = tuple(int(n) for n in a.clients.split(",") if n)
    doc = run(
        a.device,
        a.shapes.split(","),
        dtype,
        a.kv_dtype,
        a.repeats,
        a.new_tokens,
        a.json,
        clients=clients,
    )
    print(table(doc))
    if a.plot is not None:
        plot([doc] + [json.loads(c.read_text()) for c in a.compare], a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
