"""Arguments shared by every command that runs the target model."""
from __future__ import annotations

import argparse
import sys

from thor_runtime.config import WEIGHT_DTYPES, WEIGHT_LAYOUTS
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SPEC_METHODS, SpecOptions


def _int_at_least(low: int, what: str):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
        return v
    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def add_model_args(p: argparse.ArgumentParser, model_default: str | None = "default",
                   model_help: str = "default (SmolLM2-135M-Instruct), a name from `thor models list`, "
                                     "an HF dir, or a .gguf file") -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=model_default, help=model_help)
    g.add_argument("--dtype", default="auto", choices=WEIGHT_DTYPES,
                   help="weights: auto (a quantized GGUF runs int4 with its own group scales, other "
                        "checkpoints fp32), fp32, bf16, int8 or int4 (weight-only, bf16 activations)")
    g.add_argument("--cache-dir", default=None,
                   help="prepared low-bit weight cache (default $THOR_CACHE_DIR or "
                        "$XDG_CACHE_HOME/thor-runtime/weights; '' = no cache)")
    g.add_argument("--kv-dtype", default="fp32", choices=["fp32", "bf16", "fp16", "fp8"])
    g.add_argument("--kv-scales", default=None, help="FP8 KV scales file (thor calib kv-scales); unit scales if absent")
    g.add_argument("--prefill-chunk", type=int, default=0, help="prefill chunk size in tokens (0 = one pass)")
    g.add_argument("--prefix-cache", type=non_negative_int, default=2,
                   help="keep the K/V of this many recent prompts; a prompt that starts like one of them "
                        "prefills only the rest (a repair, another task in the same world); 0 = off")
    g.add_argument("--weights-layout", default="auto", choices=WEIGHT_LAYOUTS,
                   help="CPU: dense (MKL), packed (oneDNN), dual (both: fastest for fp32, twice the "
                        "memory); auto = dual for fp32, packed for bf16, where oneDNN can pack")
    add_engine_args(p)


def add_engine_args(p: argparse.ArgumentParser, multi: bool = False) -> None:
    from engines.backend import BACKENDS, ORT_OPT_LEVELS
    from engines.segments import FORMS

    g = p.add_argument_group("engines (the dense segments)")
    if multi:
        g.add_argument("--backend", default="torch", help=f"comma list of {'|'.join(BACKENDS)}")
    else:
        g.add_argument("--backend", default="torch", choices=list(BACKENDS),
                       help="what runs the dense segments; attention and the KV cache stay in torch")
    g.add_argument("--engine-form", default="segments", choices=FORMS,
                   help="segments: one graph per segment; fused: post_attn of layer i and pre_attn of i+1 as one "
                        "(dense models)")
    g.add_argument("--engine-cache", default=None, help="engine cache dir (default $THOR_ENGINE_CACHE or "
                                                         "~/.cache/thor/engines)")
    g.add_argument("--engine-threads", type=int, default=0, help="onnxruntime intra-op threads (0 = torch's)")
    g.add_argument("--ort-opt-level", default="all", choices=ORT_OPT_LEVELS, help="onnxruntime graph optimizations")
    g.add_argument("--trt-precision", default=None, choices=["fp32", "bf16", "fp16", "fp8"],
                   help="tensorrt precision (default: the weights' dtype; fp8 needs --fp8-scales)")
    g.add_argument("--fp8-scales", default=None,
                   help="fp8 GEMMs through Q/DQ graphs with these activation scales (`thor calib fp8-scales`): "
                        "tensorrt builds FP8 engines, onnxruntime runs the same graphs as their twin")


def add_runtime_shape_args(p: argparse.ArgumentParser) -> None:
    """For commands that build engines without running a generation (engines build, selftest):
    the runtime the engines will serve, which sets TensorRT's optimization profiles. The
    defaults are those of `thor serve`'s config, so the service finds the engines built here."""
    p.add_argument("--prefill-chunk", type=non_negative_int, default=0,
                   help="the runtime's prefill chunk in tokens: TensorRT's prefill profile (0 = one pass, "
                        "run in 256-token pieces)")
    add_spec_args(p, default="auto", title="the runtime's speculation (K + 1 is TensorRT's verify profile)")


def backend_options(args, form: str | None = None, threads: int | None = None, opt_level: str | None = None,
                    spec_k: int = 0):
    """``spec_k``: the most drafts the command's runtime verifies per cycle; with its
    ``--prefill-chunk`` it sets TensorRT's optimization profiles."""
    from engines.backend import BackendOptions, profile_tokens

    return BackendOptions(form=form or args.engine_form, cache_dir=args.engine_cache,
                          threads=args.engine_threads if threads is None else threads,
                          opt_level=opt_level or args.ort_opt_level, precision=args.trt_precision,
                          fp8_scales=args.fp8_scales,
                          profiles=profile_tokens(spec_k, getattr(args, "prefill_chunk", 0) or 0))


