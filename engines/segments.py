"""The dense segments of a TargetModel as ONNX graphs.

Each graph is traced from the model's own segment methods (``embed``, ``pre_attn``,
``post_attn``, ``head``; hybrids add ``pre_gdn``, ``post_gdn`` and ``pre_moe``) over plain dense
tensors, so the reference model stays the one definition of the math: an architecture whose segment
code the torch model runs exports with one entry in EXPORT_ARCHS, and a new *kind* of layer is one
entry in LAYER_KINDS. The stateful mixers (attention: the KV cache; the Gated-DeltaNet conv and
delta rule: the recurrent state) are never exported, nor is a mixture-of-experts block (its
routing is data-dependent): a MoE layer's graph ends at the block's input. Exporter: torch.onnx's
TorchScript exporter (``dynamo=False``: fast, and needs no onnxscript), opset ``OPSET``, the token
axis ``T`` dynamic on every input and output. RoPE is computed in the graph from the ``pos`` input
(absolute positions, int64 [T]), so one graph serves every position. Weights above
``EXTERNAL_MIN_BYTES`` go to one external data file per graph (``NAME.onnx.data``); the
``.onnx`` itself stays small.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import types
from dataclasses import dataclass
from typing import Callable

import torch

from thor_runtime.config import ENGINE_FORMS
from thor_runtime.errors import ThorError
from thor_runtime.models import Int8Weight, PackedWeight, RowLoop

OPSET = 18
# Bumped whenever the graphs change inputs, outputs or math: part of every cache key.
EXPORT_FORMAT = 1
EXTERNAL_MIN_BYTES = 1024


@dataclass(frozen=True)
class SegmentSpec:
    """One kind of graph: its inputs and outputs (all with a dynamic token axis 0 except q/k/v,
    whose token axis is 1) and the reference code it is traced from."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: Callable  # (model-like, layer index, *inputs) -> outputs

    def __post_init__(self):
        if not self.inputs or not self.outputs:
            raise ValueError("a segment needs inputs and outputs")


def _post_pre(m, i, h, o, pos):
    h = m.post_attn(i, h, o)
    return (h, *m.pre_attn(i + 1, h, pos))


# ``run`` calls the segment methods on whatever it is given — the model itself (the torch
# backend) or a DenseView, which runs the model class's own methods over dense weights.
SEGMENTS = {
    "embed": SegmentSpec(("ids",), ("h",), lambda m, i, ids: m.embed(ids)),
    "pre_attn": SegmentSpec(
        ("h", "pos"), ("q", "k", "v"), lambda m, i, h, pos: m.pre_attn(i, h, pos)
    ),
    "post_attn": SegmentSpec(("h", "o"), ("h_out",), lambda m, i, h, o: m.post_attn(i, h, o)),
    # post_attn of layer i fused with pre_attn of layer i + 1: one graph between two attentions
    "post_pre": SegmentSpec(("h", "o", "pos"), ("h_out", "q", "k", "v"), _post_pre),
    "head": SegmentSpec(("h",), ("logits",), lambda m, i, h: m.head(h)),
    # hybrids: gated attention (q, k, v and the output gate; attention * sigmoid(gate) stays eager)
    "pre_gattn": SegmentSpec(
        ("h", "pos"), ("q", "k", "v", "gate"), lambda m, i, h, pos: m.pre_attn(i, h, pos)
    ),
    # hybrids, GDN layers: the conv inputs, the gate and the delta rule's b / a before the mixer;
    # the gated RMSNorm of its output after (post_attn then closes the layer: out proj + MLP)
    "pre_gdn": SegmentSpec(("h",), ("qkv", "z", "b", "a"), lambda m, i, h: m.pre_gdn(i, h)),
    "post_gdn": SegmentSpec(("core", "z"), ("o",), lambda m, i, core, z: (m.post_gdn(i, core, z),)),
    # hybrids, mixture-of-experts layers: out proj + residual and the MLP's RMSNorm; the MoE block
    # (router, experts, shared expert) and its residual add stay eager
    "pre_moe": SegmentSpec(("h", "o"), ("h_out", "x"), lambda m, i, h, o: m.pre_moe(i, h, o)),
}
TOKEN_AXIS = {"q": 1, "k": 1, "v": 1}  # [H, T, Dh]; every other tensor is [T, ...]


