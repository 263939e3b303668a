"""Plans and generations before and after a change that must not change behaviour.

``snapshot`` plans every task of the sample worlds and of evaluation sets 6, 7 and 8 with one
model, in one process, and writes each plan document (plan, valid, report, expansion) with the
text of one ``thor generate`` prompt to a JSON file; ``compare`` tells whether two snapshots
are byte-identical and lists the tasks that differ.

    python scripts/plan_identity.py snapshot --model default --out before.json
    python scripts/plan_identity.py compare before.json after.json

To snapshot an older commit, run the same script with ``PYTHONPATH`` set to a worktree of
that commit (``git worktree add``): the imports below resolve against either layout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = ("6-", "7-", "8-")
GENERATE_PROMPT = "The robot arm picked up the red cup and"


def _imports():
    """(RuntimeConfig, build_runtime, make_planner, load_world, load_skills, resolve_skills_path,
    specialize_request, data root) for whichever layout is on the path."""
    from thor_app.assembly import build_runtime, make_planner

    try:  # this layout: the runtime's front door
        from agent.files.loader import load_skills, load_world, resolve_skills_path
        from agent.planner.planner import specialize_request
        from thor_runtime import RuntimeConfig
    except ImportError:  # the flat layout before it
        from agent.files import load_skills, load_world, resolve_skills_path
        from agent.planner import specialize_request
        from thor_runtime.runtime_config import RuntimeConfig
    import agent

    agent_dir = Path(agent.__file__).resolve().parent
    return (
        RuntimeConfig,
        build_runtime,
        make_planner,
        load_world,
        load_skills,
        resolve_skills_path,
        specialize_request,
        agent_dir,
    )


def _lab():
    """(the sample worlds' tasks, load_eval_set, the sets' folder) for whichever layout is on
    the path: the ones the plan bench and the evaluation use."""
    try:  # this layout: the lab in evals/
        from evals.evaluation import SETS_DIR, load_eval_set
        from evals.plan_bench import TASKS
    except ImportError:  # the flat layout before it
        from agent.bench import TASKS
        from agent.evaluation import EVAL_DIR, load_eval_set

        SETS_DIR = EVAL_DIR.parent
    return TASKS, load_eval_set, SETS_DIR


def cases(load_world, load_skills, resolve_skills_path, agent_dir: Path):
    """(key, task, world, skills) for every task the snapshot plans."""
    tasks_by_world, load_eval_set, sets_dir = _lab()
    worlds = agent_dir / "worlds"
    for name, tasks in tasks_by_world.items():
        world = load_world(worlds / f"{name}.json")
        skills = load_skills(resolve_skills_path(world, None))
        for i, t in enumerate(tasks):
            yield f"sample/{name}/{i}", t, world, skills
    for d in sorted(x for x in sets_dir.iterdir() if x.name.startswith(SETS)):
        tasks, by_world = load_eval_set(d)
        for t in tasks:
            world, skills = by_world[t.world]
            yield f"{d.name.split('-')[0]}/{t.id}", t.task, world, skills


def snapshot(model: str, out: Path, limit: int | None) -> None:
    (
        RuntimeConfig,
        build_runtime,
        make_planner,
        load_world,
        load_skills,
        resolve_skills_path,
        specialize_request,
        agent_dir,
    ) = _imports()
    base = RuntimeConfig()
    from dataclasses import replace

    config = replace(base, model=replace(base.model, name=model))
    assembled = build_runtime(config)
    planner = make_planner(assembled, shelf=None)
    docs = {}
    for n, (key, task, world, skills) in enumerate(
        cases(load_world, load_skills, resolve_skills_path, agent_dir)
    ):
        if limit is not None and n >= limit:
            break
        request = specialize_request(task, world, skills, None, config.planner.max_steps or None)
        res = planner.plan(planner.compile(request))
        doc = res.document()
        docs[key] = {k: doc.get(k) for k in ("plan", "valid", "report", "expansion")}
        print(f"{key}: valid={doc.get('valid')}", file=sys.stderr, flush=True)
    try:
        from thor_runtime import SamplingParams
    except ImportError:
        from thor_runtime.sampling import SamplingParams

    tok = assembled.loaded.tokenizer
    ids = tok.encode(GENERATE_PROMPT)
    ids = getattr(ids, "ids", ids)
    res = assembled.runtime.generate(ids, SamplingParams(max_tokens=48), assembled.speculation)
    docs["generate"] = list(res.token_ids)
    out.write_text(json.dumps(docs, indent=1, sort_keys=True) + "\n")
    print(f"{len(docs)} entries -> {out}", file=sys.stderr)


def compare(a: Path, b: Path) -> int:
    da, db = json.loads(a.read_text()), json.loads(b.read_text())
    differ = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    print(f"{len(set(da) & set(db))} shared entries, {len(differ)} differ")
    for k in differ:
        print(f"  {k}:\n    {json.dumps(da.get(k))[:300]}\n    {json.dumps(db.get(k))[:300]}")
    return 1 if differ else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("--model", default="default")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--limit", type=int, default=None)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args()
    if args.cmd == "snapshot":
        snapshot(args.model, args.out, args.limit)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
