"""`thor bench --device cuda`'s batch columns: plan-shaped requests at once through the service's
path (the fixed-shape decoder with a KV slot per request, in-flight rounds: inflight.py), against
the same requests one after another on the one-slot decoder `thor plan` runs.

Random weights, greedy, every request its own prompt. Throughput counts every request's wall
time, prefill included, as a client sees it.
"""

from __future__ import annotations

import statistics
import threading
import time

from thor_app.tools.bench_device_shapes import NullTokenizer, sync


def _at_once(rt, prompts, params, device) -> tuple[float, list[list[int]], list[float]]:
    """-> (wall seconds, tokens per request, each request's latency), all started together."""

    out, lat, errors = [None] * len(prompts), [0.0] * len(prompts), []
    go = threading.Barrier(len(prompts) + 1)

    def run(i):
        try:
            go.wait()
            t = time.perf_counter()
            out[i] = rt.generate(prompts[i], params).token_ids
            lat[i] = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    sync(device)
    go.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    sync(device)
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, out, lat


def batch_block(
    model, prompt, device, kv: str, ctx: int, new_tokens: int, clients, repeats: int
) -> dict:
    """{clients: {tok_s, latency p50 / max, speed-up over one at a time}} and whether a request's
    tokens in the batch are the one-slot decoder's (informative: the shapes differ)."""
    from thor_runtime.engine import Runtime, SamplingParams

    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    base = prompt.tolist()
    prompts = [[(base[0] + i) % model.cfg.vocab_size] + base[1:] for i in range(max(clients))]
    single = Runtime(model, NullTokenizer(), kv_dtype=kv, fixed_shape=True, max_context=ctx)
    single.generate(prompts[0], params)  # graphs captured
    t = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        alone = [single.generate(p, params).token_ids for p in prompts[: max(clients)]]
        t.append((time.perf_counter() - t0) / len(alone))
    one_s = statistics.median(t)  # one request's wall, one at a time
    res = {"one_at_a_time_tok_s": round(new_tokens / one_s, 1)}
    for n in clients:
        rt = Runtime(model, NullTokenizer(), kv_dtype=kv, fixed_shape=True, max_context=ctx)
        rt.share(n)
        _at_once(rt, prompts[:n], params, device)  # graphs captured
        runs = [_at_once(rt, prompts[:n], params, device) for _ in range(repeats)]
        wall, toks, lat = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
        res[f"clients_{n}"] = {
            "tok_s": round(n * new_tokens / wall, 1),
            "speedup_vs_one_at_a_time": round(n * one_s / wall, 2),
            "latency_p50_s": round(statistics.median(lat), 3),
            "latency_max_s": round(max(lat), 3),
            "same_tokens_as_one_slot": sum(a == b for a, b in zip(toks, alone[:n])),
        }
        del rt
    return {"batch": res}
