"""Which device the model runs on: ``auto`` (CUDA when torch sees one, else the CPU), ``cpu``,
``cuda`` or ``cuda:N``.

``check_device`` validates the spelling without importing torch (config files and ``--help``
stay light); ``resolve_device`` turns it into a ``torch.device`` and refuses a CUDA device
this machine does not have, with one line that says so.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

from thor_runtime.errors import ThorError

DEVICE_DEFAULT = "auto"
_SPELLING = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(spec: str) -> str:
    """-> ``spec`` normalized (lower case, no spaces), or ThorError naming the accepted forms."""
    s = str(spec).strip().lower()
    if not _SPELLING.fullmatch(s):
        raise ThorError(f"device {spec!r}: expected auto, cpu, cuda or cuda:N")
    return s


def resolve_device(spec: str = DEVICE_DEFAULT):
    """-> torch.device. ``auto`` picks cuda:0 when torch sees a CUDA device."""
    import torch

    s = check_device(spec)
    if s == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if s == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ThorError(
            f"device {s}: this machine has no CUDA device torch can use "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
            "use --device cpu"
        )
    index = int(s.split(":")[1]) if ":" in s else 0
    if index >= torch.cuda.device_count():
        raise ThorError(f"device {s}: only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device("cuda", index)


def device_name(device) -> str:
    """What /health, stats and bench JSON show: ``cpu`` or ``cuda:0 (NVIDIA H100 80GB HBM3)``."""
    import torch

    d = torch.device(device)
    if d.type != "cuda":
        return "cpu"
    return f"cuda:{d.index or 0} ({torch.cuda.get_device_name(d)})"


def cpu_name() -> str:
    """The CPU's model name (x86 "model name", ARM "Model" or "CPU part"), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("model name", "Model", "CPU part"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# CPU flags of native bf16 arithmetic (x86: AVX-512 BF16, AMX; ARM: the BF16 extension)
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (x86 "flags", ARM "Features"); empty where unknown."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU multiplies bf16 natively (there a bf16 matmul is about twice as fast as
    fp32; without it, emulated, several times slower)."""
    return bool(cpu_flags(cpuinfo) & BF16_FLAGS)
