"""The kernel runner: which code runs a target's forwards, picked in order from one registry.

A target model is the math (model.py, hybrid/model.py: segments, attention, the layer path in
torch). A kernel runs the same math faster, or at a shape that keeps verifies exact; each
entry below says whether it fits, and the runner takes the first that does. There are two
steps, because two kinds of kernel own different things:

- ``DECODE`` is asked once per runtime: an entry that fits owns every decode forward of a
  request and the cache they run on (fixed-shape decode with CUDA graphs owns a static KV
  store), else the model's own ``verify`` runs on the model's cache.
- ``FORWARD`` is asked for every forward of a dense model with the runner attached (its
  prefill chunks, steps and verifies): whole-forward kernels first (the row kernel, the ORT
  step graph), then the layer path with its dense segments on the fused per-boundary graphs,
  an engine backend, or torch.

A fit reads the model (its weights' kernel, the device, an attached backend), the cache (its
dtype and length: a kernel binds to fp32 buffers) and the row count. Kernels are built by
``attach`` at load, the fused graphs on first use, as each needs its own probes; where the
regrouped row kernel takes every fp32 row, the step graph too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from thor_runtime.engine.fixed_shape import STEP_ROWS, FixedShapeDecoder, PaddedVerify
from thor_runtime.kernels.lowbit_fused import fuse_layers, prepare_sessions, release_copied
from thor_runtime.kernels.lowbit_step import step_graph
from thor_runtime.kernels.prefill_choice import prefill_on_rows, settled_by_build
from thor_runtime.kernels.rowstep import row_step


@dataclass(frozen=True)
class Forward:
    """A forward kernel: fits(runner, cache, rows, exact) -> bool; run(runner, h [T, D],
    cache, taps, logit rows, exact, cols) -> ({layer: [T, D]}, logits [R, V] or None). cols:
    the token ids whose logits are read (None: all); a kernel may compute only those."""

    name: str
    fits: Callable
    run: Callable


class FusedSegments:
    """The model's segments with the dense work between two attentions on one ORT graph per
    layer boundary (lowbit_fused.py)."""

    def __init__(self, model, fused):
        self.m, self.fused = model, fused
        self.embed, self.pre_attn, self.post_attn, self.head = (
            model.embed,
            model.pre_attn,
            model.post_attn,
            model.head,
        )

    def post_pre(self, i, h, o, pos):
        return self.fused.post_pre(i, h, o, pos, self.m.cos, self.m.sin)


FORWARD = (
    # each verify row alone on our compiled kernel, no padding (rowstep.py); MatMulNBits, fp32
    # cache; prompt rows too where it prefills faster (prefill_choice.py)
    Forward(
        "rowstep",
        lambda r, cache, T, exact: (
            (exact or r.prefill_on_rows)
            and r.rows is not None
            and r.model.backend is None
            and r.rows.fits(cache, T)
        ),
        lambda r, h, cache, taps, rows, exact, cols: r.rows(h, cache, taps, rows, cols),
    ),
    # the whole forward as one ORT graph, probed row-invariant: ``exact`` holds as it is
    Forward(
        "ort-step-graph",
        lambda r, cache, T, exact: (
            r.step is not None and r.model.backend is None and r.step.fits(cache, T)
        ),
        lambda r, h, cache, taps, rows, exact, cols: r.step(h, cache, taps, rows),
    ),
    # a bf16/fp8 cache on a MatMulNBits model: one graph per layer boundary (built on first use)
    Forward(
        "fused-graphs",
        lambda r, cache, T, exact: r.model.backend is None and r.fused_graphs() is not None,
        lambda r, h, cache, taps, rows, exact, cols: r.model.run_layers(
            h, cache, taps, rows, exact, FusedSegments(r.model, r.fused)
        ),
    ),
    # an attached engine (ONNX Runtime, TensorRT) runs the dense segments
    Forward(
        "engine",
        lambda r, cache, T, exact: r.model.backend is not None,
        lambda r, h, cache, taps, rows, exact, cols: r.model.run_layers(
            h, cache, taps, rows, exact
        ),
    ),
    Forward(
        "torch",
        lambda r, cache, T, exact: True,
        lambda r, h, cache, taps, rows, exact, cols: r.model.run_layers(
            h, cache, taps, rows, exact, r.model
        ),
    ),
)


class Runner:
    """The kernels built for one dense model, tried in ``FORWARD`` order for each forward.
    ``rows``, ``step``, ``fused``: the row kernel, the step graph, the per-boundary graphs (None
    where they do not run; ``rows_why`` says why the row kernel does not)."""

    def __init__(self, model, kernels: tuple[Forward, ...] = FORWARD):
        self.model, self.kernels = model, kernels
        self.rows, self.rows_why = None, "weights are not MatMulNBits blocks"
        self.fused = None
        self.prefill_on_rows = False
        self._step, self._step_built = None, True
        self._fused_built = False

    @property
    def step(self):
        """The ORT step graph, or None. Where the row kernel runs every fp32 forward it is
        built on first ask only (~0.5 s of ORT session start and a second copy of the
        weights): nothing reaches it there but a test or a rare path."""
        if not self._step_built:
            self._step_built = True
            self._step = step_graph(self.model, self.model.row_verdicts)
            if self._step is not None:
                prepare_sessions(self.model, self)
        return self._step

    @property
    def built_step(self):
        """The step graph if built, else None (never builds it)."""
        return self._step if self._step_built else None

    @step.setter
    def step(self, graph) -> None:
        self._step, self._step_built = graph, True

    def pick(self, cache, T: int, exact: bool) -> Forward:
        return next(k for k in self.kernels if k.fits(self, cache, T, exact))

    def run(self, h, cache, taps, rows, exact, cols=None):
        return self.pick(cache, h.shape[0], exact).run(self, h, cache, taps, rows, exact, cols)

    @property
    def decode_kernel(self) -> str:
        """What runs decode steps and verifies on an fp32 cache (reports, /health)."""
        if self.rows is not None:
            return "rowstep"
        if self.step is not None:
            return "ort-step-graph"
        return self.model.int4_kernel or "torch"

    @property
    def prefill_kernel(self) -> str:
        """What runs prompt rows on an fp32 cache (reports, /health)."""
        if self.prefill_on_rows:
            return "rowstep"
        return "ort-step-graph" if self.step is not None else self.model.int4_kernel or "torch"

    def fused_graphs(self):
        """The per-boundary graphs of a MatMulNBits model, built on first use: they hold their
        own copy of the weights, so only a cache the step graph cannot take builds them."""
        if self.model.int4_kernel == "ort" and not self._fused_built:
            self._build_fused()
        return self.fused

    def _build_fused(self) -> None:
        """The graphs, then the sessions they leave out, and the weights' pages ORT has read
        handed back."""
        self.fused, self._fused_built = fuse_layers(self.model, self.model.row_verdicts), True
        prepare_sessions(self.model, self)


def attach(model):
    """Build the kernels that fit a dense ``model`` (their row-invariance probes are kept in
    ``model.row_verdicts``, which the weight cache stores) and attach the runner. -> model."""
    t0 = time.perf_counter()
    r = Runner(model)
    if model.int4_kernel == "ort":
        # MatMulNBits models: the whole forward as one graph for fp32 KV caches, one graph per
        # layer boundary for the others, each where row-invariant; the row kernel for steps
        # and verifies where it builds.
        r.rows, r.rows_why = row_step(model, model.row_verdicts)
        if settled_by_build(r.rows):
            # a regrouping build runs every prompt, step and verify row of an fp32 cache
            # (prefill_choice.py): the step graph waits for a caller, the per-boundary graphs
            # for a bf16 or fp8 cache
            r._step_built = False
            r.prefill_on_rows = True
            release_copied(model)
        else:
            r.step = step_graph(model, model.row_verdicts)
            if r.step is None:
                r._build_fused()
            r.prefill_on_rows = prefill_on_rows(model, r.rows, r.step, model.row_verdicts)
            if r.step is not None:
                prepare_sessions(model, r)
    model.runner = r
    model.probe_s += time.perf_counter() - t0
    return model


# ---- decode: who owns a runtime's verifies and its request caches


@dataclass(frozen=True)
class DecodeAsk:
    """What a decode owner must fit: the runtime's target and settings."""

    model: object
    kv_dtype: str = "fp32"
    kv_scales: object = None
    fixed_shape: bool | None = None  # every decode forward at ``step_rows`` rows; None = where
    step_rows: int = STEP_ROWS  # kernels are not row-invariant (CUDA)
    max_context: int | None = None
    compile: bool = False
    slots: int = 1  # sequences decoding at once (fixed-shape decode keeps a slot each)

    @property
    def one_shape(self) -> bool:
        return (
            self.model.device.type == "cuda" if self.fixed_shape is None else bool(self.fixed_shape)
        )