@dataclass(frozen=True)
class LayerKind:
    """The graphs of one kind of layer: those before its mixer, those after it, and the graph
    fusing the after-part with the next layer's before-part (None: no fused form)."""

    pre: tuple[str, ...]
    post: tuple[str, ...]
    fused: str | None = None

    def __post_init__(self):
        if not self.pre or not self.post or any(s not in SEGMENTS for s in (*self.pre, *self.post)):
            raise ValueError(f"bad layer kind {self}")


LAYER_KINDS = {
    "attention": LayerKind(("pre_attn",), ("post_attn",), "post_pre"),
    "gated_attention": LayerKind(("pre_gattn",), ("post_attn",)),
    "gdn": LayerKind(("pre_gdn",), ("post_gdn", "post_attn")),
    # the same with a mixture-of-experts MLP: the graph after the mixer stops at the MoE block
    "gated_attention_moe": LayerKind(("pre_gattn",), ("pre_moe",)),
    "gdn_moe": LayerKind(("pre_gdn",), ("post_gdn", "pre_moe")),
}


def _hybrid_kind(cfg, i: int) -> str:
    kind = "gdn" if cfg.layer_types[i] == "linear_attention" else "gated_attention"
    return kind + "_moe" if i in cfg.moe_layers else kind


# Architectures the exporter knows, mapped to their layer kind (a callable of (cfg, layer)
# for hybrids). Adding an architecture whose torch segments already work is one entry.
EXPORT_ARCHS = {
    "llama": "attention",
    "qwen2": "attention",
    "qwen3": "attention",
    "qwen3_5": _hybrid_kind,
    "qwen3_next": _hybrid_kind,
}

# The graph sequences a model runs: (segment, layer) pairs; layer None for embed/head.
FORMS = ENGINE_FORMS  # stated once, in the runtime's config table


def layer_kind(cfg, i: int) -> str:
    kind = EXPORT_ARCHS.get(cfg.arch)
    if kind is None:
        raise ThorError(
            f"engines: no ONNX export for architecture {cfg.arch!r} yet "
            f"(exportable: {', '.join(EXPORT_ARCHS)}); use --backend torch"
        )
    return kind(cfg, i) if callable(kind) else kind


def graph_plan(cfg, form: str) -> list[tuple[str, int | None]]:
    """Every graph a model needs in ``form``: 'segments' = embed, the graphs before each
    layer's mixer, those after it, head; 'fused' = embed, pre of layer 0, post_i+pre_i+1 fused,
    post of the last, head (layer kinds with a fused graph only)."""
    if form not in FORMS:
        raise ThorError(f"unknown engine form {form!r}; choose one of {', '.join(FORMS)}")
    n = cfg.num_layers
    kinds = [LAYER_KINDS[layer_kind(cfg, i)] for i in range(n)]
    plan: list[tuple[str, int | None]] = [("embed", None)]
    if form == "segments":
        plan += [(s, i) for i in range(n) for s in kinds[i].pre] + [
            (s, i) for i in range(n) for s in kinds[i].post
        ]
    else:
        if any(k.fused is None for k in kinds):
            raise ThorError(
                f"engines: the fused form is not available for {cfg.arch} (its layers are "
                "exported per segment, one graph on each side of a mixer); "
                "use --engine-form segments"
            )
        plan += [(s, 0) for s in kinds[0].pre] + [(kinds[i].fused, i) for i in range(n - 1)]
        plan += [(s, n - 1) for s in kinds[n - 1].post]
    return plan + [("head", None)]


def graph_name(segment: str, layer: int | None) -> str:
    return segment if layer is None else f"{segment}.{layer}"


# ---- a dense, trace-friendly view of the model


