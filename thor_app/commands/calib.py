"""`thor calib {gen-data,distill,draft-vocab,export-drafter,eval-drafter,choose-drafter,kv-scales,
fp8-scales}` — offline calibration and drafter training.

Every command prints exactly one JSON summary on stdout; progress bars and logs go to stderr.
Heavy modules are imported inside the handlers so `thor --help` stays fast.
"""

from __future__ import annotations

import json
import sys

from thor_app.commands.common import positive_int
from thor_app.flags import add_config_args, config_from_args
from thor_runtime.config import SpeculationSettings
from thor_runtime.errors import ThorError


def _nonneg_int(s: str) -> int:
    v = int(s)
    if v < 0:
        raise ThorError(f"expected an integer >= 0, got {v}")
    return v


def _load_target(args, dtype: str | None = None, layout: str = "auto", world=None):
    """The target on --device, with calibration's own weights: --weights where the command has
    it (a drafter learns the taps of the weights it is trained on), else fp32. world: the
    torchrun worker group this process is one of (each worker takes its own GPU)."""
    import torch

    from thor_app.assembly import load_model, with_settings

    # One thread by default: on a shared 2-core box, two OpenMP threads competing with other
    # jobs were measured 10-20x slower than one (spin-waiting threads starve each other).
    torch.set_num_threads(args.threads)
    dtype = dtype or getattr(args, "weights", "fp32")
    config = config_from_args(args)
    if world is not None:
        from calib.dist import rank_device

        config = with_settings(config, model__device=rank_device(config.model.device, world))
    return load_model(
        with_settings(
            config,
            model__name=args.target,
            model__dtype=dtype,
            model__weights_layout=layout,
        )
    )


def _emit(doc: dict) -> int:
    print(json.dumps(doc))
    return 0


# ---- gen-data --------------------------------------------------------------------------------
def _gen_data(args) -> int:
    from calib.datagen import GenConfig, generate_dataset
    from calib.dist import World
    from calib.prompts import PromptSpec

    spec = PromptSpec(args.split, args.n, args.seed, args.general_frac, args.from_log)
    gen = GenConfig(args.max_tokens, args.batch, args.constrained)
    # under torchrun: one worker of several, each answering its share of the requests
    with World.from_env() as world:
        loaded = _load_target(args, world=world)
        doc = generate_dataset(
            loaded.model,
            loaded.tokenizer,
            spec,
            gen,
            args.out,
            target=args.target if args.weights == "fp32" else f"{args.target}@{args.weights}",
            progress=not args.quiet,
            world=world,
        )
    return _emit(doc) if world.main else 0  # one summary for the whole group


# ---- distill ---------------------------------------------------------------------------------
def _distill(args) -> int:
    from calib.dist import World
    from calib.distill import DistillConfig, run_distill

    cfg = DistillConfig.from_args(args)
    # under torchrun: one DDP worker of several, each training on its slice of every batch
    world = World.from_env()
    world.rows(cfg.batch)  # an uneven split is refused before the target loads
    with world:
        loaded = _load_target(args, world=world)
        doc = run_distill(
            loaded,
            cfg,
            command=" ".join(["thor"] + sys.argv[1:]) if args.argv is None else args.argv,
            progress=not args.quiet,
            world=world,
        )
    return _emit(doc) if world.main else 0  # one report for the whole group


# ---- draft-vocab -----------------------------------------------------------------------------
def _draft_vocab(args) -> int:
    from calib.distill import write_draft_vocab
    from thor_runtime.loading import load_config

    return _emit(
        write_draft_vocab(args.drafter, args.data, args.size, load_config(args.target).vocab_size)
    )


# ---- export-drafter --------------------------------------------------------------------------
def _export_drafter(args) -> int:
    from calib.export import export_drafter

    return _emit(export_drafter(args.drafter, args.out, args.dtype))


# ---- eval-drafter ----------------------------------------------------------------------------
def _eval_drafter(args) -> int:
    from calib.eval_drafter import EvalConfig, evaluate

    cfg = EvalConfig(
        args.drafter,
        args.n,
        args.max_tokens,
        args.seed,
        args.block_size,
        args.window,
        args.prompts,
        args.constrained,
        config_from_args(args).speculation.lookup_rate,
    )
    loaded = _load_target(args)
    return _emit(evaluate(loaded, cfg, progress=not args.quiet))


