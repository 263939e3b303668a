"""FP8 GEMMs as explicit Q/DQ: a pass over an exported dense-segment graph.

Every projection GEMM of a segment (a MatMul whose weight is an initializer, directly or
through the exporter's Transpose, or a Gemm) gets a QuantizeLinear/DequantizeLinear pair to
float8e4m3fn on each operand:

    x ── Q(s_x) ── DQ(s_x) ──┐                 s_x: per tensor, from calibration (the file)
                              MatMul ── y
    W ── Q(s_w, axis) ── DQ ──┘                 s_w: per output channel, max|W[o, :]| / 448

That is the pattern TensorRT 10's strongly typed networks turn into FP8 GEMMs (the DQ nodes
feed the GEMM directly, zero points are 0, Q saturates), and ONNX Runtime's CPU provider
runs the very same graph as its twin: Q/DQ round each operand to e4m3 and the GEMM runs in
the graph's float type, which is what an FP8 GEMM with a wider accumulator computes. Both
need opset >= 19 (float8 Q/DQ), so the pass raises the graph's opset to ``QDQ_OPSET``; the
ops the exporter emits at opset 18 mean the same at 19.

Activation scales are keyed by the projection's weight name in the graph — the names the
weights carry as trace inputs (``layers.{i}.wqkv``, ``layers.{i}.wo``, ``layers.{i}.w_gate_up``,
``layers.{i}.w_down``, ``head_w``) — so one file serves the per-segment and the fused export.
The head stays in the graph's precision by default (``SKIP``): its error goes straight into
the logits every token is chosen from, and it is one GEMM of 2L + 1.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from thor_runtime.errors import ThorError

QDQ_OPSET = 19
QDQ_FORMAT = 1  # bumped when the inserted pattern changes: part of every cache key
FP8_MAX = 448.0  # largest finite float8e4m3fn value
SCALES_FORMAT = "thor-fp8-act-scales/1"
SKIP = ("head_w",)
_FLOAT8E4M3FN = 17  # onnx.TensorProto.FLOAT8E4M3FN
_TORCH_OF_ONNX = {1: torch.float32, 10: torch.float16, 16: torch.bfloat16}


# ---- which weights are projections


def projection_shapes(view, plan) -> dict[str, tuple[int, int]]:
    """{weight name: (out, in)} of every GEMM weight the graphs of ``plan`` multiply by:
    the 2-D tensors a segment reads, but the embedding table (a lookup, not a GEMM)."""
    out = {}
    for segment, layer in plan:
        for name, t in view.weights_for(segment, layer).items():
            if name != "embed_w" and t is not None and t.dim() == 2:
                out[name] = tuple(int(d) for d in t.shape)
    return out


def weight_scales(w: torch.Tensor) -> torch.Tensor:
    """w [out, in] -> per-output-channel scales [out] fp32 (an all-zero row gets 1)."""
    amax = w.detach().float().abs().amax(dim=1)  # [out]
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def fake_fp8(x: torch.Tensor, scale) -> torch.Tensor:
    """What a Q/DQ pair computes: x / scale saturated to ±448, rounded to e4m3 (nearest even),
    times scale, in x's dtype. ``scale`` broadcasts against x."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    q = (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (q.float() * s).to(x.dtype)


# ---- the scales file