def dense_weight(w) -> torch.Tensor:
    """The plain [out, in] tensor behind any weight layout the model may hold."""
    if isinstance(w, RowLoop):  # row by row is how torch runs it; the graph gets the weight
        w = w.w
    if isinstance(w, torch.Tensor) or w is None:
        return w
    if isinstance(w, Int8Weight):
        raise ThorError(
            "engines: int8 weight-only models are not exported; load fp32, bf16 or fp16 weights"
        )
    if isinstance(w, PackedWeight):
        if w.dense is not None:
            return w.dense
        # Packed only: multiply by the identity to read it back. Exact: each output is one
        # weight times 1 plus zeros.
        eye = torch.eye(w.shape[1], dtype=_packed_dtype(w))
        y = torch.ops.mkldnn._linear_pointwise(eye, w.w, None, "none", [], "")  # [in, out]
        return y.t().contiguous()
    raise ThorError(f"engines: cannot export a weight of type {type(w).__name__}")


def _packed_dtype(w: PackedWeight) -> torch.dtype:
    for dt in (torch.float32, torch.bfloat16):
        try:
            w(torch.zeros(1, w.shape[1], dtype=dt))
            return dt
        except (RuntimeError, TypeError):
            continue
    raise ThorError("engines: cannot read back a packed weight")


class _Rope:
    """Stands in for the model's cos/sin tables (``table[pos]``) inside a graph: computed
    from the positions with the same fp32 product as the table, so any position works."""

    def __init__(self, inv_freq: torch.Tensor, dtype: torch.dtype, fn):
        self.inv_freq, self.dtype, self.fn = inv_freq, dtype, fn

    def __getitem__(self, pos: torch.Tensor) -> torch.Tensor:
        f = pos.to(torch.float32).unsqueeze(-1) * self.inv_freq  # [T, Dh/2]
        return self.fn(torch.cat((f, f), dim=-1)).to(self.dtype)  # [T, Dh]


def _is_weight(v) -> bool:
    """Layer fields a graph may read; the rest (a layer's kind, the GDN mixer's parameters)
    belong to the eager mixers."""
    return not isinstance(v, (str, int, float, bool)) and not dataclasses.is_dataclass(v)


class DenseView:
    """What the segment methods read from ``self`` — cfg, layers, norms, embedding, head,
    rope — with every weight as a plain tensor, and the model class's own segment methods:
    ``view.pre_attn(...)`` runs ``type(model).pre_attn`` on the view. Weights are shared, not
    copied, when the model already holds them dense."""

    def __init__(self, model):
        graph_plan(
            model.cfg, "segments"
        )  # an architecture or a layer the export cannot cover: refused here
        self.impl = type(model)
        self.cfg, self.dtype, self.device = model.cfg, model.dtype, model.device
        self.embed_w = model.embed_w
        self.final_norm = model.final_norm
        self.head_w = dense_weight(model.head_w)
        self.layers = [
            dataclasses.replace(
                L,
                **{
                    f.name: dense_weight(getattr(L, f.name))
                    for f in dataclasses.fields(L)
                    if _is_weight(getattr(L, f.name))
                },
            )
            for L in model.layers
        ]
        self.cos = _Rope(model.inv_freq, model.dtype, torch.cos)
        self.sin = _Rope(model.inv_freq, model.dtype, torch.sin)

    def __getattr__(self, name):
        # Reached only for what the view lacks: the model class's methods, bound to the view
        # (segments and the helpers they call on ``self``, e.g. TargetModel.heads).
        impl = self.__dict__.get("impl")
        attr = getattr(impl, name, None) if impl is not None and not name.startswith("__") else None
        if not callable(attr):
            raise AttributeError(name)
        return types.MethodType(attr, self)

    def weights_for(self, segment: str, layer: int | None) -> dict[str, torch.Tensor]:
        """The tensors a segment may read, by stable name (layer i and i + 1 for the fused pair)."""
        out = {"embed_w": self.embed_w} if segment == "embed" else {}
        if segment == "head":
            out.update(final_norm=self.final_norm, head_w=self.head_w)
        if layer is not None:
            for i in (layer, layer + 1) if segment == "post_pre" else (layer,):
                for f in dataclasses.fields(self.layers[i]):
                    t = getattr(self.layers[i], f.name)
                    if isinstance(t, torch.Tensor):
                        out[f"layers.{i}.{f.name}"] = t
        return out

    def substituted(self, tensors: dict[str, torch.Tensor]) -> "DenseView":
        """A shallow copy reading ``tensors`` (named as in weights_for) instead of its own."""
        v = copy.copy(self)
        v.layers = list(self.layers)
        for name, t in tensors.items():
            if name.startswith("layers."):
                _, i, field = name.split(".")
                v.layers[int(i)] = dataclasses.replace(v.layers[int(i)], **{field: t})
            else:
                setattr(v, name, t)
        return v

    def weights_digest(self) -> str:
        """sha256 over every tensor the graphs embed, in a fixed order (part of the cache key)."""
        import hashlib

        h = hashlib.sha256()
        ts = [self.embed_w, self.final_norm, self.head_w, self.cos.inv_freq]
        for L in self.layers:
            ts += [
                getattr(L, f.name) for f in dataclasses.fields(L) if _is_weight(getattr(L, f.name))
            ]
        for t in ts:
            if t is None:
                h.update(b"-")
                continue
            t = t.detach().contiguous().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return h.hexdigest()


