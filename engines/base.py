"""What every segment backend shares: its options, the interface, the torch reference and the
key of an engine-cache entry. The graph backends (ort.py, tensorrt.py) build on this module;
backend.py picks one by name and attaches it to a model.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch

# stated once, in the runtime's config table
from thor_runtime.config import ENGINE_PRECISIONS as PRECISIONS  # noqa: E402
from thor_runtime.config import ORT_OPT_LEVELS
from thor_runtime.errors import ThorError

from .segments import EXPORT_FORMAT, OPSET, SEGMENTS, graph_plan

# TensorRT's prefill profile when the runtime prefills in one pass: longer inputs run in pieces
# of this many tokens (every dense segment is row-wise).
PREFILL_PROFILE = 256


def default_cache_dir() -> Path:
    """$THOR_ENGINE_CACHE, else $XDG_CACHE_HOME/thor/engines, else ~/.cache/thor/engines (read by
    the entry points, passed down)."""
    env = os.environ.get("THOR_ENGINE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "thor" / "engines"


def profile_tokens(spec_k: int, prefill_chunk: int) -> tuple[int, int, int]:
    """TensorRT's token counts (decode, verify, prefill) for a runtime that verifies up to
    ``spec_k`` drafts per cycle (K + 1 rows) and prefills in chunks of ``prefill_chunk``
    tokens (0 = one pass, run in PREFILL_PROFILE pieces)."""
    if spec_k < 0 or prefill_chunk < 0:
        raise ThorError(
            f"engine profiles: K and the prefill chunk must be >= 0, got {spec_k}, {prefill_chunk}"
        )
    verify = spec_k + 1
    return 1, verify, max(prefill_chunk or PREFILL_PROFILE, verify)


def spec_width(spec) -> int:
    """The most drafts one verify checks under ``spec`` (a Speculation; its free-text
    counterpart included), 0 for plain decoding."""
    if spec is None:
        return 0
    free = getattr(spec, "free_text", None)
    return max(spec.k, free.k if free is not None else 0)


@dataclass(frozen=True)
class BackendOptions:
    form: str = "segments"  # segments | fused (segments.FORMS)
    cache_dir: str | None = None  # None = default_cache_dir()
    build: bool = True  # build a missing cache entry (False: refuse)
    threads: int = 0  # onnxruntime intra-op threads; 0 = torch's count
    opt_level: str = "all"  # onnxruntime graph optimizations (ORT_OPT_LEVELS)
    precision: str | None = None  # tensorrt: fp32|bf16|fp16|fp8 (None = the model's dtype)
    profiles: tuple[int, int, int] = (
        1,
        1,
        PREFILL_PROFILE,
    )  # tensorrt token counts: decode, verify K+1,
    #                                                    prefill chunk (profile_tokens)
    fp8_scales: str | None = (
        None  # fp8 GEMMs: activation scales file (engines.qdq; both graph backends)
    )

    def __post_init__(self):
        from .segments import FORMS

        if self.form not in FORMS:
            raise ThorError(f"unknown engine form {self.form!r}; choose one of {', '.join(FORMS)}")
        if self.threads < 0:
            raise ThorError(f"engine threads must be >= 0, got {self.threads}")
        if self.opt_level not in ORT_OPT_LEVELS:
            raise ThorError(
                f"unknown graph optimization level {self.opt_level!r}; choose one of "
                f"{', '.join(ORT_OPT_LEVELS)}"
            )
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ThorError(
                f"unknown engine precision {self.precision!r}; "
                f"choose one of {', '.join(PRECISIONS)}"
            )
        if self.precision == "fp8" and not self.fp8_scales:
            raise ThorError(
                "fp8 GEMMs need calibrated activation scales: pass --fp8-scales FILE "
                "(write one with `thor calib fp8-scales`)"
            )
        if self.fp8_scales and self.precision not in (None, "fp8"):
            raise ThorError(
                f"--fp8-scales asks for fp8 GEMMs but the precision is {self.precision}; "
                "drop one of them"
            )
        a, b, c = self.profiles
        if not 1 <= a <= b <= c:
            raise ThorError(
                "engine profiles must satisfy 1 <= decode <= verify <= prefill, "
                f"got {self.profiles}"
            )

    @property
    def root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


class GraphBackend(ABC):
    """The model-facing methods over ``run``. Subclasses set ``name``, ``plan`` and ``run``."""

    name = "graph"
    plan: list[tuple[str, int | None]] = []

    @abstractmethod
    def run(self, segment: str, layer: int | None, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One graph (segment of a layer, or embed/head) on its inputs -> its outputs."""

    @property
    def fused(self) -> bool:
        return any(s == "post_pre" for s, _ in self.plan)

    @property
    def gated(self) -> bool:
        return any(s == "pre_gattn" for s, _ in self.plan)

    def embed(self, ids):
        return self.run("embed", None, ids)[0]  # [T, D]

    def pre_attn(self, i, h, pos):
        # q [H, T, Dh], k/v [Hkv, T, Dh]; a hybrid's gated attention adds its gate [T, H Dh]
        return self.run("pre_gattn" if self.gated else "pre_attn", i, h, pos)

    def pre_gdn(self, i, h):
        return self.run("pre_gdn", i, h)  # qkv [T, C], z [T, Vd], b/a [T, Hv]

    def post_gdn(self, i, core, z):
        return self.run("post_gdn", i, core, z)[0]  # [T, Vd]

    def post_attn(self, i, h, o):
        return self.run("post_attn", i, h, o)[0]  # [T, D]

    def pre_moe(self, i, h, o):
        return self.run("pre_moe", i, h, o)  # h_out [T, D], x [T, D]

    def post_pre(self, i, h, o, pos):
        if self.fused:
            return self.run("post_pre", i, h, o, pos)
        h = self.post_attn(i, h, o)
        return (h, *self.pre_attn(i + 1, h, pos))

    def head(self, h):
        return self.run("head", None, h)[0]  # [R, V] fp32

    def close(self) -> None:
        pass


class TorchBackend(GraphBackend):
    """The reference: the model's own segment methods, graph by graph."""

    name = "torch"

    def __init__(self, model, form: str = "segments"):
        self.model, self.plan = model, graph_plan(model.cfg, form)

    def run(self, segment, layer, *xs):
        with torch.inference_mode():
            out = SEGMENTS[segment].run(self.model, layer, *xs)
        return out if isinstance(out, tuple) else (out,)


def key_fields(
    model,
    backend: str,
    runtime: str,
    device: str,
    precision: str,
    form: str,
    profiles=None,
    weights_sha256: str | None = None,
    extra: dict | None = None,
) -> dict:
    """Everything an entry depends on. The ONNX graphs are a function of the weights, the
    config, the export format and the exporter (torch) version, all of which are here; the
    manifest also pins each graph's own sha256."""
    from dataclasses import asdict

    from .segments import DenseView

    cfg = asdict(model.cfg)
    return {
        "export_format": EXPORT_FORMAT,
        "opset": OPSET,
        "exporter": f"torch {torch.__version__}",
        "weights_sha256": weights_sha256 or DenseView(model).weights_digest(),
        "config": cfg,
        "model": cfg.get("name"),
        "dtype": str(model.dtype).replace("torch.", ""),
        "backend": backend,
        "runtime": runtime,
        "device": device,
        "precision": precision,
        "form": form,
        "profiles": list(profiles) if profiles else None,
        **(extra or {}),
    }
