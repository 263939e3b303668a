"""Training data for the drafter: the target's own greedy responses to calibration prompts.

A drafter is judged by how often its tokens equal the target's greedy tokens, so the labels
are exactly those tokens (not human text). Free-text prompts are decoded in batches
(``thor_runtime.engine.batched``); robot prompts with ``--constrained`` as the planner decodes them.
The on-disk format is in ``shards.py``; ``generate_dataset`` resumes from the shards present.

Under torchrun each rank answers the requests i with i % size == rank and writes its own shards.
A request's prompt and answer depend on i and the set's seed alone (every rank builds the whole
prompt set; decoding is greedy), so the union of the ranks' shards is the data one process
makes, whatever the number of workers, and a restart — with any number of workers — skips every
request some shard already holds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from agent.planner.plan_format import FORMAT_KEY, plan_format_fingerprint
from thor_runtime.cache import prompt_set_hash
from thor_runtime.engine import batched_greedy
from thor_runtime.errors import ThorError
from thor_runtime.fileio import write_json_atomic

from .dist import ONE, World
from .fleet import fleet_items
from .prompts import PromptSpec, RobotRequest, calib_items, render_key
from .shards import DATA_FORMAT, read_manifest, shard_indices, shard_path, write_shard


@dataclass(frozen=True)
class GenConfig:
    max_tokens: int = 256
    batch: int = 8
    # Robot prompts answered as the planner answers them: greedy under the plan grammar
    # (what a deployed drafter must predict), one sequence at a time.
    constrained: bool = False

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ThorError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.batch < 1:
            raise ThorError(f"--batch must be >= 1, got {self.batch}")


def plan_constraint(gtok, req: RobotRequest | None):
    """A fresh plan-grammar constraint for req, built exactly as the planner builds it (None for a
    general instruction, which has no request). gtok: an
    ``agent.schema.grammar.GrammarTokenizer``."""
    from agent.planner.planner import prepare_request

    if req is None:
        return None
    return prepare_request(
        gtok, req.world, req.skills, thinking=gtok.think_ids is not None, task=req.task
    ).grammar.constraint()


class PlanGreedy:
    """The planner's decode path for data: greedy under the request's plan grammar (general
    instructions, which have no request, are decoded unconstrained). The planner's own
    speculation (``auto``: the hybrid proposer where a drafter fits the target, else prompt
    lookup) makes it faster and, being greedy and exact, does not change a token."""

    def __init__(self, model, tok, max_tokens: int, spec: str = "auto"):
        from agent.schema.grammar import GrammarTokenizer
        from thor_runtime.engine import Runtime
        from thor_runtime.speculative import SpecOptions, build_speculation

        # Robot prompts share their instructions and skills: reuse that K/V across requests.
        self.rt = Runtime(model, tok, prefix_cache=4)
        self.gtok = GrammarTokenizer(tok)
        self.speculation = build_speculation(SpecOptions(method=spec), model)
        self.max_tokens = max_tokens

    def constraint(self, req: RobotRequest | None):
        return plan_constraint(self.gtok, req)

    def __call__(self, ids: list[int], req: RobotRequest | None) -> list[int]:
        from thor_runtime.engine import SamplingParams

        return self.rt.generate(
            ids,
            SamplingParams(max_tokens=self.max_tokens),
            self.speculation,
            constraint=self.constraint(req),
        ).token_ids


def generate_dataset(
    model,
    tok,
    spec: PromptSpec,
    gen: GenConfig,
    out: str | Path,
    target: str = "",
    progress: bool = True,
    world: World = ONE,
) -> dict:
    """Generate (or finish generating) the dataset in ``out``: this rank's share of it, and with
    several workers wait for the others. -> summary dict (rank 0's covers every rank)."""
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    items = fleet_items(spec) if spec.from_log else calib_items(spec)
    prompts = [m for m, _ in items]
    man = {
        "format": DATA_FORMAT,
        "split": spec.split,
        "seed": spec.seed,
        "n": spec.n,
        "general_frac": spec.general_frac,
        "max_tokens": gen.max_tokens,
        "target": target,
        "constrained": gen.constrained,
        FORMAT_KEY: plan_format_fingerprint(),
        "prompt_set_sha256": prompt_set_hash([render_key(m) for m in prompts]),
        "from_log": bool(spec.from_log),
    }
    old = read_manifest(out)
    if old is not None:
        keys = (
            "format",
            "split",
            "seed",
            "general_frac",
            "max_tokens",
            "target",
            "constrained",
            FORMAT_KEY,
        )
        if spec.from_log or old.get("from_log"):  # a log changes: resume the same requests only
            keys += ("from_log", "prompt_set_sha256")
        diff = [k for k in keys if old.get(k, False if k == "constrained" else None) != man[k]]
        if diff:
            raise ThorError(
                f"{out}: existing data was made with different settings ({', '.join(diff)}); "
                "use another --out or delete it"
            )
    # Every rank has checked the settings above; one per machine writes them (the same bytes
    # where the machines share OUT), before any shard, so that a restart finds them to check
    # against and each machine's OUT reads as a data set of its own.
    if world.local_rank == 0:
        write_json_atomic(out / "manifest.json", man)

    done = shard_indices(out)
    mine = [i for i in range(len(prompts)) if world.owns(i)]
    todo = [i for i in mine if i not in done]
    enc = {i: tok.encode_chat(prompts[i]) for i in todo}
    # Similar lengths per batch: less left padding to pay for.
    todo.sort(key=lambda i: len(enc[i]))
    bar = tqdm(
        total=len(mine),
        initial=len(mine) - len(todo),
        desc="gen-data" if world.size == 1 else f"gen-data ({world})",
        unit="prompt",
        file=sys.stderr,
        disable=not (progress and world.main),  # one bar: the workers' would interleave
        dynamic_ncols=True,
    )
    n_tok = 0
    plan_greedy = PlanGreedy(model, tok, gen.max_tokens) if gen.constrained else None
    for b in range(0, len(todo), gen.batch):
        idx = todo[b : b + gen.batch]
        if plan_greedy is not None:
            resp = [plan_greedy(enc[i], items[i][1]) for i in idx]
        else:
            resp = batched_greedy(
                model, [enc[i] for i in idx], gen.max_tokens, getattr(tok, "eos_token_ids", ())
            )
        seqs = [
            {"ids": enc[i] + r, "prompt_len": len(enc[i]), "index": i} for i, r in zip(idx, resp)
        ]
        write_shard(shard_path(out, None if world.size == 1 else world.rank), seqs)
        n_tok += sum(len(r) for r in resp)
        bar.update(len(idx))
        bar.set_postfix(new_tokens=n_tok)
    bar.close()
    doc = {
        "out": str(out),
        "prompts": len(prompts),
        "generated_now": len(todo),
        "new_tokens": n_tok,
        **{k: man[k] for k in ("split", "seed", "max_tokens", "prompt_set_sha256")},
    }
    if world.size == 1:
        return doc
    # Past this wait every rank's shards are written: the set is whole (where OUT is one disk
    # that all ranks share; shards made on other machines' disks are copied in, see the docs).
    shares = world.gather([len(todo), n_tok])
    have = shard_indices(out)
    return {
        **doc,
        "generated_now": sum(a for a, _ in shares),
        "new_tokens": sum(b for _, b in shares),
        "workers": world.size,
        "missing_here": sum(i not in have for i in range(len(prompts))),
    }