# ---- choose-drafter --------------------------------------------------------------------------
def _choose_drafter(args) -> int:
    from calib.choose_drafter import ChooseConfig, choose, describe, markdown, write_report
    from calib.eval_drafter import EvalConfig

    cfg = ChooseConfig(
        tuple(args.drafters),
        EvalConfig(
            None,
            args.n,
            args.max_tokens,
            args.seed,
            None,
            args.window,
            args.prompts,
            args.constrained,
            config_from_args(args).speculation.lookup_rate,
        ),
        args.repeats,
        args.proposer,
    )
    if not args.out.endswith(".json"):
        raise ThorError(f"choose-drafter: --out must name a .json file, got {args.out}")
    for d in cfg.drafters:  # a missing or foreign directory is refused before the target loads
        describe(d)
    loaded = _load_target(args)
    report = choose(loaded, cfg, progress=not args.quiet)
    # every setting it ran with, spelled out (the defaults too), as the command that repeats it
    report["command"] = " ".join(
        ["thor calib choose-drafter", *cfg.drafters, "--target", args.target]
        + ["--weights", args.weights, "--n", str(args.n), "--max-tokens", str(args.max_tokens)]
        + ["--seed", str(args.seed), "--window", str(args.window), "--prompts", args.prompts]
        + (["--constrained"] if args.constrained else [])
        + ["--repeats", str(args.repeats), "--proposer", args.proposer]
        + ["--lookup-rate", str(cfg.eval.lookup_rate), "--threads", str(args.threads)]
        + ["--out", args.out]
    )
    path, table = write_report(report, args.out)
    # the table is what a person reads; stdout keeps the one JSON summary every command prints
    print(markdown(report), file=sys.stderr, end="", flush=True)
    return _emit({**report, "report": str(path), "table": str(table)})


# ---- kv-scales -------------------------------------------------------------------------------
def _kv_scales(args) -> int:
    from calib.kv_scales import KVCalibConfig, calibrate_and_report

    cfg = KVCalibConfig(
        args.n, args.eval_n, args.max_tokens, args.margin, args.seed, args.general_frac
    )
    loaded = _load_target(args)
    return _emit(calibrate_and_report(loaded, cfg, args.out, progress=not args.quiet))


# ---- fp8-scales ------------------------------------------------------------------------------
def _fp8_scales(args) -> int:
    from calib.act_scales import ActCalibConfig, calibrate_and_report

    cfg = ActCalibConfig(args.n, args.eval_n, args.margin, args.seed, args.general_frac)
    # Dense fp32 weights: the projections the graphs export, read as plain tensors.
    loaded = _load_target(args, layout="dense")
    return _emit(calibrate_and_report(loaded, cfg, args.out, progress=not args.quiet))


