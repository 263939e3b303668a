"""Backends for the dense segments, behind one interface.

A backend runs the graphs of ``segments.graph_plan`` (``run(segment, layer, *inputs)``) and, on
top of that, the methods the model's ``forward`` calls when ``model.backend`` is set: embed,
pre_attn, post_attn, post_pre, head (and pre_gdn, post_gdn for hybrid Gated-DeltaNet models,
pre_moe for their mixture-of-experts layers, whose MoE block the model runs itself).
Attention, the GDN mixer, the KV cache and recurrent state, speculation and grammar never see
which backend ran. ``torch`` is the reference (the model's own methods); the graph
backends load only from the verified engine cache (cache.py), building an entry on first use.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable

import torch

from thor_runtime.errors import ThorError

# re-exported: importers of this module find these names here too
from .base import (
    PRECISIONS as PRECISIONS,
)
from .base import (
    PREFILL_PROFILE as PREFILL_PROFILE,
)

# the shared part, importable from here as before
from .base import (
    BackendOptions,
    GraphBackend,
    TorchBackend,  # noqa: F401
)
from .base import (
    default_cache_dir as default_cache_dir,
)
from .base import (
    key_fields as key_fields,
)
from .base import (
    profile_tokens as profile_tokens,
)
from .base import (
    spec_width as spec_width,
)
from .segments import SEGMENTS, TOKEN_AXIS, example_inputs


def _make_torch(model, opts, progress):
    return TorchBackend(model, opts.form)


def _make_ort(model, opts, progress):
    from .ort import OrtBackend

    return OrtBackend.open(model, opts, progress)


def _make_trt(model, opts, progress):
    from .tensorrt import TrtBackend

    return TrtBackend.open(model, opts, progress)


# name -> factory(model, BackendOptions, progress) -> GraphBackend
BACKENDS: dict[str, Callable] = {
    "torch": _make_torch,
    "onnxruntime": _make_ort,
    "tensorrt": _make_trt,
}


def make_backend(
    name: str, model, opts: BackendOptions = BackendOptions(), progress=None
) -> GraphBackend:
    if name not in BACKENDS:
        raise ThorError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name](model, opts, progress)


class RowWiseGraphs(GraphBackend):
    """``backend`` called one row at a time, for any plan (thor_runtime.models.dense.RowWise does
    this for the dense model's methods): each call is the very call a 1-row step makes."""

    def __init__(self, backend: GraphBackend):
        self.b, self.name, self.plan = backend, backend.name, backend.plan

    def run(self, segment, layer, *xs):
        if segment == "embed":  # a gather: the same bits for any row count
            return self.b.run(segment, layer, *xs)
        rows = [
            self.b.run(segment, layer, *(x[t : t + 1] for x in xs)) for t in range(xs[0].shape[0])
        ]
        return tuple(
            torch.cat(parts, dim=TOKEN_AXIS.get(n, 0))
            for n, parts in zip(SEGMENTS[segment].outputs, zip(*rows))
        )


def rows_exact(model, backend: GraphBackend) -> GraphBackend:
    """``backend`` itself if each kind of graph in its plan gives each of 2..EXACT_ROWS rows the
    bits that row gets alone (one seeded probe per segment and input shape), else RowWiseGraphs."""
    from thor_runtime.models import EXACT_ROWS

    rw, seen = RowWiseGraphs(backend), set()
    for segment, layer in backend.plan:
        xs = example_inputs(model, segment, layer, T=EXACT_ROWS, start=0, seed=1)
        key = (segment, tuple(tuple(x.shape) for x in xs))
        if segment == "embed" or key in seen:
            continue
        seen.add(key)
        alone = rw.run(segment, layer, *xs)
        for m in range(2, EXACT_ROWS + 1):
            got = backend.run(segment, layer, *(x[:m] for x in xs))
            if not all(
                torch.equal(g, a.narrow(TOKEN_AXIS.get(n, 0), 0, m))
                for n, g, a in zip(SEGMENTS[segment].outputs, got, alone)
            ):
                return rw
    return backend


def attach(model, backend: GraphBackend | None) -> None:
    """Route ``model.forward``'s dense segments through ``backend`` (None or torch: the model's
    own methods, the fast path)."""
    model.backend = None if backend is None or type(backend) is TorchBackend else backend
    if model.backend is None:
        model.backend_exact = None
    elif getattr(
        model, "is_hybrid", False
    ):  # verify must stay exact: probe the kernels, else row by row
        model.backend_exact = rows_exact(model, model.backend)
    else:
        from thor_runtime.models import backend_for_verify

        model.backend_exact = backend_for_verify(model, model.backend)


@contextmanager
def using(model, backend: GraphBackend | None):
    before = model.backend, model.backend_exact
    attach(model, backend)
    try:
        yield model
    finally:
        model.backend, model.backend_exact = before
