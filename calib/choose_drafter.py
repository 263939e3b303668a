"""`thor calib choose-drafter`: of several drafters trained for one target, the one that decodes
fastest on this machine.

A deeper or wider drafter accepts more tokens a cycle and costs more to run each cycle; which of
the two wins depends on the machine (a CPU pays for every multiply-add of the drafter, a GPU for
its launches) and on the target's verify there. So each candidate is measured here, on the same
held-out requests ``eval-drafter`` decodes (``heldout_prompts``, same ``--n``), with the
measurements ``--spec auto`` itself takes:

- accept length: tokens committed per verify cycle (accepted drafts, grammar-forced tokens and
  the target's own token), greedy, so the same in every repeat;
- drafting: the seconds of each cycle's propose and of the drafter's window update, as the
  generation loop times them for auto (``budget.Cycle``'s ``draft_s`` and ``keep_s``: auto's d
  and w), averaged over every cycle (a paused cycle drafts nothing);
- verify: each cycle's verify in 1-row steps on the runtime's cost curve (cost.py, the one auto
  weighs drafts against: measured once per machine and model, then cached), for the rows it
  verified and the share of them that read logits by id, times the seconds of a 1-row step as
  the repeat's verifies ran (auto's running ``step_s``: all candidates' verifies pooled). The
  curve, not each run's own verify timing, so that the target's cost is the same for every
  candidate and only its rows differ;
- the rest of the cycle (the grammar's masks, choosing and committing tokens: auto's r).

Expected decode speed = accept length / (drafting + verify + rest), each the median over
``repeats`` rounds; the candidates take turns within a round, in reverse order every other round,
so a change in the machine's load touches all of them alike. The ranking itself
(``rank``) is a pure function of those measurements: tests feed it chosen numbers.

Drafts never decide a token: every candidate's output must equal every other's, and the report
says whether it did.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from thor_runtime.errors import ThorError
from thor_runtime.fileio import read_json, write_json_atomic, write_text_atomic

from .eval_drafter import EvalConfig, heldout_prompts

PROPOSERS = ("combined", "dflash")  # combined: what `--spec auto` runs on plans with a drafter


@dataclass(frozen=True)
class ChooseConfig:
    drafters: tuple[str, ...]
    eval: EvalConfig = EvalConfig()  # the held-out requests, as eval-drafter takes them
    repeats: int = 3
    proposer: str = "combined"

    def __post_init__(self):
        if not self.drafters:
            raise ThorError("choose-drafter: name at least one drafter directory")
        seen = set()
        for d in self.drafters:
            key = Path(d).resolve()
            if key in seen:
                raise ThorError(f"choose-drafter: {d} is named twice")
            seen.add(key)
        if self.repeats < 1:
            raise ThorError(f"choose-drafter: repeats must be >= 1, got {self.repeats}")
        if self.proposer not in PROPOSERS:
            raise ThorError(
                f"choose-drafter: proposer must be one of {', '.join(PROPOSERS)}, "
                f"got {self.proposer!r}"
            )
        if self.eval.block_size is not None:
            raise ThorError("choose-drafter: each candidate drafts with its own block size")


@dataclass(frozen=True)
class Candidate:
    name: str  # the directory as named on the command line
    layers: int
    intermediate: int  # the MLP's width
    block_size: int
    parameters: int  # the drafter's own (the embedding and head are the target's)
    target_id: str
    target_weights: str


@dataclass(frozen=True)
class Measured:
    """One candidate over the held-out requests, once: sums over all their cycles."""

    cycles: int
    committed: int  # tokens the cycles committed
    draft_s: float  # proposes and window updates
    verify_steps: float  # the verifies in 1-row steps on the cost curve
    verify_s: float  # the same verifies as timed (they set the step's seconds now)
    rest_s: float  # the rest of each cycle
    decode_tokens: int = 0  # as the stats count them (not the first, from prefill) ...
    decode_s: float = 0.0  # ... and their seconds: the measured speed, beside the expected
    outputs: tuple[tuple[int, ...], ...] = ()  # each request's tokens
    note: str = ""  # the speculation's note (a stale drafter, say)


@dataclass
class _Tally:
    """The loop's per-cycle costs of one decode, collected on their way to the draft budget."""

    curve: object  # CostCurve
    cycles: int = 0
    draft_s: float = 0.0
    verify_steps: float = 0.0
    verify_s: float = 0.0
    rest_s: float = 0.0


