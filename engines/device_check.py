"""The self-test of the model on an accelerator (``thor selftest --device cuda``).

The reference is the same checkpoint in fp32 on the CPU. On the device: teacher-forced
logits within the weight precision's bounds (THRESHOLDS, compounded over the whole model as
the backend checks are), the FP8 KV cache against the device's own bf16 cache, and greedy
speculative decoding token-identical to plain decoding there (fixed_shape.py makes a verify
row and a step one computation), with both KV dtypes.
"""

from __future__ import annotations

import platform

import torch

from .selftest import (
    FIXED_TEXT,
    THRESHOLDS,
    WHOLE_MODEL,
    Check,
    SelftestReport,
    _teacher_forced,
    _thr_dict,
    compare,
    fp8_agreement,
)


def _logits_check(ref_model, dev_model, ids: torch.Tensor, precision: str) -> Check:
    thr = THRESHOLDS[precision].scaled(WHOLE_MODEL)
    ref, _ = _teacher_forced(ref_model, ids, ())
    got, _ = _teacher_forced(dev_model, ids, ())
    figs, failed = compare(ref.logits, got.logits.float().cpu(), thr)
    return Check(
        (
            f"logits on {dev_model.device} ({precision}) vs CPU fp32 "
            f"(teacher-forced, {len(ids)} tokens)"
        ),
        not failed,
        figs,
        _thr_dict(thr),
        failed,
    )


def _fp8_check(dev_model, ids: torch.Tensor) -> Check:
    a, _ = _teacher_forced(dev_model, ids, (), kv_dtype="bf16")
    b, _ = _teacher_forced(dev_model, ids, (), kv_dtype="fp8")
    return fp8_agreement(
        f"fp8 vs bf16 KV on {dev_model.device} (teacher-forced, unit scales)", a.logits, b.logits
    )


def _spec_check(loaded, prompt: list[int], kv: str, n: int) -> Check:
    from thor_runtime.engine import Runtime, SamplingParams
    from thor_runtime.speculative import SpecOptions, build_speculation

    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=kv)
    params = SamplingParams(max_tokens=n, ignore_eos=True)
    plain = rt.generate(prompt, params).token_ids
    spec = build_speculation(
        SpecOptions(method="ngram", ngram_min=1, ngram_k=8, fixed_k=True), loaded.model
    )
    got = rt.generate(prompt, params, spec)
    first = next((i for i, (a, b) in enumerate(zip(plain, got.token_ids)) if a != b), None)
    ok = got.token_ids == plain
    return Check(
        f"speculative (ngram, K=8) == plain on {loaded.model.device}, {kv} KV",
        ok,
        {"tokens": len(plain), "cycles": got.stats.cycles, "accepted": got.stats.accepted},
        {"identical": True},
        () if ok else ("tokens",),
        "" if ok else f"first divergence at token {first}",
    )


def run_device_check(
    model: str, device, dtype: str = "auto", quick: bool = False
) -> SelftestReport:
    from thor_runtime.device import device_name
    from thor_runtime.loading import load

    dev = load(model, dtype, device=device)
    ref = load(model, "fp32", device="cpu")
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[
        dev.model.dtype
    ]
    ids = torch.tensor(ref.tokenizer.encode(FIXED_TEXT)[: 24 if quick else 40])
    rep = SelftestReport(
        "torch",
        precision,
        {"name": device_name(dev.model.device), "host": platform.node()},
        {"torch": torch.__version__, "cuda": torch.version.cuda or ""},
    )
    rep.checks.append(_logits_check(ref.model, dev.model, ids, precision))
    rep.checks.append(_fp8_check(dev.model, ids))
    prompt = ref.tokenizer.encode(FIXED_TEXT + " " + FIXED_TEXT)
    for kv in ("bf16", "fp8"):
        rep.checks.append(_spec_check(dev, prompt, kv, 24 if quick else 64))
    return rep


def main(argv=None) -> int:
    """python -m engines.device_check --model M --device cuda [--json PATH]"""
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="device_check")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    rep = run_device_check(a.model, a.device, a.dtype, a.quick)
    print(rep.summary())
    if a.json is not None:
        a.json.write_text(json.dumps(rep.to_dict(), indent=1) + "\n")
    return 0 if rep.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