def progress_bar(desc: str, unit: str = "graph"):
    """A tqdm bar on stderr driven by the engines' progress(label, done, total) callbacks."""
    from tqdm import tqdm

    state = {}

    def progress(label: str, done: int, total: int) -> None:
        bar = state.get("bar")
        if bar is None or bar.total != total:
            if bar is not None:
                bar.close()
            bar = state["bar"] = tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)
        bar.set_postfix_str(label, refresh=False)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()
            state.pop("bar")

    return progress


def command_spec_k(args, loaded) -> int:
    """K of the command's own speculation (its --spec flags), 0 when it has none."""
    from engines.backend import spec_width

    return spec_width(speculation(args, loaded)) if getattr(args, "spec_flags", False) else 0


def attach_backend(args, loaded, name: str | None = None, **overrides):
    """Route the model's dense segments through ``--backend`` (no-op for torch). -> the backend."""
    from engines.backend import attach, make_backend

    name = name or args.backend
    if name == "torch":
        attach(loaded.model, None)
        return None
    overrides.setdefault("spec_k", command_spec_k(args, loaded))
    b = make_backend(name, loaded.model, backend_options(args, **overrides), progress_bar(f"{name} engines"))
    attach(loaded.model, b)
    return b


def add_spec_args(p: argparse.ArgumentParser, default: str = "none", title: str = "speculative decoding") -> None:
    p.set_defaults(spec_flags=True)
    g = p.add_argument_group(title)
    g.add_argument("--spec", default=default, choices=SPEC_METHODS)
    g.add_argument("--drafter", default=None, help="DFlash drafter dir (default: the shipped one)")
    g.add_argument("--block-size", type=positive_int, default=None, help="DFlash block size B (K = B-1)")
    g.add_argument("--window", type=positive_int, default=128, help="DFlash per-token context window W")
    g.add_argument("--no-window-seed", action="store_true", help="don't seed the window from the prompt tail")
    g.add_argument("--ngram-k", type=positive_int, default=8, help="prompt-lookup drafts per cycle")
    g.add_argument("--lookup-rate", type=float, default=0.8,
                   help="hybrid: prior per-token acceptance of a prompt-lookup draft (0..1); the "
                        "cycle verifies lookup's draft when it expects more accepted tokens than DFlash's")
    g.add_argument("--fixed-k", action="store_true",
                   help="verify all K drafts every cycle (default: only 2 while the proposer is rarely right)")
    g.add_argument("--relaxed-thinking", action="store_true",
                   help="relaxed acceptance inside <think>...</think> (greedy only)")
    g.add_argument("--relaxed-topk", type=positive_int, default=3)
    g.add_argument("--relaxed-delta", type=float, default=2.0)
    g.add_argument("--relaxed-margin", choices=["logit", "prob"], default="logit")


def spec_options(args) -> SpecOptions:
    return SpecOptions(method=args.spec, drafter=args.drafter, block_size=args.block_size, window=args.window,
                       seed_window=not args.no_window_seed, ngram_k=args.ngram_k, fixed_k=args.fixed_k,
                       lookup_rate=args.lookup_rate)


def speculation(args, loaded):
    """The one Speculation for a command's arguments (proposer, K, budget, relaxed acceptance),
    built once per model: the engine profiles read its K before the command runs it."""
    from thor_runtime.speculative import build_speculation

    built = getattr(args, "_speculation", None)
    if built is None or built[0] is not loaded.model:
        built = args._speculation = (loaded.model, build_speculation(spec_options(args), loaded.model,
                                                                     relaxed_config(args, loaded.tokenizer)))
    return built[1]


def relaxed_config(args, tokenizer):
    if not getattr(args, "relaxed_thinking", False):
        return None
    from thor_runtime.speculative.accept import RelaxedConfig

    b, e = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
    if b is None or e is None:
        raise ThorError("--relaxed-thinking: the tokenizer has no <think> / </think> tokens")
    return RelaxedConfig(b, e, args.relaxed_topk, args.relaxed_delta, args.relaxed_margin)


def build_runtime(args):
    """-> (Loaded, Runtime)."""
    from thor_runtime.generate import Runtime
    from thor_runtime.kv_cache import KVScales
    from thor_runtime.loading import load

    if args.prefill_chunk < 0:
        raise ThorError(f"--prefill-chunk must be >= 0, got {args.prefill_chunk}")
    dtype, layout = args.dtype, args.weights_layout
    if getattr(args, "backend", "torch") != "torch":
        # A graph backend runs fp32 graphs and holds its own copy of the weights: torch's needs
        # no second, packed one.
        dtype = "fp32" if dtype == "auto" else dtype
        layout = "dense" if layout == "auto" else layout
    loaded = load(args.model, dtype, layout=layout, cache_dir=getattr(args, "cache_dir", None))
    attach_backend(args, loaded)
    scales = KVScales.load(args.kv_scales, loaded.cfg) if args.kv_scales else None
    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=args.kv_dtype, prefill_chunk=args.prefill_chunk,
                 kv_scales=scales, prefix_cache=args.prefix_cache)
    return loaded, rt
