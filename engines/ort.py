"""ONNX Runtime backend: one InferenceSession per graph, created only from verified cache bytes.

CPU provider everywhere; the CUDA provider when the model lives on a CUDA device and this
onnxruntime build has it. With ``--fp8-scales`` the graphs carry the fp8 Q/DQ of engines.qdq:
ONNX Runtime then runs the twin of TensorRT's FP8 GEMMs (each operand rounded to e4m3). Inputs and
outputs are bound in place to torch tensors (IO binding): no copies between torch and ONNX Runtime
on either device.
"""

from __future__ import annotations

import numpy as np
import torch

from thor_runtime.errors import ThorError

from . import qdq
from .base import BackendOptions, GraphBackend, key_fields
from .cache import EngineCache, make_key
from .segments import SEGMENTS, DenseView, export_all, graph_plan, output_shapes

_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64}


def import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise ThorError(
            "the onnxruntime backend needs onnx and onnxruntime: pip install 'thor-runtime[onnx]'"
        ) from None
    return onnxruntime


def providers_for(ort, device: torch.device) -> list[str]:
    have = ort.get_available_providers()
    if device.type == "cuda":
        if "CUDAExecutionProvider" not in have:
            raise ThorError(
                "the model is on CUDA but this onnxruntime has no CUDAExecutionProvider "
                "(install onnxruntime-gpu)"
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def ort_key(model, opts: BackendOptions, weights_sha256: str, scales=None):
    """``scales`` (engines.qdq.Fp8Scales): the graphs carry fp8 Q/DQ, the twin of TensorRT's FP8
    GEMMs."""
    ort = import_ort()
    if model.dtype not in _NP or (model.dtype == torch.float16 and model.device.type == "cpu"):
        raise ThorError(
            f"the onnxruntime backend runs fp32 weights on CPU (fp16 on CUDA); "
            f"the model has {str(model.dtype).replace('torch.', '')}: use --dtype fp32"
        )
    device = (
        "cpu"
        if model.device.type == "cpu"
        else f"cuda sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    )
    precision = (
        "fp8"
        if scales is not None
        else str(model.dtype).replace("torch.", "").replace("float", "fp")
    )
    fields = key_fields(
        model,
        "onnxruntime",
        f"onnxruntime {ort.__version__}",
        device,
        precision,
        opts.form,
        weights_sha256=weights_sha256,
        extra=qdq.key_fields(scales) if scales is not None else None,
    )
    return make_key(fields), fields


def ensure_entry(model, opts: BackendOptions, progress=None):
    """The verified-on-read cache entry for this model and options, built if missing."""
    view = DenseView(model)
    plan = graph_plan(model.cfg, opts.form)
    scales = qdq.scales_for(opts, view, plan)
    key, fields = ort_key(model, opts, view.weights_digest(), scales)
    cache = EngineCache(opts.root)
    entry = cache.lookup(key)
    if entry is None:
        if not opts.build:
            raise ThorError(
                f"no onnxruntime engines for this model in {opts.root} (key {key}); "
                "run `thor engines build --backend onnxruntime`"
            )
        if scales is None:
            entry = cache.build(
                key, fields, lambda d: {"graphs": export_all(view, plan, d, progress)}
            )
        else:
            entry = cache.build(
                key, fields, lambda d: {"graphs": qdq.export_all(view, plan, d, scales, progress)}
            )
    return entry


class OrtBackend(GraphBackend):
    name = "onnxruntime"

    LEVELS = {
        "disable": "ORT_DISABLE_ALL",
        "basic": "ORT_ENABLE_BASIC",
        "extended": "ORT_ENABLE_EXTENDED",
        "all": "ORT_ENABLE_ALL",
    }

    def __init__(self, model, entry, opts: BackendOptions, progress=None):
        ort = import_ort()
        self.model, self.cfg, self.entry = model, model.cfg, entry
        self.device_type = "cuda" if model.device.type == "cuda" else "cpu"
        providers = providers_for(ort, model.device)
        threads = opts.threads or torch.get_num_threads()
        self.plan, self.sessions = [], {}
        graphs = entry.graphs
        for n, g in enumerate(graphs):
            if progress is not None:
                progress(f"load {g['onnx']}", n, len(graphs))
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.graph_optimization_level = getattr(
                ort.GraphOptimizationLevel, self.LEVELS[opts.opt_level]
            )
            # Dozens of sessions share the cores and run one after another: spinning pool
            # threads would only steal time from the session that is running.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            if g["data"]:
                data = entry.read(g["data"])
                so.add_external_initializers_from_files_in_memory([g["data"]], [data], [len(data)])
            layer = g["layer"]
            try:
                self.sessions[(g["segment"], layer)] = ort.InferenceSession(
                    entry.read(g["onnx"]), sess_options=so, providers=providers
                )
            except Exception as e:  # onnxruntime raises its own exception types
                raise ThorError(
                    f"onnxruntime cannot load {g['onnx']} from engine entry {entry.key}: {e}"
                ) from None
            self.plan.append((g["segment"], layer))
        if progress is not None:
            progress("loaded", len(graphs), len(graphs))

    @classmethod
    def open(cls, model, opts: BackendOptions, progress=None) -> "OrtBackend":
        return cls(model, ensure_entry(model, opts, progress), opts, progress)

    def run(self, segment, layer, *xs):
        sess = self.sessions.get((segment, layer))
        if sess is None:
            raise ThorError(
                f"engine entry {self.entry.key} has no graph {segment} for layer {layer}"
            )
        binding = sess.io_binding()
        keep = []
        for name, x in zip(SEGMENTS[segment].inputs, xs):
            x = x.contiguous()
            keep.append(x)
            binding.bind_input(
                name, self.device_type, 0, _NP[x.dtype], tuple(x.shape), x.data_ptr()
            )
        outs = []
        for name, shape in output_shapes(self.cfg, segment, xs[0].shape[0]).items():
            t = torch.empty(
                shape,
                dtype=torch.float32 if name == "logits" else self.model.dtype,
                device=self.model.device,
            )
            binding.bind_output(name, self.device_type, 0, _NP[t.dtype], shape, t.data_ptr())
            outs.append(t)
        sess.run_with_iobinding(binding)
        return tuple(outs)

    def close(self) -> None:
        self.sessions.clear()
