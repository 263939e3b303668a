"""What every `thor bench` mode reports beside its rows: the machine, the peak memory, medians,
and the plain-text table printed after the JSON is written."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path

# the weight dtypes a bench configuration may name (--configs, --peers-configs)
BENCH_WEIGHTS = ("fp32", "bf16", "int8", "int4")


def device_info(config=None) -> dict:
    """The machine, and with a config the device its model runs on (``model_device``)."""
    import torch

    from thor_runtime.device import cpu_name

    info = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    # the instruction sets the run was told to act as (an AVX2-only CPU, emulated)
    info["aten_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    from thor_runtime.kernels import cpu_isa

    info["row_kernel_isa"] = cpu_isa()
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


def median(xs):
    return round(statistics.median(xs), 3) if xs else None


TABLE_COLUMNS = [
    "engine",
    "weights",
    "kv",
    "spec",
    "prefill_tok_s",
    "decode_tok_s",
    "decode_vs_transformers",
    "decode_vs_plain",
    "accept_length_mean",
    "tokens_identical_to_plain",
    "gate",
]


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


def write_results(json_out: str, doc: dict, table_md: str) -> int:
    """A benchmark's JSON at ``json_out``, its Markdown table beside it (``.md``) and on stdout."""
    out = Path(json_out)
    out.write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(table_md)
    print(table_md)
    return 0
