"""`thor calib export-drafter`: a trained drafter made ready to ship.

Distillation trains and saves in fp32; a shipped drafter is stored in bf16 (half the size:
the runtime casts it to the target's dtype on load, and held-out acceptance is measured on the
stored weights), with its config, head shortlist, report and loss curve beside it. The copy is
checked by loading it as the runtime will, and written file by file atomically.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from thor_runtime.errors import ThorError

KEEP = ("report.json", "loss.png")  # copied as they are when present


def export_drafter(src: str | Path, dst: str | Path, dtype: str = "bf16") -> dict:
    """-> summary. Refuses a source that is not a drafter and a destination that is a file."""
    from thor_runtime.speculative import load_drafter, save_drafter

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if dtype not in dtypes:
        raise ThorError(
            f"export-drafter: --dtype must be one of {', '.join(dtypes)}, got {dtype!r}"
        )
    src, dst = Path(src), Path(dst)
    if dst.exists() and not dst.is_dir():
        raise ThorError(f"export-drafter: {dst} is a file, not a directory")
    if src.resolve() == dst.resolve():
        raise ThorError("export-drafter: source and destination are the same directory")
    drafter = load_drafter(src)
    drafter.to(dtypes[dtype])
    save_drafter(drafter, dst)
    for name in KEEP:
        if (src / name).is_file():
            tmp = dst / (name + ".tmp")
            shutil.copyfile(src / name, tmp)
            tmp.replace(dst / name)
    back = load_drafter(dst)  # the runtime's own reader accepts the copy
    n = sum(p.numel() for p in back.parameters())
    return {
        "drafter": str(dst),
        "dtype": dtype,
        "parameters": n,
        "bytes": (dst / "model.safetensors").stat().st_size,
        "draft_vocab": back.draft_vocab is not None,
        "plan_format": back.cfg.plan_format,
    }
