"""`thor bench --plan`: constrained planning on the sample worlds (latency per proposer), the same
on an evaluation set's worlds and wordings (--plan-set wordings) or on the request generator's
held-out split (--plan-set heldout), or with --plan-set eval the held-out evaluation sets (task
success, refusals, unsafe plans per model)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from thor_app.assembly import Assembled, load_model, make_runtime, spec_options, with_settings
from thor_app.flags import config_from_args
from thor_app.session import PlanSession
from thor_app.tools.bench_ceiling import step_and_verify
from thor_app.tools.bench_report import device_info, peak_rss_mb, print_table
from thor_runtime.cache import PrefixShelf
from thor_runtime.errors import ThorError
from thor_runtime.speculative import PLAIN

EVAL_COLUMNS = [
    "model",
    "solver",
    "tasks",
    "task_success",
    "feasible_success",
    "correct_refusals",
    "valid",
    "executable",
    "completed_by_solver",
    "first_attempt_model_alone",
    "unsafe_on_exit0",
    "attempts_mean",
    "goal_changed",
    "latency_median_s",
]
# a set with PDDL (evals/pddl_check.py): the independent validator's verdict beside the executor's
PDDL_COLUMNS = ["pddl_valid", "pddl_disagree"]


def _eval_dir(given: str | None) -> tuple[Path, str]:
    """-> (the evaluation set's directory, how the results name it). A relative path that is
    not under the working directory is looked up in the source tree, so `evals/sets/NAME` works
    from anywhere."""
    from evals.evaluation import EVAL_DIR

    if given is None:
        return EVAL_DIR, "evals/sets/1-greenhouse-workshop-pharmacy-depot"
    p = Path(given)
    if not p.is_dir() and not p.is_absolute() and (EVAL_DIR.parents[2] / p).is_dir():
        p = EVAL_DIR.parents[2] / p
    if not (p / "tasks.json").is_file():
        raise ThorError(
            f"--eval-dir {given}: no tasks.json there (an evaluation set is tasks.json + worlds/)"
        )
    return p, given


# --plan-set wordings: tasks of an evaluation set timed per --spec, when --eval-limit is not given
WORDINGS_LIMIT = 8
# --plan-set heldout: the generator's held-out requests timed per --spec, when --eval-limit is
# not given
HELDOUT_LIMIT = 12
# the plan bench's token budget per plan (one attempt, the greedy goal)
PLAN_MAX_TOKENS = 384


def heldout_cases(n: int) -> list[tuple]:
    """plan_cases' tuples for the first ``n`` requests of the request generator's held-out split
    (calib/prompts.py): the worlds, skills and wordings the drafters are distilled from, in
    requests no drafter trained on; the same ones `thor calib eval-drafter --n N` decodes."""
    from calib.prompts import robot_requests

    return [(r.world.name, r.task, r.world, r.skills) for r in robot_requests("heldout", n)]


def run_eval(args, specs) -> int:
    from evals.evaluation import load_eval_set
    from evals.pddl_check import load_binding, require_validator
    from evals.plan_bench import eval_bench

    if args.attempts < 0:
        raise ThorError(f"--attempts must be >= 0, got {args.attempts}")
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.solver]
    eval_dir, eval_name = _eval_dir(args.eval_dir)
    load_eval_set(eval_dir)  # a bad set fails here, before any model is loaded
    pddl = load_binding(eval_dir) is not None
    if pddl:
        require_validator()
    wdt, kv = args.configs.split(",")[0].strip().split("/")
    config = _plan_config(args, wdt, kv)
    models = [m.strip() for m in (args.models or config.model.name).split(",") if m.strip()]
    rows = []
    for m in models:
        loaded = load_model(config, name=m)
        rt = make_runtime(config, loaded)
        for r in eval_bench(
            rt,
            loaded.tokenizer,
            specs[0],
            spec_options(config),
            modes,
            args.attempts,
            limit=args.eval_limit,
            directory=eval_dir,
            goal_choice=config.planner.goal_choice,
            lexicon=config.planner.lexicon,
        ):
            rows.append({"model": m, **r, "solver": "on" if r["solver"] else "off"})
    doc = {
        "device": device_info(config),
        "weights": wdt,
        "kv": kv,
        "spec": specs[0],
        "attempts": args.attempts,
        "prefix_cache": args.prefix_cache,
        "goal_choice": config.planner.goal_choice,
        "lexicon": config.planner.lexicon,
        "eval_dir": eval_name,
        "eval_rows": rows,
    }
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print_table(rows, EVAL_COLUMNS[:-1] + (PDDL_COLUMNS if pddl else []) + EVAL_COLUMNS[-1:])
    return 0


def _plan_config(args, wdt: str, kv: str):
    """The plan benches' runtime: the first --configs pair, --prefix-cache (default 0)."""
    return with_settings(
        config_from_args(args),
        model__dtype=wdt,
        model__kv_dtype=kv,
        model__prefix_cache=args.prefix_cache,
    )


@dataclass(frozen=True)
class SpecSessions:
    """open_session(spec) for evals.plan_bench: a new PlanSession over ``runtime`` that plans
    with ``spec`` and ``options`` (the speculation flags: --drafter, --block-size, ...), with
    the planner settings of ``config`` and the world starts of ``shelves[spec]`` (none without).
    What auto learned is not written: the bench hands it on in memory."""

    config: object  # RuntimeConfig
    loaded: object  # thor_runtime.loading.Loaded
    runtime: object  # the runtime every spec's session plans on
    options: object  # SpecOptions, each spec replacing only the method
    shelves: dict | None = None

    def __call__(self, spec: str) -> PlanSession:
        from agent.planner.plan_format import plan_format_fingerprint
        from thor_runtime.speculative import build_speculation

        # as `thor plan` speculates: a drafter trained on another plan format is stale
        speculation = build_speculation(
            replace(self.options, method=spec),
            self.loaded.model,
            plan_format=plan_format_fingerprint(),
        )
        return PlanSession(
            Assembled(self.config, self.loaded, self.runtime, speculation),
            shelf=(self.shelves or {}).get(spec),
            keep_learned=False,
        )


def spec_sessions(
    config, loaded, runtime, shelves: dict | None = None, max_tokens: int = PLAN_MAX_TOKENS
) -> SpecSessions:
    """The plan bench's sessions over ``runtime``: the speculation flags of ``config``, one
    attempt of ``max_tokens`` on the greedy goal."""
    settings = with_settings(
        config, planner__max_tokens=max_tokens, planner__attempts=0, planner__goal_choice=0
    )
    return SpecSessions(settings, loaded, runtime, spec_options(config), shelves)


def _pin_prefixes(args, session: PlanSession, cases) -> list[dict]:
    """--plan-start process or service: each skill set's shared prompt start, from disk (or built
    and stored once), as `thor plan` and `thor serve` attach it."""
    if args.plan_start == "whole":
        return []
    if session.runtime.prefixes is None:
        raise ThorError(
            f"--plan-start {args.plan_start} keeps the shared prefix in the prefix "
            "cache: give --prefix-cache 1 or more"
        )
    for _name, _task, _world, skills in cases:
        # once per start, by what it is made of: generated skill sets share one file label
        session.attach(skills)
    return [{k: v for k, v in info.items() if k != "path"} for info in session.starts.values()]


def run_plan(args, specs) -> int:
    from evals.plan_bench import eval_cases, plan_bench, plan_cases

    if args.plan_set == "eval":
        return run_eval(args, specs)

    wdt, kv = args.configs.split(",")[0].strip().split("/")
    config = _plan_config(args, wdt, kv)
    loaded = load_model(config)
    rt = make_runtime(config, loaded)
    cases, where = None, "sample worlds"
    if args.plan_set == "wordings":  # held-out worlds and wordings, timed as the sample ones
        eval_dir, where = _eval_dir(args.eval_dir)
        cases = eval_cases(eval_dir, args.eval_limit or WORDINGS_LIMIT)
    elif args.plan_set == "heldout":
        cases, where = heldout_cases(args.eval_limit or HELDOUT_LIMIT), "calib held-out requests"
    cases = plan_cases() if cases is None else cases
    # the prompt starts live in the runtime every spec's session shares
    prefixes = _pin_prefixes(
        args,
        PlanSession(Assembled(config, loaded, rt, PLAIN), shelf=None, keep_learned=False),
        cases,
    )
    # as `thor plan` and `thor serve` keep world starts on disk: each spec its own, empty at first
    starts = config.model.world_starts if args.plan_start != "whole" else 0
    before = step_and_verify(rt)  # where the machine stood: the ratios move with it
    with tempfile.TemporaryDirectory(prefix="thor-world-starts-") as d:
        shelves = (
            {spec: PrefixShelf(Path(d) / str(specs.index(spec)), starts) for spec in specs}
            if starts
            else None
        )
        rows = plan_bench(
            spec_sessions(config, loaded, rt, shelves),
            specs,
            args.repeats,
            cases=cases,
            fresh=args.plan_start == "process",
        )
    machine = {"before": before, "after": step_and_verify(rt)}
    doc = {
        "device": device_info(config),
        "model": config.model.name,
        "weights": wdt,
        "layout": loaded.model.layout,
        "kv": kv,
        "repeats": args.repeats,
        "plan_set": where,
        "plan_start": args.plan_start,
        "prefix_cache": args.prefix_cache,
        "shared_prefixes": prefixes,
        "world_starts": starts,
        "plan_rows": rows,
        "step_and_verify": machine,
        "peak_rss_mb": peak_rss_mb(),
    }
    Path(args.json_out).write_text(json.dumps(doc, indent=1))
    print_table(
        rows,
        [
            "spec",
            "plans",
            "valid",
            "latency_median_s",
            "latency_p90_s",
            "decode_tok_s",
            "decode_vs_first",
            "decode_vs_first_paired",
            "accept_length_mean",
            "jump_forward_tokens",
            "plans_identical_to_first",
        ],
    )
    print(
        "machine, before / after: "
        + " / ".join(
            f"1-row step {m['step_ms']} ms, {m['verify_rows']}-row verify {m['verify_ms']} ms "
            f"({m['verify_in_steps']} steps)"
            for m in machine.values()
        )
        + f" at {before['context']} cached tokens, logits read by id"
    )
    return 0
