"""`thor selftest` — the on-device parity self-test of a backend against torch.

Exit 0 only if every check passes; 1 when a check fails (the one-screen summary, or with
--json one JSON report on stdout); 2 on bad input. The checks live in engines.selftest; the
constrained-plan check is added here because it needs the agent layer.
"""

from __future__ import annotations

import json

from thor_app.commands.common import add_engine_build_args


def register(sub) -> None:
    p = sub.add_parser("selftest", help="parity self-test of a backend against the torch reference")
    p.add_argument("--quick", action="store_true", help="shorter sequences and generations")
    p.add_argument("--no-plan", action="store_true", help="skip the constrained-plan check")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    add_engine_build_args(p)
    p.set_defaults(func=run)


def plan_check(loaded, backend):
    """One constrained plan on the sample world, on the backend under test: valid or not."""
    from agent.files.loader import AGENT_DIR, load_skills, load_world, resolve_skills_path
    from agent.planner.planner import Planner
    from agent.planner.prompt import build_messages
    from engines.backend import using
    from engines.selftest import Check
    from thor_runtime.engine import Runtime
    from thor_runtime.speculative import PLAIN

    world = load_world(AGENT_DIR / "worlds" / "kitchen.json")
    skills = load_skills(resolve_skills_path(world, None))
    name, task, budget = (
        "constrained plan on the kitchen world",
        "Put the red mug in the dish rack.",
        384,
    )
    prompt = len(loaded.tokenizer.encode_chat(build_messages(task, world, skills, None, None)))
    context = loaded.model.cfg.max_position_embeddings
    if (
        prompt + budget > context
    ):  # a small test model: the planner's prompt alone fills its context
        return Check(
            name,
            True,
            {"prompt_tokens": prompt, "plan_budget": budget, "context": context},
            {},
            detail=f"not applicable: the planner's prompt ({prompt} tokens) and a plan ({budget}) "
            f"exceed the model context ({context} tokens)",
            applicable=False,
        )
    with using(loaded.model, backend):
        rt = Runtime(loaded.model, loaded.tokenizer)
        res = Planner(rt, loaded.tokenizer, PLAIN, max_tokens=budget, attempts=1).plan(
            task, world, skills, None
        )
    figs = {
        "valid": bool(res.valid),
        "attempts": res.attempts,
        "tokens": res.stats.get("generated_tokens"),
    }
    return Check(
        name,
        bool(res.valid),
        figs,
        {"valid": True},
        () if res.valid else ("valid",),
        "" if res.valid else "; ".join(f["message"] for f in res.report[:3]),
    )


def run(args) -> int:
    from engines.backend import spec_width
    from engines.selftest import run_selftest
    from thor_app.assembly import (
        backend_options,
        build_speculation,
        load_model,
        make_backend,
        progress_bar,
    )
    from thor_app.flags import config_from_args

    config = config_from_args(args)
    backend_options(config)  # a bad option combination fails before the model loads
    from thor_runtime.device import resolve_device

    device = resolve_device(config.model.device)
    if device.type != "cpu" and config.engine.backend == "torch":
        # the model on an accelerator: checked against itself in fp32 on the CPU
        from engines.device_check import run_device_check

        return _report(
            run_device_check(config.model.name, device, config.model.dtype, args.quick), args.json
        )
    loaded = load_model(config)
    spec = build_speculation(config, loaded)
    options = backend_options(config, spec_width(spec))
    # not attached: the self-test switches between the backend and torch itself
    backend = make_backend(config, loaded, spec, attach=False)
    rep = run_selftest(
        loaded,
        backend if backend is not None else "torch",
        quick=args.quick,
        progress=progress_bar("selftest", "step"),
        options=options,
        extra_checks=() if args.no_plan else (plan_check,),
    )
    return _report(rep, args.json)


def _report(rep, as_json: bool) -> int:
    print(json.dumps(rep.to_dict()) if as_json else rep.summary())
    return 0 if rep.passed else 1