def register(sub) -> None:
    p = sub.add_parser(
        "calib", help="calibration: training data, DFlash distillation, FP8 KV and GEMM scales"
    )
    cs = p.add_subparsers(dest="calib_command", required=True, parser_class=type(p))
    common = type(p)(add_help=False)
    common.add_argument(
        "--threads", type=positive_int, default=1, help="torch CPU threads (default 1)"
    )
    add_config_args(common, ("model",), only={"model.device"})

    # what the drafter's data, taps and evaluation run on: fp32, or the weights the runtime
    # itself runs (auto: a quantized GGUF stays int4), which a drafter for that path must learn
    weights = type(p)(add_help=False)
    weights.add_argument(
        "--weights",
        default="fp32",
        choices=["fp32", "auto", "bf16", "int8", "int4"],
        help="target weights for data, taps and evaluation (default fp32; auto = as "
        "`thor plan` runs them)",
    )

    g = cs.add_parser(
        "gen-data",
        parents=[common, weights],
        help="the target's greedy responses to calibration prompts (drafter data)",
    )
    g.add_argument("--target", default="default")
    g.add_argument("--split", default="train", choices=["train", "heldout"])
    g.add_argument("--n", type=positive_int, default=256)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--general-frac", type=float, default=0.1)
    g.add_argument("--out", required=True)
    g.add_argument("--max-tokens", type=positive_int, default=256)
    g.add_argument("--batch", type=positive_int, default=8)
    g.add_argument(
        "--constrained",
        action="store_true",
        help="answer robot prompts as the planner does (greedy under the plan grammar)",
    )
    g.add_argument(
        "--from-log",
        default="",
        metavar="DIR",
        help="the robots' own plan requests, logged with --log-requests DIR, instead of "
        "generated ones: de-duplicated, split by world (--n caps them)",
    )
    g.add_argument("--quiet", action="store_true")
    g.set_defaults(func=_gen_data)

    d = cs.add_parser(
        "distill", parents=[common, weights], help="train a DFlash drafter on gen-data output"
    )
    d.add_argument("--target", default="default")
    d.add_argument("--out", required=True)
    d.add_argument(
        "--data",
        default=None,
        help="gen-data dir, or several comma-separated (the same target and "
        "plan format; a later one adds requests) (default: OUT/data, generated if absent)",
    )
    d.add_argument(
        "--gen-n", type=positive_int, default=64, help="prompts to generate when --data is absent"
    )
    d.add_argument("--gen-max-tokens", type=positive_int, default=192)
    d.add_argument("--layers", type=positive_int, default=1)
    d.add_argument(
        "--intermediate",
        type=_nonneg_int,
        default=0,
        help="the drafter's MLP width (default 0: the target's)",
    )
    d.add_argument(
        "--block-size",
        type=positive_int,
        default=None,
        help="B: anchor + B-1 drafts per pass (default: the drafter config's)",
    )
    d.add_argument("--taps", default="auto", help="auto or comma-separated target layer ids")
    d.add_argument("--num-taps", type=positive_int, default=3, help="tap count for --taps auto")
    d.add_argument(
        "--window",
        type=positive_int,
        default=SpeculationSettings.window,
        help="context window W the drafter sees",
    )
    d.add_argument("--steps", type=positive_int, default=1000)
    d.add_argument("--lr", type=float, default=3e-4)
    d.add_argument("--warmup", type=_nonneg_int, default=50)
    d.add_argument("--batch", type=positive_int, default=4, help="sequences per step")
    d.add_argument(
        "--blocks", type=positive_int, default=8, help="blocks (anchors) per sequence per step"
    )
    d.add_argument(
        "--gamma", type=float, default=7.0, help="position-weight decay: w_k = exp(-(k-1)/gamma)"
    )
    d.add_argument("--weight-decay", type=float, default=0.01)
    d.add_argument("--ckpt-every", type=positive_int, default=100)
    d.add_argument("--resume", action="store_true")
    d.add_argument(
        "--init",
        default=None,
        metavar="DRAFTER",
        help="start from this drafter's weights (same shape) instead of random ones: "
        "retraining after a plan-format change",
    )
    d.add_argument(
        "--bf16",
        action="store_true",
        help="bf16 autocast (slower than fp32 with --vocab data on CPU; see distill.py)",
    )
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--eval-n", type=_nonneg_int, default=8, help="held-out prompts for the report")
    d.add_argument("--eval-max-tokens", type=positive_int, default=128)
    d.add_argument(
        "--vocab",
        default="data",
        choices=["data", "full"],
        help="softmax over the data's tokens + random negatives (fast on CPU) "
        "or the full vocabulary",
    )
    d.add_argument(
        "--negatives",
        type=_nonneg_int,
        default=2048,
        help="random negatives per step (--vocab data)",
    )
    d.add_argument(
        "--max-time", type=float, default=0.0, help="stop (and checkpoint) after this many seconds"
    )
    d.add_argument(
        "--stop-at", type=_nonneg_int, default=0, help="stop (and checkpoint) after this step"
    )
    d.add_argument(
        "--draft-vocab",
        type=_nonneg_int,
        default=2048,
        help="drafter head shortlist: the N most frequent response tokens (0 = full vocabulary)",
    )
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=_distill, argv=None)

    v = cs.add_parser(
        "draft-vocab", help="(re)build a drafter's head shortlist from its training data"
    )
    v.add_argument("--target", default="default")
    v.add_argument(
        "--drafter", required=True, help="drafter dir; draft_vocab.json is written there"
    )
    v.add_argument("--data", required=True, help="gen-data dir of the train split")
    v.add_argument("--size", type=positive_int, default=2048)
    v.set_defaults(func=_draft_vocab)

    x = cs.add_parser(
        "export-drafter",
        help="a trained drafter stored for shipping (bf16 weights, its report beside)",
    )
    x.add_argument("--drafter", required=True, help="the drafter dir `distill` wrote")
    x.add_argument("--out", required=True, help="where the shipped copy goes")
    x.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    x.set_defaults(func=_export_drafter)

    # what eval-drafter and choose-drafter share: the target and the held-out requests decoded
    heldout = type(p)(add_help=False)
    heldout.add_argument("--target", default="default")
    heldout.add_argument("--n", type=positive_int, default=8, help="held-out requests")
    heldout.add_argument("--max-tokens", type=positive_int, default=128)
    heldout.add_argument("--seed", type=int, default=0)
    heldout.add_argument("--window", type=positive_int, default=SpeculationSettings.window)
    heldout.add_argument(
        "--prompts", default="robot", choices=["robot", "general"], help="held-out prompt set"
    )
    heldout.add_argument(
        "--constrained",
        action="store_true",
        help="decode under the plan grammar, as the planner does (robot prompts)",
    )
    add_config_args(heldout, ("speculation",), only={"speculation.lookup_rate"})

    e = cs.add_parser(
        "eval-drafter",
        parents=[common, weights, heldout],
        help="held-out acceptance length and speedup vs plain decoding",
    )
    e.add_argument("--drafter", default=None, help="drafter dir (default: the shipped one)")
    e.add_argument("--block-size", type=positive_int, default=None)
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=_eval_drafter)

    c = cs.add_parser(
        "choose-drafter",
        parents=[common, weights, heldout],
        help="rank drafters of one target by expected decode speed on this machine (accept "
        "length against drafting and verify cost)",
    )
    c.add_argument(
        "drafters",
        nargs="+",
        metavar="DRAFTER_DIR",
        help="candidate drafter dirs, all for --target; ratios are against the first",
    )
    c.add_argument("--out", required=True, help="the JSON report; the table goes beside it (.md)")
    c.add_argument(
        "--repeats", type=positive_int, default=3, help="rounds; costs are their medians"
    )
    c.add_argument(
        "--proposer",
        default="combined",
        choices=["combined", "dflash"],
        help="combined (with prompt lookup: what --spec auto runs on plans) or the drafter alone",
    )
    c.add_argument("--quiet", action="store_true")
    c.set_defaults(func=_choose_drafter)

    # what the two FP8 scale commands share: the target, the prompts, the report's held-out split
    scales = type(p)(add_help=False)
    scales.add_argument("--target", default="default")
    scales.add_argument("--out", required=True)
    scales.add_argument(
        "--n", type=positive_int, default=32, help="calibration (train split) prompts"
    )
    scales.add_argument(
        "--eval-n", type=_nonneg_int, default=4, help="held-out prompts for the agreement report"
    )
    scales.add_argument("--seed", type=int, default=0)
    scales.add_argument(
        "--general-frac", type=float, default=0.1, help="share of general instructions"
    )
    scales.add_argument("--quiet", action="store_true")

    k = cs.add_parser(
        "kv-scales",
        parents=[common, scales],
        help="per-layer, per-KV-head FP8 scales from calibration prompts",
    )
    k.add_argument(
        "--max-tokens", type=positive_int, default=64, help="greedy tokens per report prompt"
    )
    k.add_argument("--margin", type=float, default=1.0, help="scale = amax * margin / 448")
    k.set_defaults(func=_kv_scales)

    f = cs.add_parser(
        "fp8-scales",
        parents=[common, scales],
        help="per-projection FP8 activation scales for the Q/DQ engine graphs (--fp8-scales)",
    )
    f.add_argument(
        "--margin",
        type=float,
        default=4.0,
        help="scale = amax * margin / 448 (headroom: see calib/act_scales.py)",
    )
    f.set_defaults(func=_fp8_scales)
