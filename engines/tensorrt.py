"""TensorRT 10 backend: engines built from the exported ONNX graphs, run on torch CUDA tensors.

Written against the documented TensorRT 10 Python API; TensorRT and a GPU are needed to run
it, and every entry point raises a ThorError naming what is missing otherwise.

Build: a strongly typed network (precision comes from the graph's own types: export the model
in bf16 or fp16; fp8 GEMMs come from the explicit Q/DQ nodes engines.qdq inserts from a
calibrated scales file, ``--fp8-scales``) parsed by the OnnxParser; three optimization profiles
over the token axis — decode (1), verify (2..K+1) and prefill (K+2..chunk), with K and the
chunk those of the command's runtime (backend.profile_tokens); a timing cache persisted per
TensorRT version and GPU next to the entries. The plans go into the same hash-pinned cache
entry as their ONNX graphs.
Run: one execution context per profile; ``set_input_shape`` / ``set_tensor_address`` on torch
tensors, ``execute_async_v3`` on torch's current stream. Inputs longer than the prefill
profile are split along the token axis: every dense segment is row-wise.
"""

from __future__ import annotations

import torch

from thor_runtime.errors import ThorError

from . import qdq
from .base import BackendOptions, GraphBackend, key_fields
from .cache import EngineCache, make_key, sha256_bytes
from .segments import SEGMENTS, TOKEN_AXIS, DenseView, export_all, graph_plan, output_shapes


def import_trt():
    try:
        import tensorrt as trt
    except ImportError:
        raise ThorError(
            "the tensorrt backend needs TensorRT 10 (pip install 'thor-runtime[tensorrt]' on the "
            "device, or JetPack's python3-libnvinfer)"
        ) from None
    if int(trt.__version__.split(".")[0]) < 10:
        raise ThorError(f"the tensorrt backend needs TensorRT 10, found {trt.__version__}")
    if not torch.cuda.is_available():
        raise ThorError("the tensorrt backend needs a CUDA device and a CUDA build of torch")
    return trt