@dataclass(frozen=True)
class Fp8Scales:
    """Per-tensor activation scales of the projections, by weight name. File (JSON):

    {"format": "thor-fp8-act-scales/1", "margin": m, "prompt_set_sha256": "...", ...,
     "projections": {"layers.0.wqkv": {"shape": [out, in], "amax": a, "scale": s}, ...}}
    """

    scales: dict[str, float]
    shapes: dict[str, tuple[int, int]]
    amax: dict[str, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.scales:
            raise ThorError("fp8 scales: no projections")
        bad = [
            n
            for n, s in self.scales.items()
            if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0)
        ]
        if bad:
            raise ThorError(f"fp8 scales: the scale of {bad[0]} must be a finite positive number")
        if set(self.shapes) != set(self.scales):
            raise ThorError("fp8 scales: every projection needs both a scale and a shape")

    @classmethod
    def from_amax(
        cls,
        amax: dict[str, float],
        shapes: dict[str, tuple[int, int]],
        margin: float = 1.0,
        meta: dict | None = None,
    ) -> "Fp8Scales":
        # A projection whose input never left zero would get scale 0 and divide by zero: give it 1.
        scales = {n: (a * margin / FP8_MAX if a > 0 else 1.0) for n, a in amax.items()}
        return cls(
            scales, {n: shapes[n] for n in amax}, dict(amax), {"margin": margin, **(meta or {})}
        )

    def times(self, k: float) -> "Fp8Scales":
        """Every activation scale multiplied by k (a deliberately wrong file, for the checks)."""
        return Fp8Scales(
            {n: s * k for n, s in self.scales.items()}, self.shapes, self.amax, self.meta
        )

    def to_doc(self) -> dict:
        return {
            "format": SCALES_FORMAT,
            **self.meta,
            "projections": {
                n: {"shape": list(self.shapes[n]), "amax": self.amax.get(n), "scale": s}
                for n, s in sorted(self.scales.items())
            },
        }

    @property
    def sha256(self) -> str:
        """Digest of what the graphs depend on: the scales and shapes (not the report)."""
        doc = {n: [self.scales[n], list(self.shapes[n])] for n in sorted(self.scales)}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()

    def save(self, path: str | Path) -> None:
        from thor_runtime.fileio import write_json_atomic

        write_json_atomic(path, self.to_doc())

    @classmethod
    def load(cls, path: str | Path) -> "Fp8Scales":
        from thor_runtime.fileio import read_json

        doc = read_json(path, "fp8 scales file")
        if doc.get("format") != SCALES_FORMAT:
            raise ThorError(
                f"fp8 scales file {path}: expected format {SCALES_FORMAT!r} "
                "(write one with `thor calib fp8-scales`)"
            )
        projs = doc.get("projections")
        if not isinstance(projs, dict) or not all(isinstance(p, dict) for p in projs.values()):
            raise ThorError(
                f"fp8 scales file {path}: 'projections' must map weight names to objects"
            )
        try:
            shapes = {n: tuple(int(d) for d in p["shape"]) for n, p in projs.items()}
            scales = {n: p["scale"] for n, p in projs.items()}
        except (KeyError, TypeError, ValueError):
            raise ThorError(
                f"fp8 scales file {path}: every projection needs 'shape' [out, in] and 'scale'"
            ) from None
        if any(len(s) != 2 for s in shapes.values()):
            raise ThorError(f"fp8 scales file {path}: every shape must be [out, in]")
        meta = {k: v for k, v in doc.items() if k not in ("format", "projections")}
        amax = {n: p["amax"] for n, p in projs.items() if isinstance(p.get("amax"), (int, float))}
        try:
            return cls(scales, shapes, amax, meta)
        except ThorError as e:
            raise ThorError(
                f"fp8 scales file {path}: {str(e).removeprefix('fp8 scales: ')}"
            ) from None

    def check(self, shapes: dict[str, tuple[int, int]], skip=SKIP) -> None:
        """Refuse a file made for another model: every projection the graphs quantize must be
        here, with the same weight shape."""
        missing = [n for n in shapes if n not in skip and n not in self.scales]
        if missing:
            raise ThorError(
                f"fp8 scales: no activation scale for {missing[0]} ({len(missing)} missing); "
                "the file was calibrated for another model: run `thor calib fp8-scales`"
            )
        wrong = [
            n for n in shapes if n in self.shapes and tuple(self.shapes[n]) != tuple(shapes[n])
        ]
        if wrong:
            n = wrong[0]
            raise ThorError(
                f"fp8 scales: {n} is {list(self.shapes[n])} in the file but {list(shapes[n])} "
                "in the model; the file was calibrated for another model"
            )


# ---- the pass


