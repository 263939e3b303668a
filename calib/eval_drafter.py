"""`thor calib eval-drafter`: held-out acceptance and speedup of a DFlash drafter, in one run.

For each held-out robot prompt (never trained on: see prompts.py) the target decodes greedily
four times, back to back — plain (K = 0), with the drafter alone, with the combined proposer
(the drafter plus prompt lookup, speculative/combined.py) and with prompt lookup alone — so all
see the same machine load. Reported: acceptance length (tokens committed per verify cycle, i.e.
accepted drafts + the bonus token), acceptance rate per draft position, decode tokens/s of each and
their ratio to plain, and whether the outputs are identical (greedy speculative decoding must not
change a token).

``constrained``: all runs decode as the planner does, greedy under each request's plan
grammar (forced tokens ride in the draft; plain constrained decoding already commits them
without a model step, so the speedup is against that, not against free decoding).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import torch

from thor_runtime.config import SpeculationSettings as _Defaults
from thor_runtime.engine import Runtime, SamplingParams
from thor_runtime.errors import ThorError

from .datagen import plan_constraint
from .prompts import general_prompts, robot_requests


@dataclass(frozen=True)
class EvalConfig:
    drafter: str | None = None  # None = the shipped drafter trained for the target
    n: int = 8
    max_tokens: int = 128
    seed: int = 0
    block_size: int | None = None  # None = the drafter's own
    window: int = _Defaults.window
    prompt_set: str = "robot"  # held-out planner prompts, or held-out general instructions
    constrained: bool = False  # robot prompts under the plan grammar, as the planner decodes
    lookup_rate: float = _Defaults.lookup_rate  # the combined proposer's prior for lookup drafts

    def __post_init__(self):
        if self.constrained and self.prompt_set != "robot":
            raise ThorError(
                "eval-drafter: --constrained needs the robot prompt set (general prompts have no "
                "plan grammar)"
            )
        if self.prompt_set not in ("robot", "general"):
            raise ThorError(
                f"eval-drafter: prompt set must be robot or general, got {self.prompt_set!r}"
            )
        if self.n < 1 or self.max_tokens < 1 or self.window < 1:
            raise ThorError("eval-drafter: n, max_tokens and window must be >= 1")
        if not 0 < self.lookup_rate < 1:
            raise ThorError(f"eval-drafter: lookup rate must be in (0, 1), got {self.lookup_rate}")
        if self.block_size is not None and self.block_size < 2:
            raise ThorError(f"eval-drafter: block size must be >= 2, got {self.block_size}")


# each prompt decoded plainly, with the drafter, with the combined proposer and with prompt
# lookup alone (the proposer a drafter has to beat)
RUNS = ("plain", "spec", "comb", "ngram")


def _tally(agg: dict, run: str, stats) -> None:
    """Add one decode to ``run``'s totals: tokens after the first (that one comes from prefill),
    decode seconds, verify cycles and committed tokens."""
    agg[f"{run}_tokens"] += max(stats.generated - 1, 0)
    agg[f"{run}_s"] += stats.decode_s
    agg[f"{run}_cycles"] += stats.cycles
    agg[f"{run}_committed"] += stats.committed


def heldout_prompts(tok, cfg: EvalConfig) -> tuple[list, list[list[int]], str | None]:
    """-> (the held-out requests, [] for general instructions; each prompt's chat ids; today's
    plan-format fingerprint for planner requests, None otherwise): what ``evaluate`` decodes,
    shared with choose-drafter so that both judge a drafter on the same requests."""
    from agent.planner.plan_format import plan_format_fingerprint

    # planner requests: a drafter distilled on another plan format is reported stale (once)
    fmt = plan_format_fingerprint() if cfg.prompt_set == "robot" else None
    reqs = robot_requests("heldout", cfg.n, cfg.seed) if cfg.prompt_set == "robot" else []
    msgs = [r.messages for r in reqs] if reqs else general_prompts("heldout")[: cfg.n]
    return reqs, [tok.encode_chat(m) for m in msgs], fmt


def evaluate(loaded, cfg: EvalConfig, progress: bool = True, drafter=None) -> dict:
    """drafter: an in-memory DFlashDrafter (distill's report), else loaded from cfg.drafter."""
    from tqdm import tqdm

    from agent.schema.grammar import GrammarTokenizer
    from thor_runtime.speculative import (
        SpecOptions,
        build_speculation,
        load_drafter,
        require_drafter_for,
    )

    model, tok = loaded.model, loaded.tokenizer
    path = cfg.drafter
    if drafter is None:
        path = path or str(require_drafter_for(model).path)
        drafter = load_drafter(path, model.cfg)
    # opts.drafter only names the drafter (the one in memory runs) in a stale-format warning
    opts = SpecOptions(
        method="dflash",
        drafter=path,
        block_size=cfg.block_size,
        window=cfg.window,
        lookup_rate=cfg.lookup_rate,
    )
    block = cfg.block_size or drafter.cfg.block_size
    rt = Runtime(model, tok)
    params = SamplingParams(max_tokens=cfg.max_tokens)
    reqs, prompts, fmt = heldout_prompts(tok, cfg)
    gtok = GrammarTokenizer(tok) if cfg.constrained else None
    agg = {f"{run}_{total}": 0 for run in RUNS for total in ("tokens", "s", "cycles", "committed")}
    agg["comb_lookup_cycles"] = 0
    offered, accepted = [0] * (block - 1), [0] * (block - 1)
    identical, per_prompt = True, []
    for i, ids in enumerate(
        tqdm(prompts, desc="eval-drafter", unit="prompt", file=sys.stderr, disable=not progress)
    ):
        req = reqs[i] if cfg.constrained else None
        # Fresh proposers per prompt (their windows and lookup counters are per sequence).
        spec_sp = build_speculation(opts, model, drafter=drafter, plan_format=fmt)
        comb_sp = build_speculation(
            replace(opts, method="combined"), model, drafter=drafter, plan_format=fmt
        )
        ngram_sp = build_speculation(replace(opts, method="ngram"), model)
        with torch.inference_mode():
            plain = rt.generate(ids, params, constraint=plan_constraint(gtok, req))
            spec = rt.generate(ids, params, spec_sp, constraint=plan_constraint(gtok, req))
            comb = rt.generate(ids, params, comb_sp, constraint=plan_constraint(gtok, req))
            look = rt.generate(ids, params, ngram_sp, constraint=plan_constraint(gtok, req))
        comb_prop = comb_sp.proposer
        same = plain.token_ids == spec.token_ids == comb.token_ids == look.token_ids
        identical &= same
        ss, hs = spec.stats, comb.stats
        for run, res in zip(RUNS, (plain, spec, comb, look)):
            _tally(agg, run, res.stats)
        agg["comb_lookup_cycles"] += comb_prop.lookup_cycles
        for j, (o, a) in enumerate(zip(ss.pos_offered, ss.pos_accepted)):
            if j == len(offered):  # grammar-forced tokens can make a draft longer than B - 1
                offered.append(0)
                accepted.append(0)
            offered[j] += o
            accepted[j] += a
        per_prompt.append(
            {
                "tokens": ss.generated,
                "identical": same,
                "accept_length_mean": round(ss.committed / ss.cycles, 3) if ss.cycles else 0.0,
                "combined_accept_length_mean": round(hs.committed / hs.cycles, 3)
                if hs.cycles
                else 0.0,
            }
        )
    plain_tps = agg["plain_tokens"] / agg["plain_s"] if agg["plain_s"] else 0.0
    spec_tps = agg["spec_tokens"] / agg["spec_s"] if agg["spec_s"] else 0.0
    comb_tps = agg["comb_tokens"] / agg["comb_s"] if agg["comb_s"] else 0.0
    ngram_tps = agg["ngram_tokens"] / agg["ngram_s"] if agg["ngram_s"] else 0.0
    return {
        "prompts": len(prompts),
        "split": "heldout",
        "constrained": cfg.constrained,
        "max_tokens": cfg.max_tokens,
        "block_size": block,
        "window": cfg.window,
        "identical_output": identical,
        "spec_note": spec_sp.note,  # "" unless the drafter is stale for today's planner format
        "accept_length_mean": round(agg["spec_committed"] / agg["spec_cycles"], 4)
        if agg["spec_cycles"]
        else 0.0,
        "accept_per_position": [round(a / o, 4) if o else 0.0 for a, o in zip(accepted, offered)],
        "plain_decode_tok_s": round(plain_tps, 2),
        "spec_decode_tok_s": round(spec_tps, 2),
        "speedup": round(spec_tps / plain_tps, 3) if plain_tps else 0.0,
        "combined": {
            "lookup_rate": cfg.lookup_rate,
            "accept_length_mean": round(agg["comb_committed"] / agg["comb_cycles"], 4)
            if agg["comb_cycles"]
            else 0.0,
            "lookup_cycle_share": round(agg["comb_lookup_cycles"] / agg["comb_cycles"], 4)
            if agg["comb_cycles"]
            else 0.0,
            "decode_tok_s": round(comb_tps, 2),
            "speedup": round(comb_tps / plain_tps, 3) if plain_tps else 0.0,
        },
        "ngram": {
            "accept_length_mean": round(agg["ngram_committed"] / agg["ngram_cycles"], 4)
            if agg["ngram_cycles"]
            else 0.0,
            "decode_tok_s": round(ngram_tps, 2),
            "speedup": round(ngram_tps / plain_tps, 3) if plain_tps else 0.0,
        },
        "spec_vs_ngram": round(spec_tps / ngram_tps, 3) if ngram_tps else 0.0,
        "per_prompt": per_prompt,
    }
