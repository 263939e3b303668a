"""The device benchmark's probes: weight formats a quantized GGUF could run as, and where a
decode step's time goes (kernels per step, torch.compile's effect)."""

from __future__ import annotations

import json
import time

from thor_app.tools.bench_device_shapes import random_model, shape_config, sync, timed


def quant_options(device, repeats: int) -> list[dict]:
    """Weight formats a quantized GGUF could run as on this device, per projection shape and row
    count: time and relative error against the fp32 product (the same random weights)."""
    import torch

    out = []
    g = torch.Generator(device=device).manual_seed(2)
    for shape_name, (n_out, n_in) in (
        ("qwen2.5-0.5b mlp up", (4864, 896)),
        ("qwen3-8b mlp up", (12288, 4096)),
    ):
        w32 = torch.randn(n_out, n_in, generator=g, device=device) * 0.02
        for rows in (1, 8, 16):
            x32 = torch.randn(rows, n_in, generator=g, device=device)
            ref = x32 @ w32.t()
            for fmt, fn in _formats(w32, device).items():
                try:
                    y = fn(x32.bfloat16())
                    err = float((y.float() - ref).norm() / ref.norm())
                    t = timed(lambda: fn(x32.bfloat16()), device, repeats * 10)
                    out.append(
                        {
                            "shape": shape_name,
                            "rows": rows,
                            "format": fmt,
                            "ms": round(1e3 * t, 4),
                            "rel_error_vs_fp32": round(err, 5),
                        }
                    )
                except (RuntimeError, NotImplementedError, AttributeError, TypeError) as e:
                    out.append(
                        {"shape": shape_name, "rows": rows, "format": fmt, "error": str(e)[:160]}
                    )
    return out


def _formats(w32, device) -> dict:
    """name -> x_bf16 [M, in] -> y [M, out] for one weight."""
    import torch
    import torch.nn.functional as F

    wb = w32.bfloat16()
    fmts = {"bf16 (dequantized)": lambda x: F.linear(x, wb)}
    if device.type == "cuda" and hasattr(torch, "_scaled_mm"):
        ws = w32.abs().amax(1, keepdim=True).clamp_min(1e-8) / 448.0  # [out, 1] per channel
        w8 = (w32 / ws).to(torch.float8_e4m3fn)  # [out, in]
        sb = ws.t().contiguous()  # [1, out]

        def fp8(x):
            xs = x.float().abs().amax(1, keepdim=True).clamp_min(1e-8) / 448.0  # [M, 1] per row
            x8 = (x.float() / xs).to(torch.float8_e4m3fn)
            pad = (-x8.shape[0]) % 16  # rows: multiple of 16
            if pad:
                x8 = torch.cat([x8, x8.new_zeros(pad, x8.shape[1])])
                xs = torch.cat([xs, xs.new_ones(pad, 1)])
            y = torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=sb, out_dtype=torch.bfloat16)
            return y[: x.shape[0]]

        fmts["fp8 e4m3 per-channel (_scaled_mm)"] = fp8
    if device.type == "cuda" and hasattr(torch, "_weight_int4pack_mm"):
        group = 128
        wg = w32.view(w32.shape[0], -1, group)  # [out, in/G, G]
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-8)
        q = (
            ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).view(w32.shape[0], -1)
        )  # [out, in]
        packed = torch._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        zeros = lo + 8 * scale  # tinygemm's zero point
        sz = (
            torch.stack([scale.squeeze(-1), zeros.squeeze(-1)], -1)
            .transpose(0, 1)
            .contiguous()
            .bfloat16()
        )
        fmts["int4 weight-only g128 (_weight_int4pack_mm)"] = lambda x: torch._weight_int4pack_mm(
            x, packed, group, sz
        )
    return fmts


def kernel_probe(name: str, device, repeats: int, row_counts: tuple[int, ...] = (1, 16)) -> dict:
    """Where a decode step's time goes at one shape: kernels per step and the busiest ones
    (profiler, one eager 1-row step), then the graphed 1- and 16-row steps with and without
    torch.compile (elementwise work fused), compile time included."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from thor_runtime.engine import FixedShapeDecoder

    cfg = shape_config(name)
    model = random_model(cfg, device, torch.bfloat16)
    prompt = torch.randint(0, cfg.vocab_size, (512,), generator=torch.Generator().manual_seed(1))
    row = {"model_shape": name, "device": str(device)}
    for compiled in (False, True):
        for rows in row_counts:
            dec = FixedShapeDecoder(
                model, rows=rows, max_context=1024, kv_dtype="bf16", compile=compiled
            )
            c = dec.new_cache(600)
            model.prefill(prompt, c, chunk=256)
            ids = torch.full((rows,), 5)

            def step():
                dec.verify(ids, c)
                c.crop(512)

            t0 = time.perf_counter()
            step()
            sync(device)
            tag = f"{'compiled_' if compiled else ''}step_{rows}row"
            row[tag + "_first_call_s"] = round(time.perf_counter() - t0, 2)
            row[tag + "_ms"] = round(1e3 * timed(step, device, repeats * 10), 3)
            if not compiled and rows == row_counts[0] and device.type == "cuda":
                dec.graphs = False
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    step()
                    sync(device)
                dec.graphs = True
                ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
                row["kernels_per_step"] = len(ev)
                by = {}
                for e in ev:
                    by[e.name[:60]] = by.get(e.name[:60], 0.0) + e.device_time
                row["top_kernels_us"] = {
                    k: round(v, 1) for k, v in sorted(by.items(), key=lambda x: -x[1])[:12]
                }
                row["kernel_time_us"] = round(sum(by.values()), 1)
            print(json.dumps(row), flush=True)
    return row