def _gemm_weight(node, producer: dict, inits: dict):
    """(weight initializer, output-channel axis of the GEMM's B operand, B is W transposed)
    for a projection GEMM, else None."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    b = node.input[1]
    if node.op_type == "Gemm":
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        if any(a.name == "transA" and a.i for a in node.attribute) or b not in inits:
            return None
        return (inits[b], 0, False) if trans_b else (inits[b], 1, True)
    if b in inits and len(inits[b].dims) == 2:  # B [in, out]
        return inits[b], 1, True
    t = producer.get(b)
    if (
        t is not None
        and t.op_type == "Transpose"
        and t.input[0] in inits
        and len(inits[t.input[0]].dims) == 2
        and [list(a.ints) for a in t.attribute if a.name == "perm"] in ([], [[1, 0]])
    ):
        return inits[t.input[0]], 1, False  # B = W^T, W [out, in]
    return None


def _tensor(name: str, values: torch.Tensor, onnx_type: int):
    from onnx import TensorProto

    t = values.detach().contiguous().cpu()
    tp = TensorProto(name=name, data_type=onnx_type, dims=list(t.shape))
    tp.raw_data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return tp


def insert_qdq(model, act_scales: dict[str, float], skip=SKIP) -> int:
    """Rewrite ``model`` (an onnx.ModelProto with its weights loaded) in place. -> the number of
    GEMMs that now take FP8 operands. A projection with no scale in ``act_scales`` is refused."""
    from onnx import helper, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    nodes, added, count, seen = [], [], 0, {}
    for node in g.node:
        found = _gemm_weight(node, producer, inits)
        if found is None or found[0].name in skip:
            nodes.append(node)
            continue
        w_init, axis, stored_as_b = found
        w = found[0].name
        if w not in act_scales:
            raise ThorError(f"fp8 Q/DQ: no activation scale for {w}")
        dtype = _TORCH_OF_ONNX.get(w_init.data_type)
        if dtype is None:
            raise ThorError(
                f"fp8 Q/DQ: {w} has ONNX type {w_init.data_type}; expected fp32, fp16 or bf16"
            )
        W = torch.from_numpy(numpy_helper.to_array(w_init).astype("float32"))  # as stored
        W = W.t() if stored_as_b else W  # [out, in]
        ws = weight_scales(W)  # [out]
        xs = torch.tensor(float(act_scales[w]))
        if not (xs.to(dtype) > 0 and (ws.to(dtype) > 0).all()):
            raise ThorError(f"fp8 Q/DQ: a scale of {w} underflows in {dtype}")
        seen[w] = seen.get(w, 0) + 1  # a weight two GEMMs share
        p = f"qdq/{w}" if seen[w] == 1 else f"qdq/{w}#{seen[w]}"
        added += [
            _tensor(f"{p}.x_scale", xs.to(dtype), w_init.data_type),
            _tensor(f"{p}.x_zero", torch.zeros((), dtype=torch.uint8), _FLOAT8E4M3FN),
            _tensor(f"{p}.w_scale", ws.to(dtype), w_init.data_type),
            _tensor(f"{p}.w_zero", torch.zeros(ws.shape[0], dtype=torch.uint8), _FLOAT8E4M3FN),
        ]
        x, b = node.input[0], node.input[1]
        nodes += [
            helper.make_node(
                "QuantizeLinear", [x, f"{p}.x_scale", f"{p}.x_zero"], [f"{p}.x_q"], name=f"{p}.x_Q"
            ),
            helper.make_node(
                "DequantizeLinear",
                [f"{p}.x_q", f"{p}.x_scale", f"{p}.x_zero"],
                [f"{p}.x_dq"],
                name=f"{p}.x_DQ",
            ),
            helper.make_node(
                "QuantizeLinear",
                [b, f"{p}.w_scale", f"{p}.w_zero"],
                [f"{p}.w_q"],
                name=f"{p}.w_Q",
                axis=axis,
            ),
            helper.make_node(
                "DequantizeLinear",
                [f"{p}.w_q", f"{p}.w_scale", f"{p}.w_zero"],
                [f"{p}.w_dq"],
                name=f"{p}.w_DQ",
                axis=axis,
            ),
        ]
        node.input[0], node.input[1] = f"{p}.x_dq", f"{p}.w_dq"
        nodes.append(node)
        count += 1
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(added)
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, QDQ_OPSET)
    model.ir_version = max(model.ir_version, 9)  # float8 types
    model.doc_string += f"; fp8 Q/DQ on {count} GEMMs"
    return count


def export_all(view, plan, directory, scales: Fp8Scales, progress=None, skip=SKIP) -> list[dict]:
    """segments.export_all with the pass between export and save."""
    from .segments import export_graph, graph_name, save_graph

    graphs = []
    for n, (segment, layer) in enumerate(plan):
        name = graph_name(segment, layer)
        if progress is not None:
            progress(f"export {name} (fp8 Q/DQ)", n, len(plan))
        model = export_graph(view, segment, layer)
        gemms = insert_qdq(model, scales.scales, skip)
        files = save_graph(model, directory, name)
        graphs.append(
            {
                "segment": segment,
                "layer": layer,
                "onnx": files[0],
                "data": files[1] if len(files) > 1 else None,
                "fp8_gemms": gemms,
            }
        )
    if progress is not None:
        progress("exported", len(plan), len(plan))
    return graphs


def scales_for(opts, view, plan) -> Fp8Scales | None:
    """The checked scales file of ``opts`` (BackendOptions), or None when fp8 is not asked for."""
    if not opts.fp8_scales:
        return None
    scales = Fp8Scales.load(opts.fp8_scales)
    scales.check(projection_shapes(view, plan))
    return scales


def key_fields(scales: Fp8Scales) -> dict:
    return {
        "fp8_qdq": {
            "format": QDQ_FORMAT,
            "opset": QDQ_OPSET,
            "skip": list(SKIP),
            "scales_sha256": scales.sha256,
        }
    }