def profile_ranges(profiles: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """(min, opt, max) token counts per profile: decode, verify, prefill (empty ranges dropped)."""
    one, verify, chunk = profiles
    out = [(1, 1, one)]
    if verify > one:
        out.append((one + 1, verify, verify))
    if chunk > verify:
        out.append((verify + 1, chunk, chunk))
    return out


def _sm() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


class _Logger:
    @staticmethod
    def make(trt):
        return trt.Logger(trt.Logger.WARNING)


def _timing_cache_path(opts: BackendOptions, trt):
    return opts.root / f"timing-trt{trt.__version__}-{_sm()}.cache"


def _load_timing_cache(config, path):
    """A cache of tactic timings (data, not code); an unreadable one is started afresh."""
    data = b""
    if path.is_file():
        raw = path.read_bytes()
        digest = path.with_suffix(".sha256")
        if digest.is_file() and digest.read_text().strip() == sha256_bytes(raw):
            data = raw
    cache = config.create_timing_cache(data)
    config.set_timing_cache(cache, ignore_mismatch=False)
    return cache


def _save_timing_cache(cache, path) -> None:
    from thor_runtime.fileio import write_text_atomic

    raw = bytes(memoryview(cache.serialize()))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(raw)
    tmp.replace(path)
    write_text_atomic(path.with_suffix(".sha256"), sha256_bytes(raw))


def build_plan(trt, onnx_path, inputs: tuple[str, ...], ranges, timing_path, logger) -> bytes:
    """One serialized engine for one graph (the ONNX with its external data beside it)."""
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ThorError(f"TensorRT cannot parse {onnx_path.name}: {errors}")
    config = builder.create_builder_config()
    cache = _load_timing_cache(config, timing_path)
    for lo, opt, hi in ranges:
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            shape = list(t.shape)
            axis = TOKEN_AXIS.get(t.name, 0)
            mins, opts, maxs = (list(shape) for _ in range(3))
            mins[axis], opts[axis], maxs[axis] = lo, opt, hi
            profile.set_shape(t.name, mins, opts, maxs)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ThorError(
            f"TensorRT failed to build an engine for {onnx_path.name} (see the log above)"
        )
    _save_timing_cache(cache, timing_path)
    return bytes(memoryview(plan))


def trt_precision(model, opts: BackendOptions) -> str:
    """The engine precision: the graph's dtype, or fp8 GEMMs (Q/DQ) in a graph of that dtype."""
    native = (
        str(model.dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float", "fp")
    )
    precision = "fp8" if opts.fp8_scales else opts.precision or native
    if precision not in (native, "fp8"):
        raise ThorError(
            f"tensorrt precision {precision} needs the model exported in that dtype: "
            f"load it with --dtype {precision} (it is {native})"
        )
    return precision


def trt_key(model, opts: BackendOptions, weights_sha256: str, scales=None):
    trt = import_trt()
    precision = trt_precision(model, opts)
    extra = qdq.key_fields(scales) if scales is not None else None
    fields = key_fields(
        model,
        "tensorrt",
        f"tensorrt {trt.__version__}",
        _sm(),
        precision,
        opts.form,
        profiles=opts.profiles,
        weights_sha256=weights_sha256,
        extra=extra,
    )
    return make_key(fields), fields, precision


def ensure_entry(model, opts: BackendOptions, progress=None):
    # Everything that can be refused without TensorRT is refused first (BackendOptions already
    # refused fp8 without a scales file): the precision, then the scales against this model.
    trt_precision(model, opts)
    view = DenseView(model)
    plan = graph_plan(model.cfg, opts.form)
    scales = qdq.scales_for(opts, view, plan)
    trt = import_trt()
    key, fields, precision = trt_key(model, opts, view.weights_digest(), scales)
    cache = EngineCache(opts.root)
    entry = cache.lookup(key)
    if entry is not None:
        return entry
    if not opts.build:
        raise ThorError(
            f"no tensorrt engines for this model in {opts.root} (key {key}); "
            "run `thor engines build --backend tensorrt`"
        )
    ranges = profile_ranges(opts.profiles)
    logger = _Logger.make(trt)
    cache.root.mkdir(parents=True, exist_ok=True)

    def write(d):
        graphs = (
            export_all(view, plan, d, progress)
            if scales is None
            else qdq.export_all(view, plan, d, scales, progress)
        )
        for n, g in enumerate(graphs):
            if progress is not None:
                progress(f"tensorrt {g['onnx']}", n, len(graphs))
            name = g["onnx"].replace(".onnx", ".plan")
            (d / name).write_bytes(
                build_plan(
                    trt,
                    d / g["onnx"],
                    SEGMENTS[g["segment"]].inputs,
                    ranges,
                    _timing_cache_path(opts, trt),
                    logger,
                )
            )
            g["plan"] = name
        return {"graphs": graphs, "profiles": ranges}

    return cache.build(key, fields, write)


class TrtBackend(GraphBackend):
    name = "tensorrt"

    def __init__(self, model, entry, opts: BackendOptions, progress=None):
        trt = import_trt()
        if model.device.type != "cuda":
            raise ThorError("the tensorrt backend needs the model on a CUDA device")
        self.model, self.cfg, self.entry = model, model.cfg, entry
        self.ranges = [tuple(r) for r in entry.manifest["profiles"]]
        self.max_tokens = self.ranges[-1][2]
        runtime = trt.Runtime(_Logger.make(trt))
        self.engines, self.contexts, self.plan = {}, {}, []
        stream = torch.cuda.current_stream().cuda_stream
        for n, g in enumerate(entry.graphs):
            if progress is not None:
                progress(f"load {g['plan']}", n, len(entry.graphs))
            engine = runtime.deserialize_cuda_engine(
                entry.read(g["plan"])
            )  # bytes checked against the manifest
            if engine is None:
                raise ThorError(
                    f"TensorRT cannot deserialize {g['plan']} "
                    "(built by another TensorRT version?); "
                    "run `thor engines prune --all` and rebuild"
                )
            k = (g["segment"], g["layer"])
            self.engines[k] = engine
            contexts = []
            for p in range(len(self.ranges)):
                ctx = engine.create_execution_context()
                ctx.set_optimization_profile_async(p, stream)
                contexts.append(ctx)
            self.contexts[k] = contexts
            self.plan.append(k)

    @classmethod
    def open(cls, model, opts: BackendOptions, progress=None) -> "TrtBackend":
        return cls(model, ensure_entry(model, opts, progress), opts, progress)

    def _profile(self, T: int) -> int:
        for p, (lo, _, hi) in enumerate(self.ranges):
            if lo <= T <= hi:
                return p
        raise ThorError(f"no TensorRT profile covers {T} tokens")

    def run(self, segment, layer, *xs):
        T = xs[0].shape[0]
        if T > self.max_tokens:  # row-wise segments: run the rows in profile-sized pieces
            parts = [
                self.run(segment, layer, *(x[s : s + self.max_tokens] for x in xs))
                for s in range(0, T, self.max_tokens)
            ]
            return tuple(
                torch.cat(p, dim=TOKEN_AXIS.get(n, 0))
                for n, p in zip(SEGMENTS[segment].outputs, zip(*parts))
            )
        ctx = self.contexts[(segment, layer)][self._profile(T)]
        keep = []
        for name, x in zip(SEGMENTS[segment].inputs, xs):
            x = x.contiguous()
            keep.append(x)
            ctx.set_input_shape(name, tuple(x.shape))
            ctx.set_tensor_address(name, x.data_ptr())
        outs = []
        for name, shape in output_shapes(self.cfg, segment, T).items():
            t = torch.empty(
                shape,
                dtype=torch.float32 if name == "logits" else self.model.dtype,
                device=self.model.device,
            )
            ctx.set_tensor_address(name, t.data_ptr())
            outs.append(t)
        if not ctx.execute_async_v3(torch.cuda.current_stream().cuda_stream):
            raise ThorError(f"TensorRT failed to run {segment} (layer {layer})")
        return tuple(outs)