class CycleLog:
    """A draft budget that passes every decision to ``inner`` (None: all K drafts, as without a
    budget) and keeps each cycle's costs: the generation loop hands a budget the ``Cycle`` it
    timed, so this reads what auto reads, with no timing of its own."""

    def __init__(self, inner, tally: _Tally):
        self.inner, self.tally = inner, tally

    def start(self):
        return self.inner.start() if self.inner is not None else None

    def cap(self, k: int, state, forced: int = 0) -> int:
        return self.inner.cap(k, state, forced) if self.inner is not None else k

    def update(self, state, drafted: int, accepted: int, cycle=None):
        if cycle is not None:
            t = self.tally
            t.cycles += 1
            t.draft_s += cycle.draft_s + cycle.keep_s
            # as auto's observe_step: the curve this verify ran on, at its rows
            t.verify_steps += t.curve.mixed(float(cycle.by_id))(cycle.rows)
            t.verify_s += cycle.verify_s
            t.rest_s += max(cycle.cycle_s - cycle.verify_s - cycle.draft_s - cycle.keep_s, 0.0)
        if self.inner is None:
            return state
        return self.inner.update(state, drafted, accepted, cycle)

    def report(self, state):
        return self.inner.report(state) if self.inner is not None else None


def describe(path: str) -> Candidate:
    """A candidate's shape and target from its config (refused before the target loads when the
    directory is missing or is not a drafter)."""
    from thor_runtime.speculative import read_shipped

    d = Path(path)
    if not d.is_dir():
        raise ThorError(f"choose-drafter: drafter not found: {path}")
    if not (d / "config.json").is_file():
        raise ThorError(f"choose-drafter: {path} has no config.json (not a drafter directory)")
    rec = read_shipped(d)
    doc = read_json(d / "config.json", "drafter config")
    try:
        layers, width = int(doc["num_layers"]), int(doc["intermediate_size"])
        block = int(doc["block_size"])
    except (KeyError, TypeError, ValueError):
        raise ThorError(
            f"choose-drafter: {path}/config.json is not a thor-dflash drafter config"
        ) from None
    return Candidate(path, layers, width, block, 0, rec.target_id, rec.target_weights)


def check_one_target(cands: list[Candidate]) -> None:
    """Candidates are compared on one target: all must record the same one."""
    first = cands[0]
    for c in cands[1:]:
        if c.target_id != first.target_id:
            raise ThorError(
                f"choose-drafter: {c.name} was made for {c.target_id!r}, {first.name} for "
                f"{first.target_id!r}: compare drafters of one target"
            )


def check_fits(cand: Candidate, model) -> None:
    """The candidate was made for the loaded target and its weight kind (as auto requires)."""
    from thor_runtime.speculative import read_shipped, weights_kind

    if read_shipped(cand.name).fits(model):
        return
    kind = weights_kind(model) or "?"
    if cand.target_id != model.cfg.name:
        why = f"was made for {cand.target_id!r}, the target is {model.cfg.name!r}"
    elif cand.target_weights not in ("", kind):
        # a quantized target is the GGUF's own weights: --weights auto loads them so
        flag = "auto" if cand.target_weights.startswith("int") else cand.target_weights
        why = (
            f"learnt the taps of {cand.target_weights} weights, the target runs {kind} "
            f"(--weights {flag}?)"
        )
    else:
        why = f"does not match the target's hidden size {model.cfg.hidden_size}"
    raise ThorError(f"choose-drafter: {cand.name} {why}")