class _Graph(torch.nn.Module):
    """Traces one segment with its weights as extra graph inputs: the exporter's shape
    inference then never serializes them (seconds per 100 MB as constants); ``export_graph``
    turns those inputs into initializers holding the real tensors."""

    def __init__(self, view: DenseView, spec: SegmentSpec, layer: int | None, names: list[str]):
        super().__init__()
        self.view, self.spec, self.layer, self.names = view, spec, layer, names

    def forward(self, *args):
        n = len(self.spec.inputs)
        return self.spec.run(
            self.view.substituted(dict(zip(self.names, args[n:]))), self.layer, *args[:n]
        )


def example_inputs(
    view: DenseView, segment: str, layer: int | None, T: int = 3, start: int = 5, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Fixed, seeded inputs of the right shapes and dtypes (tracing and parity checks)."""
    cfg = view.cfg
    g = torch.Generator().manual_seed(seed * 1009 + (layer or 0))
    D = cfg.hidden_size
    gdn = layer is not None and "pre_gdn" in LAYER_KINDS[layer_kind(cfg, layer)].pre
    HD = cfg.value_dim if gdn else cfg.num_heads * cfg.head_dim  # what the mixer hands post_attn
    make = {
        "ids": lambda: torch.randint(0, cfg.vocab_size, (T,), generator=g),
        "pos": lambda: torch.arange(start, start + T),
        "h": lambda: torch.randn(T, D, generator=g).to(view.dtype),
        "o": lambda: (0.5 * torch.randn(T, HD, generator=g)).to(view.dtype),
        # the delta rule's output is fp32 whatever the weights
        "core": lambda: (
            0.5 * torch.randn(T, cfg.linear_num_value_heads, cfg.linear_value_head_dim, generator=g)
        ),
        "z": lambda: torch.randn(T, cfg.value_dim, generator=g).to(view.dtype),
    }
    return tuple(make[n]() for n in SEGMENTS[segment].inputs)


def export_graph(view: DenseView, segment: str, layer: int | None):
    """-> onnx.ModelProto of one segment (weights inline; ``save_graph`` externalizes them)."""
    import onnx

    spec = SEGMENTS[segment]
    weights = view.weights_for(segment, layer)  # {name: tensor}
    names = list(weights)
    dyn = {n: {TOKEN_AXIS.get(n, 0): "T"} for n in (*spec.inputs, *spec.outputs)}
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            _Graph(view, spec, layer, names),
            (*example_inputs(view, segment, layer), *weights.values()),
            buf,
            dynamo=False,
            input_names=[*spec.inputs, *names],
            output_names=list(spec.outputs),
            dynamic_axes=dyn,
            opset_version=OPSET,
            do_constant_folding=True,
        )
    model = onnx.load_from_string(buf.getvalue())
    _inputs_to_initializers(model, weights)
    model.doc_string = (
        f"thor-runtime segment {graph_name(segment, layer)} (export format {EXPORT_FORMAT})"
    )
    return model


def save_graph(model, directory, name: str) -> list[str]:
    """Write NAME.onnx (+ NAME.onnx.data when any weight is large). -> the file names written."""
    from pathlib import Path

    import onnx

    d = Path(directory)
    data = f"{name}.onnx.data"
    _constants_to_initializers(model)
    onnx.save_model(
        model,
        str(d / f"{name}.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data,
        size_threshold=EXTERNAL_MIN_BYTES,
    )
    return [f"{name}.onnx"] + ([data] if (d / data).exists() else [])


def _constants_to_initializers(model) -> None:
    """The tracer embeds weights as Constant nodes; initializers are what external data,
    TensorRT's parser and ONNX Runtime's weight prepacking expect."""
    from onnx import numpy_helper

    g = model.graph
    keep = []
    for node in g.node:
        if (
            node.op_type == "Constant"
            and len(node.attribute) == 1
            and node.attribute[0].name == "value"
        ):
            t = node.attribute[0].t
            if numpy_helper.to_array(t).nbytes >= EXTERNAL_MIN_BYTES:
                t.name = node.output[0]
                g.initializer.append(t)
                continue
        keep.append(node)
    del g.node[:]
    g.node.extend(keep)


def export_all(view: DenseView, plan, directory, progress=None) -> list[dict]:
    """Export every graph of ``plan`` into ``directory``. progress(label, done, total)."""
    graphs = []
    for n, (segment, layer) in enumerate(plan):
        name = graph_name(segment, layer)
        if progress is not None:
            progress(f"export {name}", n, len(plan))
        files = save_graph(export_graph(view, segment, layer), directory, name)
        graphs.append(
            {
                "segment": segment,
                "layer": layer,
                "onnx": files[0],
                "data": files[1] if len(files) > 1 else None,
            }
        )
    if progress is not None:
        progress("exported", len(plan), len(plan))
    return graphs


def output_shapes(cfg, segment: str, T: int) -> dict[str, tuple[int, ...]]:
    """Shape of each output of ``segment`` for T tokens (for binding preallocated outputs)."""
    D, Dh = cfg.hidden_size, cfg.head_dim
    shapes = {
        "h": (T, D),
        "h_out": (T, D),
        "q": (cfg.num_heads, T, Dh),
        "k": (cfg.num_kv_heads, T, Dh),
        "v": (cfg.num_kv_heads, T, Dh),
        "logits": (T, cfg.vocab_size),
        "gate": (T, cfg.num_heads * Dh),
        "x": (T, D),
    }
    if hasattr(cfg, "conv_dim"):  # hybrids' GDN layers
        Hv = cfg.linear_num_value_heads
        shapes.update(
            qkv=(T, cfg.conv_dim), z=(T, cfg.value_dim), b=(T, Hv), a=(T, Hv), o=(T, cfg.value_dim)
        )
    return {n: shapes[n] for n in SEGMENTS[segment].outputs}


_ONNX_TYPES = {torch.float32: 1, torch.float16: 10, torch.bfloat16: 16, torch.int64: 7}


def _inputs_to_initializers(model, weights: dict[str, torch.Tensor]) -> None:
    """Weight inputs of the trace become initializers with the real data; ones the graph
    never reads are dropped."""
    from onnx import TensorProto

    g = model.graph
    used = {x for node in g.node for x in node.input}
    keep = [i for i in g.input if i.name not in weights]
    del g.input[:]
    g.input.extend(keep)
    for name, t in weights.items():
        if name not in used:
            continue
        t = t.detach().contiguous().cpu()
        tp = TensorProto(name=name, data_type=_ONNX_TYPES[t.dtype], dims=list(t.shape))
        tp.raw_data = (
            t.view(torch.uint8).numpy().tobytes()
            if t.dtype != torch.float32
            else t.numpy().tobytes()
        )
        g.initializer.append(tp)