@dataclass
class Decode:
    """The verify a runtime calls and how it gets a request's cache. ``cache(new_cache, reach,
    k)``: reach = prompt + new tokens, k = drafts per cycle; new_cache is the runtime's."""

    name: str
    verify: Callable
    cache: Callable
    decoder: FixedShapeDecoder | None = None
    pad_rows: int = 0
    release: Callable = lambda cache: None  # a finished request gives its cache back


def _fixed_shape(a: DecodeAsk) -> Decode:
    dec = FixedShapeDecoder(
        a.model,
        a.step_rows,
        a.max_context,
        a.kv_dtype,
        a.kv_scales,
        compile=a.compile,
        slots=a.slots,
    )
    limit = a.model.cfg.max_position_embeddings
    # its key span follows prompt + new tokens, never K
    return Decode(
        "fixed-shape",
        dec.verify,
        lambda new_cache, reach, k: dec.new_cache(min(limit, reach)),
        dec,
        release=dec.release,
    )


def _padded(a: DecodeAsk) -> Decode:
    limit, rows = a.model.cfg.max_position_embeddings, a.step_rows
    return Decode(
        "padded-verify",
        PaddedVerify(a.model, rows).verify,
        lambda new_cache, reach, k: new_cache(min(limit, reach + max(k + 1, rows))),
        pad_rows=rows,
    )


def _model_verify(a: DecodeAsk) -> Decode:
    limit = a.model.cfg.max_position_embeddings
    return Decode(
        "model", a.model.verify, lambda new_cache, reach, k: new_cache(min(limit, reach + k + 1))
    )


@dataclass(frozen=True)
class DecodeOwner:
    name: str
    fits: Callable  # DecodeAsk -> bool
    build: Callable  # DecodeAsk -> Decode


DECODE = (
    # dense targets off the CPU (or forced): every decode forward at one row count over a static
    # KV store, CUDA graphs on CUDA (fixed_shape.py)
    DecodeOwner("fixed-shape", lambda a: a.one_shape and not a.model.is_hybrid, _fixed_shape),
    # targets with recurrent state roll back one forward only: verifies padded to the row count
    DecodeOwner("padded-verify", lambda a: a.one_shape and a.model.is_hybrid, _padded),
    DecodeOwner("model", lambda a: True, _model_verify),
)


def pick_decode(ask: DecodeAsk) -> Decode:
    return next(o for o in DECODE if o.fits(ask)).build(ask)