def _median(xs) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def rank(cands: list[Candidate], rounds: list[list[Measured]]) -> dict:
    """The report: ``rounds[r][i]`` is candidate i measured in round r. Per round the seconds of
    a 1-row step are every candidate's verify seconds over their curve steps; a candidate's
    costs per cycle are medians over the rounds, its expected speed its accept length over
    their sum. Sorted fastest first; ratios are against the first candidate named."""
    if not rounds or any(len(r) != len(cands) for r in rounds):
        raise ThorError("choose-drafter: every round must measure every candidate")
    step_s = []
    for r in rounds:
        steps = sum(m.verify_steps for m in r)
        step_s.append(sum(m.verify_s for m in r) / steps if steps > 0 else 0.0)
    rows = []
    for i, c in enumerate(cands):
        ms = [(r[i], s) for r, s in zip(rounds, step_s)]
        per = [(m, s) for m, s in ms if m.cycles > 0]
        accept = _median([m.committed / m.cycles for m, _ in per])
        draft = _median([m.draft_s / m.cycles for m, _ in per])
        verify = _median([s * m.verify_steps / m.cycles for m, s in per])
        rest = _median([m.rest_s / m.cycles for m, _ in per])
        cycle = draft + verify + rest
        measured = _median([m.decode_tokens / m.decode_s for m, _ in ms if m.decode_s > 0])
        samples = [  # each round's own figures, the medians' inputs
            {
                "accept_length": round(m.committed / m.cycles, 4),
                "draft_ms": round(1e3 * m.draft_s / m.cycles, 4),
                "verify_ms": round(1e3 * s * m.verify_steps / m.cycles, 4),
                "rest_ms": round(1e3 * m.rest_s / m.cycles, 4),
                "decode_tok_s": round(m.decode_tokens / m.decode_s, 2) if m.decode_s > 0 else 0.0,
            }
            for m, s in per
        ]
        rows.append(
            {
                "candidate": c.name,
                "layers": c.layers,
                "intermediate": c.intermediate,
                "block_size": c.block_size,
                "parameters": c.parameters,
                "accept_length": round(accept, 4),
                "draft_ms": round(1e3 * draft, 4),
                "verify_ms": round(1e3 * verify, 4),
                "rest_ms": round(1e3 * rest, 4),
                "expected_tok_s": round(accept / cycle, 2) if cycle > 0 else 0.0,
                "measured_tok_s": round(measured, 2),
                "cycles": [m.cycles for m, _ in ms],
                "rounds": samples,
                "note": next((m.note for m, _ in ms if m.note), ""),
            }
        )
    base = rows[0]["expected_tok_s"]
    for row in rows:
        row["vs_first"] = round(row["expected_tok_s"] / base, 3) if base > 0 else 0.0
    ranked = sorted(rows, key=lambda row: -row["expected_tok_s"])
    outs = [m.outputs for r in rounds for m in r]
    return {
        "winner": ranked[0]["candidate"],
        "first": cands[0].name,
        "identical_output": all(o == outs[0] for o in outs),
        "repeats": len(rounds),
        "step_ms": [round(1e3 * s, 4) for s in step_s],
        "candidates": ranked,
    }


