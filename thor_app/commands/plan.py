"""`thor plan TASK --world FILE` — a schema-valid, safety-gated plan, or exit 3 with a report.

Exit codes: 0 a plan that passed schema + gate; 2 bad input (files, schema, arguments);
3 no valid plan after the repair attempts. Every input file is checked, and the request's
schema compiled to a grammar, before the model is loaded: bad input fails in milliseconds.
Without --model it plans with the model `thor serve` runs by default (one rule for both,
thor_app/default_model.py): the embedded one, or on a CUDA device the largest pulled catalog
model measured within --latency-goal there, said in one line on stderr. --model NAME runs NAME.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from thor_app.assembly import build_runtime
from thor_app.default_model import choose_default
from thor_app.flags import add_config_args, config_from_args
from thor_app.session import PlanSession
from thor_runtime.errors import NoValidPlan, ThorError
from thor_runtime.fileio import write_text_atomic


def register(sub) -> None:
    p = sub.add_parser("plan", help="plan a robot task as schema-valid, safety-gated JSON")
    p.add_argument("task", help="what the robot should do, in words")
    p.add_argument("--world", required=True, help="world file (JSON: objects, places, robot)")
    p.add_argument(
        "--skills",
        default=None,
        help="skills file (default: the world's `skills` entry, "
        "else agent/skills/manipulation.json)",
    )
    p.add_argument(
        "--schema", default=None, help="base plan schema (default: agent/schemas/plan.schema.json)"
    )
    p.add_argument("--out", default=None, help="write the plan here (atomically) instead of stdout")
    p.add_argument(
        "--json",
        action="store_true",
        help='print one object {"plan","valid","report","expansion","stats"}',
    )
    add_config_args(p, ("planner", "model", "engine", "speculation"))
    p.add_argument(
        "--no-thinking",
        dest="cfg__planner__thinking",
        action="store_const",
        const="off",
        default=argparse.SUPPRESS,
        help="the same as --thinking off",
    )
    p.set_defaults(func=run)


def _log(msg: str) -> None:
    print(f"thor plan: {msg}", file=sys.stderr, flush=True)


def write_atomic(path: Path, text: str) -> None:
    """tmp file in the same directory + os.replace: readers see the old file or the new, never
    half."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ThorError(f"--out: directory does not exist: {path.parent}")
    write_text_atomic(path, text)


def _load_inputs(args, config):
    from agent.files.loader import load_schema, load_skills, load_world, resolve_skills_path
    from agent.planner import specialize_request
    from agent.schema.grammar import check_schema

    spec = config.speculation
    # a given drafter is checked here; the shipped one is the target's, known once it is loaded
    if spec.method in ("dflash", "combined", "hybrid", "auto") and spec.drafter:
        drafter = Path(spec.drafter)
        if not drafter.exists():
            raise ThorError(
                f"DFlash drafter not found: {drafter} (pass --drafter DIR, or --spec ngram)"
            )
    if args.out and not Path(args.out).parent.is_dir():
        raise ThorError(f"--out: directory does not exist: {Path(args.out).parent}")
    world = load_world(args.world)
    skills = load_skills(resolve_skills_path(world, args.skills))
    schema = load_schema(args.schema) if args.schema else None
    # Read the task and specialize the schema once, here without the model, so an unsupported
    # keyword or an unusable skill set is reported before minutes of model loading on a small
    # board; the planner compiles this same schema for the model's tokenizer.
    request = specialize_request(
        args.task, world, skills, schema, config.planner.max_steps or None, config.planner.lexicon
    )
    check_schema(request.schema)
    return request


def run(args) -> int:
    config = config_from_args(args)
    request = _load_inputs(args, config)
    world, skills = request.world, request.skills
    _log(
        f"world {world.name} ({len(world.objects)} objects, {len(world.places)} places), "
        f"{len(skills.skills)} skills from {skills.source}"
    )
    config = choose_default(config, _log)  # after the inputs are checked: a measurement is slow
    _log(f"loading model {config.model.name} ...")
    t0 = time.perf_counter()
    assembled = build_runtime(config)
    _log(f"model loaded in {time.perf_counter() - t0:.2f} s")
    session = PlanSession(assembled, log=_log)
    session.attach(skills)  # the prompt start this skill library shares, from disk when stored
    session.load_learned()  # what --spec auto learned before
    res = session.plan(request, planner=session.planner(on_progress=_log))
    plan_text = json.dumps(res.plan, indent=2) + "\n" if res.plan is not None else ""
    if res.valid and args.out:
        write_atomic(Path(args.out), plan_text)
        _log(f"plan written to {args.out}")
    if args.json:
        print(json.dumps(res.document()))
    elif res.valid and not args.out:
        sys.stdout.write(plan_text)
    for line in res.expansion:  # what a set in the goal came to in this world
        _log(f"goal: {line}")
    session.after_plan()  # the world's start and what auto learned, after the plan is out
    s = res.stats
    _log(
        f"{res.attempts} attempt(s), {s['generated_tokens']} tokens, {s['plan_latency_s']:.2f} s, "
        f"jump-forward {s['jump_forward_tokens']}, accepted {s['accepted']}/{s['drafted']} drafts"
    )
    if not res.valid:
        for f in res.report:
            where = f"step {f['step']}: " if f["step"] else ""
            print(f"  {where}[{f['check']}] {f['message']}", file=sys.stderr)
        raise NoValidPlan(f"no valid plan after {res.attempts} attempt(s); see the report above")
    return 0
