"""`thor bench`: the flags of every mode and which mode runs.

The modes live beside this file: the default decode bench against transformers
(bench_decode.py), constrained planning and the evaluation sets (bench_plan.py), the graph
backends (bench_backends.py), the service over loopback (bench_serve.py), its tool calls on
the function-calling leaderboard's data (bench_tools.py), the device
benchmark (bench_device.py), decode beside a busy process (bench_neighbour.py), the plan
prompt's tokens per part (bench_prompt.py); --rollback and
--peers run code of their own packages. Each mode is imported when it runs, so `thor bench
--help` loads none of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from thor_app.commands.common import non_negative_int, positive_int
from thor_app.flags import add_config_args, config_from_args
from thor_app.tools.bench_report import BENCH_WEIGHTS, device_info
from thor_runtime.config import ENGINE_BACKENDS, KV_DTYPES, ModelSettings, PlannerSettings
from thor_runtime.errors import ThorError
from thor_runtime.speculative import SPEC_METHODS


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmark prefill/decode against transformers (JSON + table)")
    add_config_args(
        p,
        ("model",),
        only={"model.name", "model.device", "model.weight_cache", "model.world_starts"},
    )
    p.add_argument(
        "--configs",
        default="fp32/fp32,fp32/fp8,bf16/fp32,bf16/fp8,int8/bf16,int8/fp8",
        help="comma list of WEIGHTS/KV dtype pairs",
    )
    p.add_argument("--spec", default="none", help=f"comma list of {'|'.join(SPEC_METHODS)}")
    add_config_args(
        p,
        ("speculation",),
        only={"speculation.drafter", "speculation.block_size", "speculation.window"},
    )
    p.add_argument("--max-tokens", type=positive_int, default=128)
    p.add_argument("--prefill-tokens", type=positive_int, default=400)
    p.add_argument("--repeats", type=positive_int, default=3)
    p.add_argument(
        "--prefix-cache",
        type=non_negative_int,
        default=None,
        help="plan benches: keep the K/V of this many recent prompts, as `thor plan` and "
        "`thor serve` do (default 0: every prompt prefilled whole; --serve: the service's "
        "default, on both sides)",
    )
    p.add_argument(
        "--tie-tol",
        type=float,
        default=None,
        help="losslessness gate: max logit regret for a divergence to count as a numerical tie "
        "(default: speculative/lossless.py's DEFAULT_TIE_TOL)",
    )
    p.add_argument("--no-baseline", action="store_true", help="skip transformers' generate")
    p.add_argument(
        "--neighbour",
        action="store_true",
        help="decode quiet and beside one CPU-bound process (bench_neighbour.py); with --peers: "
        "every engine quiet and beside it",
    )
    p.add_argument(
        "--prompt-parts",
        action="store_true",
        help="tokens per part of the plan prompt (instructions, example, goal forms, skills, "
        "world, task, template) on the sample worlds and every evaluation set (bench_prompt.py)",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="benchmark constrained planning (thor plan) on the sample worlds instead",
    )
    p.add_argument(
        "--rollback",
        action="store_true",
        help="hybrid (Gated-DeltaNet) target: speculative cycle with checkpoint-slot rollback vs "
        "snapshot + re-forward, at each K of --ks, on a random ~100M-parameter hybrid",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="llama.cpp, transformers and thor side by side on the same GGUF, each in its own "
        "process (JSON, Markdown table and plots in --out-dir); see `make bench-peers`",
    )
    p.add_argument("--short", action="store_true", help="with --peers: tiny counts (a smoke run)")
    p.add_argument(
        "--peers-python",
        default=None,
        help="with --peers / --tools: the python of the peers' venv (default "
        ".venv-peers/bin/python; --tools runs llama.cpp on the same GGUF where it is found)",
    )
    p.add_argument("--out-dir", default="results/peers", help="with --peers: where the results go")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=2,
        help="with --peers / --serve: threads of every engine (--serve: the server's and the "
        "in-process side's)",
    )
    p.add_argument(
        "--peers-repeats", type=positive_int, default=None, help="with --peers: repeats (default 3)"
    )
    p.add_argument(
        "--peers-max-tokens",
        type=positive_int,
        default=None,
        help="with --peers: decode tokens per prompt (default 128)",
    )
    p.add_argument(
        "--peers-plans",
        type=non_negative_int,
        default=None,
        help="with --peers: plan requests (default 6)",
    )
    p.add_argument(
        "--peers-configs",
        default=None,
        help="with --peers: comma list of thor's WEIGHTS[@KERNEL]/SPEC configurations (default: "
        "all of them)",
    )
    p.add_argument(
        "--ks", default="3,7,15", help="with --rollback: comma list of K (drafts per cycle)"
    )
    p.add_argument(
        "--accept",
        default="half",
        choices=("half", "none", "all-but-one"),
        help="with --rollback: drafts accepted per cycle (K//2, 0 or K-1)",
    )
    p.add_argument(
        "--plan-set",
        choices=["sample", "wordings", "heldout", "eval"],
        default="sample",
        help="--plan: sample = latency per --spec on the sample worlds; wordings = the same on an "
        "evaluation set's worlds and task wordings (--eval-dir, --eval-limit, default 8 tasks); "
        "heldout = the same on the request generator's held-out split, the drafters' own kind "
        "of request never trained on (--eval-limit, default 12); "
        "eval = the held-out evaluation (evals/sets/): task success, refusals, unsafe plans "
        "per model",
    )
    p.add_argument(
        "--plan-start",
        choices=["whole", "process", "service"],
        default="whole",
        help="--plan (sample, wordings, heldout): where each plan's prompt starts from: "
        "whole = prefilled whole (--prefix-cache, default 0); "
        "process = as a new `thor plan` process: the skills' shared "
        "prefix from disk, the rest prefilled, auto with no history; service = as `thor serve`: "
        "that prefix and the recent prompts in memory (--prefix-cache, default the service's)",
    )
    p.add_argument(
        "--models", default=None, help="--plan-set eval: comma list of models (default: --model)"
    )
    p.add_argument(
        "--solver",
        choices=["both", "on", "off"],
        default="both",
        help="--plan-set eval: steps completed from the model's goal (on), "
        "the model's own (off), or both",
    )
    p.add_argument(
        "--attempts",
        type=int,
        default=PlannerSettings.attempts,
        help="--plan-set eval: repair attempts per task",
    )
    p.add_argument(
        "--eval-limit",
        type=positive_int,
        default=None,
        help="--plan-set eval or wordings: an evenly spread subset; heldout: the first N requests",
    )
    add_config_args(p, ("planner",), only={"planner.goal_choice", "planner.lexicon"})
    p.add_argument(
        "--eval-dir",
        default=None,
        help="--plan-set eval or wordings: the evaluation set's directory (tasks.json, worlds/); "
        "default the first set, the others are evals/sets/*",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="benchmark `thor serve` over loopback (plan req/s, p50/p99, TTFT) "
        "against in-process plans",
    )
    p.add_argument(
        "--serve-clients", default="1,4,16", help="--serve: comma list of concurrent client counts"
    )
    p.add_argument("--serve-world", default="kitchen", help="--serve: sample world the plans use")
    p.add_argument(
        "--serve-batch",
        type=int,
        default=None,
        help="--serve: limits.batch of the server measured against one at a time (default: the "
        "service's default)",
    )
    p.add_argument(
        "--tools",
        action="store_true",
        help="the function-calling leaderboard's categories through the service's tool "
        "calls (needs: pip install --no-deps bfcl-eval==2026.3.23)",
    )
    p.add_argument(
        "--tools-categories",
        default="simple,multiple,parallel,parallel_multiple,irrelevance",
        help="--tools: comma list of categories",
    )
    p.add_argument(
        "--tools-modes",
        default="grammar,plain",
        help="--tools: grammar (tools in the request) and/or plain (tools in the prompt only)",
    )
    p.add_argument(
        "--tools-limit",
        type=positive_int,
        default=None,
        help="--tools: the first N entries of each category (default all)",
    )
    p.add_argument(
        "--tools-data",
        default=None,
        help="--tools: the leaderboard's data folder (default: bfcl-eval's)",
    )
    p.add_argument(
        "--ros",
        action="store_true",
        help="the ROS 2 ~/plan action against the same plans without ROS, in one process: its "
        "cost per plan and the feedback's spacing (needs the ros extra and thor_interfaces)",
    )
    p.add_argument(
        "--ros-plans", type=positive_int, default=6, help="--ros: the sample's first N requests"
    )
    p.add_argument(
        "--ros-repeats", type=positive_int, default=3, help="--ros: times each request is planned"
    )
    p.add_argument(
        "--json", dest="json_out", default="bench.json", help="where to write the JSON results"
    )
    p.add_argument("--backend", default="torch", help=f"comma list of {'|'.join(ENGINE_BACKENDS)}")
    add_config_args(
        p,
        ("engine",),
        only={
            "engine.cache_dir",
            "engine.threads",
            "engine.ort_opt_level",
            "engine.trt_precision",
            "engine.fp8_scales",
        },
    )
    p.add_argument(
        "--engine-forms",
        default="segments,fused",
        help="with a graph backend: comma list of export forms to measure side by side",
    )
    p.add_argument(
        "--ort-sweep",
        action="store_true",
        help="with onnxruntime: also measure graph optimization levels and intra-op thread counts",
    )
    p.set_defaults(func=run)


def run_rollback(args) -> int:
    from thor_app.tools.rollback_bench import bench_rollback

    try:
        ks = [int(x) for x in args.ks.split(",") if x.strip()]
    except ValueError:
        raise ThorError(
            f"bad --ks {args.ks!r}; expected a comma list of integers like 3,7,15"
        ) from None
    if not ks or min(ks) < 1 or max(ks) > 63:
        raise ThorError(f"--ks values must be in 1..63, got {args.ks!r}")
    res = bench_rollback(ks, repeats=args.repeats, accept=args.accept, log=print)
    res["device"] = device_info(config_from_args(args))
    Path(args.json_out).write_text(json.dumps(res, indent=1))
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0


def _on_accelerator(config) -> bool:
    """The resolved device is not the CPU: the device benchmark (bench_device.py) runs."""
    from thor_runtime.device import resolve_device

    return resolve_device(config.model.device).type != "cpu"


def run(args) -> int:
    from thor_runtime.speculative import DEFAULT_TIE_TOL

    config = config_from_args(args)  # a bad flag value fails before anything loads
    if args.tie_tol is None:
        args.tie_tol = DEFAULT_TIE_TOL
    if args.rollback:
        return run_rollback(args)
    if _on_accelerator(config) and not (
        args.plan or args.serve or args.tools or args.ros or args.peers or args.backend != "torch"
    ):
        from thor_app.tools.bench_device import side_by_side

        return side_by_side(config.model.device, Path(args.json_out), args.repeats)
    if args.prompt_parts:
        from thor_app.tools.bench_prompt import run_prompt_parts

        return run_prompt_parts(args, config)
    if args.peers:
        from thor_app.tools.peers.driver import parse_configs, run_peers

        run_peers(
            config.model.name,
            Path(args.out_dir),
            short=args.short,
            peers_py=args.peers_python,
            threads=args.threads,
            configs=parse_configs(args.peers_configs),
            neighbour=args.neighbour,
            transformers=not args.no_baseline,
            repeats=args.peers_repeats,
            max_tokens=args.peers_max_tokens,
            plans=args.peers_plans,
        )
        return 0
    if args.neighbour:
        from thor_app.tools.bench_neighbour import run_neighbour

        return run_neighbour(args, config)
    configs = [c.strip().split("/") for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if len(c) != 2 or c[0] not in BENCH_WEIGHTS or c[1] not in KV_DTYPES:
            raise ThorError(
                f"bad --configs entry {'/'.join(c)!r}; expected WEIGHTS/KV like bf16/fp8"
            )
    specs = [s.strip() for s in args.spec.split(",") if s.strip()]
    for s in specs:
        if s not in SPEC_METHODS:
            raise ThorError(f"unknown --spec {s!r}; choose from {', '.join(SPEC_METHODS)}")
    if args.tools:
        from thor_app.tools.bench_tools import run_tools

        return run_tools(args)
    if args.ros:
        from thor_app.tools.bench_ros import run_ros

        return run_ros(args)
    if args.serve:
        from thor_app.tools.bench_serve import run_serve

        return run_serve(args)
    if args.prefix_cache is None:
        args.prefix_cache = (
            ModelSettings().prefix_cache if args.plan and args.plan_start != "whole" else 0
        )
    if args.plan:
        from thor_app.tools.bench_plan import run_plan

        return run_plan(args, specs)
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    if backends != ["torch"]:
        from thor_app.tools.bench_backends import run_backends

        return run_backends(args, configs, backends)
    from thor_app.tools.bench_decode import run_decode

    return run_decode(args, config, configs, specs)
