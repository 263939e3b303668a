"""Arguments shared by every command that runs the target model."""
from __future__ import annotations

import argparse

from thor_runtime.config import WEIGHT_LAYOUTS
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SPEC_METHODS, SpecOptions


def positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default="default", help="default (SmolLM2-135M-Instruct), an HF dir, or a .gguf file")
    g.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "int8", "int4"],
                   help="weights: auto (a quantized GGUF runs int4 with its own group scales, other "
                        "checkpoints fp32), fp32, bf16, int8 or int4 (weight-only, bf16 activations)")
    g.add_argument("--cache-dir", default=None,
                   help="prepared low-bit weight cache (default $THOR_CACHE_DIR or "
                        "$XDG_CACHE_HOME/thor-runtime/weights; '' = no cache)")
    g.add_argument("--kv-dtype", default="fp32", choices=["fp32", "bf16", "fp16", "fp8"])
    g.add_argument("--kv-scales", default=None, help="FP8 KV scales file (thor calib kv-scales); unit scales if absent")
    g.add_argument("--prefill-chunk", type=int, default=0, help="prefill chunk size in tokens (0 = one pass)")
    g.add_argument("--weights-layout", default="auto", choices=WEIGHT_LAYOUTS,
                   help="CPU: dense (MKL), packed (oneDNN), dual (both: fastest for fp32, twice the "
                        "memory); auto = dual for fp32, packed for bf16, where oneDNN can pack")


def add_spec_args(p: argparse.ArgumentParser, default: str = "none") -> None:
    g = p.add_argument_group("speculative decoding")
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
    """The one Speculation for a command's arguments (proposer, K, budget, relaxed acceptance)."""
    from thor_runtime.speculative import build_speculation

    return build_speculation(spec_options(args), loaded.model, relaxed_config(args, loaded.tokenizer))


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
    loaded = load(args.model, args.dtype, layout=args.weights_layout, cache_dir=getattr(args, "cache_dir", None))
    scales = KVScales.load(args.kv_scales, loaded.cfg) if args.kv_scales else None
    rt = Runtime(loaded.model, loaded.tokenizer, kv_dtype=args.kv_dtype, prefill_chunk=args.prefill_chunk,
                 kv_scales=scales)
    return loaded, rt