def markdown(report: dict) -> str:
    """The report's table, fastest first, and the winner."""
    lines = [
        "| candidate | layers | MLP width | parameters | accept length | draft ms | verify ms "
        "| rest ms | expected tok/s | vs first |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["candidates"]:
        lines.append(
            f"| `{r['candidate']}` | {r['layers']} | {r['intermediate']:,} "
            f"| {r['parameters'] / 1e6:.1f} M | {r['accept_length']:.2f} | {r['draft_ms']:.2f} "
            f"| {r['verify_ms']:.2f} | {r['rest_ms']:.2f} | {r['expected_tok_s']:.1f} "
            f"| {r['vs_first']:.2f}x |"
        )
    lines += ["", f"winner: `{report['winner']}`"]
    if not report["identical_output"]:
        lines.append("OUTPUT DIFFERED between candidates: a bug, not a ranking")
    return "\n".join(lines) + "\n"


class Measurer:
    """The real measurement: each candidate decodes the held-out requests under ``proposer``
    with its own block, its cycles' costs read as auto reads them (``CycleLog``)."""

    def __init__(self, loaded, cfg: ChooseConfig, cands: list[Candidate]):
        from agent.schema.grammar import GrammarTokenizer
        from thor_runtime.engine import Runtime, SamplingParams

        self.cfg = cfg
        self.model, tok = loaded.model, loaded.tokenizer
        self.rt = Runtime(self.model, tok)
        self.params = SamplingParams(max_tokens=cfg.eval.max_tokens)
        self.reqs, self.prompts, self.fmt = heldout_prompts(tok, cfg.eval)
        self.gtok = GrammarTokenizer(tok) if cfg.eval.constrained else None
        # the cost curve auto weighs drafts against, as wide as the widest candidate's verify
        self.curve = self.rt.cost_curve(max(c.block_size for c in cands))

    def __call__(self, cand: Candidate, drafter, limit: int | None = None) -> Measured:
        """``limit``: decode only that many of the requests (a warm-up)."""
        import torch

        from thor_runtime.speculative import SpecOptions, build_speculation

        from .datagen import plan_constraint

        ev = self.cfg.eval
        opts = SpecOptions(
            method=self.cfg.proposer,
            drafter=cand.name,
            window=ev.window,
            lookup_rate=ev.lookup_rate,
        )
        tally = _Tally(self.curve)
        committed = tokens = 0
        decode_s, outs, note = 0.0, [], ""
        for i, ids in enumerate(self.prompts[:limit]):
            # a fresh proposer per request: its window and lookup state are per sequence
            sp = build_speculation(opts, self.model, drafter=drafter, plan_format=self.fmt)
            sp = replace(sp, budget=CycleLog(sp.budget, tally))
            req = self.reqs[i] if ev.constrained else None
            with torch.inference_mode():
                res = self.rt.generate(ids, self.params, sp, plan_constraint(self.gtok, req))
            s = res.stats
            committed += s.committed
            tokens += max(s.generated - 1, 0)
            decode_s += s.decode_s
            outs.append(tuple(res.token_ids))
            note = note or sp.note
        return Measured(
            tally.cycles,
            committed,
            tally.draft_s,
            tally.verify_steps,
            tally.verify_s,
            tally.rest_s,
            tokens,
            decode_s,
            tuple(outs),
            note,
        )


def load_candidate(cand: Candidate, model) -> tuple[Candidate, object]:
    """The drafter in memory (one copy serves every round) and its parameter count."""
    from thor_runtime.speculative import load_drafter

    drafter = load_drafter(cand.name, model.cfg)
    # counted before a proposer is built: beside the row kernel its projections become 8-bit
    # blocks that are no longer torch parameters
    n = sum(p.numel() for p in drafter.parameters())
    return replace(cand, parameters=int(n)), drafter


def choose(loaded, cfg: ChooseConfig, progress: bool = True, measure=None) -> dict:
    """Measure every candidate ``cfg.repeats`` times and rank them (module doc). ``measure``:
    (candidate, drafter) -> Measured, in place of the real measurement (tests)."""
    from thor_runtime.speculative import machine_key

    cands = [describe(d) for d in cfg.drafters]
    check_one_target(cands)
    for c in cands:
        check_fits(c, loaded.model)
    loaded_cands = [load_candidate(c, loaded.model) for c in cands]
    cands = [c for c, _ in loaded_cands]
    drafters = {c.name: d for c, d in loaded_cands}

    def say(line: str) -> None:
        if progress:
            print(f"choose-drafter: {line}", file=sys.stderr, flush=True)

    curve = None
    if measure is None:
        say(f"{len(cands)} candidates, {cfg.eval.n} held-out requests, {cfg.repeats} rounds")
        real = Measurer(loaded, cfg, cands)
        curve = real.curve
        for c in cands:  # first forwards of each drafter (threads, memory) stay out of the timings
            real(c, drafters[c.name], limit=1)
        measure = real
    rounds = []
    for r in range(cfg.repeats):
        order = list(range(len(cands)))
        if r % 2:
            order.reverse()  # so that a drift in the machine's load does not favour one
        got: dict[int, Measured] = {}
        for i in order:
            t0 = time.perf_counter()
            m = measure(cands[i], drafters[cands[i].name])
            got[i] = m
            say(
                f"round {r + 1}/{cfg.repeats} {cands[i].name}: accept "
                f"{m.committed / max(m.cycles, 1):.2f}, drafting "
                f"{1e3 * m.draft_s / max(m.cycles, 1):.2f} ms a cycle "
                f"({time.perf_counter() - t0:.1f} s)"
            )
        rounds.append([got[i] for i in range(len(cands))])
    report = rank(cands, rounds)
    ev = cfg.eval
    report.update(
        {
            "proposer": cfg.proposer,
            "prompts": ev.n,
            "prompt_set": ev.prompt_set,
            "split": "heldout",
            "constrained": ev.constrained,
            "max_tokens": ev.max_tokens,
            "seed": ev.seed,
            "window": ev.window,
            "target": loaded.model.cfg.name,
            "machine": machine_key(loaded.model.device),  # CPU or GPU, torch, threads
        }
    )
    if curve is not None:
        report["cost_curve"] = {
            "source": curve.source,
            "step_ms": round(1e3 * curve.step_s, 4),
            "costs": list(curve.costs),
            "by_id": list(curve.by_id) if curve.by_id is not None else None,
        }
    return report


def write_report(report: dict, out: str) -> tuple[Path, Path]:
    """``out`` (.json) and the table beside it (.md), each written whole or not at all."""
    path = Path(out)
    if path.suffix != ".json":
        raise ThorError(f"choose-drafter: --out must name a .json file, got {out}")
    table = path.with_suffix(".md")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, report)
    write_text_atomic(table, markdown(report))
    return path, table
