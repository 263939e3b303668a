"""`thor bench --prompt-parts`: tokens per part of the plan prompt (agent/planner/prompt_parts.py)
for the sample worlds' benchmark tasks and every evaluation set, with the model's tokenizer only
(nothing is generated). JSON with every request's counts, and a table of medians."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evals.evaluation import SETS_DIR


def _sets():
    from evals.evaluation import load_eval_set
    from evals.plan_bench import plan_cases

    yield "sample worlds", [(task, world, skills) for _, task, world, skills in plan_cases()]
    for d in sorted((SETS_DIR).iterdir()):
        if (d / "tasks.json").is_file():
            tasks, worlds = load_eval_set(d)
            yield d.name, [(t.task, *worlds[t.world]) for t in tasks]


def run_prompt_parts(args, config) -> int:
    from agent.planner.prompt_parts import PARTS, prompt_parts, summarize
    from thor_app.assembly import load_model

    tok = load_model(config).tokenizer
    results = {}
    for name, cases in _sets():
        print(f"bench --prompt-parts: {name} ({len(cases)} requests)", file=sys.stderr)
        rows = [prompt_parts(tok, task, world, skills) for task, world, skills in cases]
        results[name] = {"requests": len(rows), "median": summarize(rows), "rows": rows}
    Path(args.json_out).write_text(
        json.dumps({"model": config.model.name, "sets": results}, indent=1)
    )
    cols = (*PARTS, "total")
    print("| set | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1))
    for name, r in results.items():
        m = r["median"]
        print(
            f"| {name} | "
            + " | ".join(
                f"{m[c]['median']:g} ({m[c]['share']:.0%})"
                if c != "total"
                else f"{m[c]['median']:g}"
                for c in cols
            )
            + " |"
        )
    print(f"results written to {args.json_out}", file=sys.stderr)
    return 0
