"""Planner: task + world + skills -> a plan that passed schema and safety gate, or a report.

One attempt is: build the prompt, decode under the specialized schema's grammar (speculative or
plain, same cycle), parse, validate, gate (which runs the plan symbolically against its own
goal). When the steps miss the goal, the symbolic solver may complete them from the goal
(``complete=True``, the default; solver.py), and the completed plan is checked the same way.
A rejected attempt is re-prompted with its findings, up to ``attempts`` repairs. Greedy
decoding is deterministic, so a repair only helps because its prompt differs: it carries the
rejected plan and what was wrong with it.

A request is prepared once, before any generation (``prepare_request``): the task is read, the
schema specialized to it and compiled to a grammar; every attempt reuses them. The CLI splits
that in two (``specialize_request`` before the model loads, ``compile_request`` after), the
service prepares before queueing, and both hand the result to ``Planner.plan``.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field, replace

from thor_runtime.errors import ThorError
from thor_runtime.config import PlannerSettings
from thor_runtime.engine import SamplingParams
from thor_runtime.speculative import PLAIN, Speculation
from thor_runtime.engine import Stats

from agent.files.loader import SkillSet, World, base_plan_schema
from agent.symbolic.gate import Finding, GateResult, check_plan, parse_plan
from agent.schema.free_text import drop_free_text, trailing_free_text
from agent.planner.goal_choice import INFEASIBLE, REACHABLE, UNREACHED, Candidate, Choice, GoalChooser
from agent.schema.grammar import Grammar, GrammarTokenizer
from agent.language.task_match import grounding_findings
from agent.planner.prompt import build_messages, shared_start, system_prompt
from agent.language.reading import TaskReading, read_task
from agent.symbolic.solver import complete as solve_from_goal
from agent.symbolic.solver import goal_reasons, goal_stop, stated_goal
from agent.schema.specialize import specialize
from agent.symbolic.executor import ParsedGoal, parse_goal

# Where the task's word rules (reading.py) act: the goal grammar's focus and the gate's grounding
# check, one of them, or neither (an ablation: what the rules add on a set they were not written from)
WORD_RULES = ("all", "grammar", "gate", "none")
_ADDITIVE = ("prompt_tokens", "cached_prompt_tokens", "pinned_prompt_tokens", "generated", "prefill_s", "decode_s",
             "cycles", "drafted", "accepted", "committed", "jump_forward", "relaxed_accepted", "draft_s", "verify_s",
             "rest_s", "grammar_s")


@dataclass(frozen=True)
class PlanResult:
    plan: dict | None          # the last attempt's parsed plan (None when it was not JSON)
    valid: bool                # passed schema + gate
    report: list               # [{step, check, message}]; empty when valid
    stats: dict                # generate's stats summed over attempts, plus attempts / latency
    attempts: int              # generations run (1 + repairs used)
    text: str = ""             # the last attempt's JSON text
    history: tuple = field(default_factory=tuple)   # per attempt: {"text", "report", "finish_reason",
    #                                                  "completed", "model_text" (before the solver)}
    completed: bool = False    # the returned steps were made by the symbolic solver from the model's goal
    generations: tuple = ()    # each attempt's own Stats (the service's metrics count generations)
    # each set of the last attempt's goal as the objects it takes ("every object that is a
    # tool: trowel, shears"), so a user sees what "all the tools" came to before it runs
    expansion: tuple = ()

    def document(self) -> dict:
        """The result as `thor plan --json` prints it and POST /v1/plan answers it."""
        return {"plan": self.plan, "valid": self.valid, "report": self.report, "expansion": list(self.expansion),
                "stats": self.stats}


@dataclass(frozen=True)
class SpecializedRequest:
    """A request checked without the model: the task's reading and the schema specialized to it."""
    task: str | None
    world: World
    skills: SkillSet
    reading: TaskReading | None    # None without a task
    schema: dict
    seconds: float
    grounding: bool = True         # the gate holds the goal to the task's words (grounding.py)


@dataclass(frozen=True)
class PreparedRequest:
    """Everything checked before any generation: the task and its reading, the specialized schema
    and its grammar. Built once per request; every attempt of ``Planner.plan`` reuses it."""
    task: str | None
    world: World
    skills: SkillSet
    reading: TaskReading | None
    schema: dict
    grammar: Grammar
    compile_s: float           # reading + specializing + compiling
    grounding: bool = True     # the gate holds the goal to the task's words (grounding.py)


def merge_stats(parts: list[Stats]) -> Stats:
    """Sum the additive counters of several generations; ttft is the first one's (latency to
    the first planned token the user sees)."""
    if not parts:
        return Stats()
    total = Stats(kv_dtype=parts[0].kv_dtype, device=parts[0].device, spec_note=parts[0].spec_note)
    for name in _ADDITIVE:
        setattr(total, name, sum(getattr(p, name) for p in parts))
    total.kv_bytes = max(p.kv_bytes for p in parts)
    total.ttft_s = parts[0].ttft_s
    width = max(len(p.pos_offered) for p in parts)
    total.pos_offered = [sum(p.pos_offered[j] for p in parts if j < len(p.pos_offered)) for j in range(width)]
    total.pos_accepted = [sum(p.pos_accepted[j] for p in parts if j < len(p.pos_accepted)) for j in range(width)]
    total.auto_choice = parts[-1].auto_choice       # what the attempt that ended the plan ran
    return total


def specialize_request(task: str | None, world: World, skills: SkillSet, schema: dict | None = None,
                       max_steps: int | None = None, words: str = "all") -> SpecializedRequest:
    """Read the task and specialize the schema to it (with a task, the goal is focused on the
    objects it speaks of: specialize.py). No tokenizer needed: bad input fails before a model loads.
    ``words``: where the task's word rules act (an ablation; WORD_RULES): ``all``, only in the
    goal ``grammar``, only in the ``gate`` (grounding.py), or ``none`` (the goal grammar is this
    world's and these skills', and the goal is held to no words)."""
    if words not in WORD_RULES:
        raise ThorError(f"word rules must be one of {', '.join(WORD_RULES)}, got {words!r}")
    t0 = time.perf_counter()
    reading = read_task(task, world) if task is not None and words != "none" else None
    focus = words in ("all", "grammar")
    spec_schema = specialize(schema if schema is not None else base_plan_schema(), world, skills, max_steps,
                             task if focus else None, reading if focus else None)
    return SpecializedRequest(task, world, skills, reading, spec_schema, time.perf_counter() - t0,
                              words in ("all", "gate"))


def compile_request(gtok: GrammarTokenizer, req: SpecializedRequest, thinking: bool = False) -> PreparedRequest:
    """The specialized schema's grammar, exactly as the planner decodes under it."""
    t0 = time.perf_counter()
    grammar = Grammar(gtok, req.schema, thinking=thinking)
    return PreparedRequest(req.task, req.world, req.skills, req.reading, req.schema, grammar,
                           req.seconds + time.perf_counter() - t0, req.grounding)


def prepare_request(gtok: GrammarTokenizer, world: World, skills: SkillSet, schema: dict | None = None,
                    max_steps: int | None = None, thinking: bool = False, task: str | None = None,
                    words: str = "all") -> PreparedRequest:
    """specialize_request, then compile_request."""
    return compile_request(gtok, specialize_request(task, world, skills, schema, max_steps, words), thinking)


class Planner:
    """speculation: built once by ``build_speculation`` (the CLI's default is ``auto``)."""

    def __init__(self, runtime, tokenizer, speculation: Speculation = PLAIN,
                 max_tokens: int = PlannerSettings.max_tokens, attempts: int = PlannerSettings.attempts,
                 thinking: bool | None = None,
                 max_steps: int | None = None, on_progress=None,
                 grammar_tokenizer: GrammarTokenizer | None = None, complete: bool = True,
                 goal_choice: int = PlannerSettings.goal_choice, words: str = "all", shelf=None):
        if max_tokens < 16:
            raise ThorError(f"max_tokens must be >= 16 for a plan, got {max_tokens}")
        if attempts < 0:
            raise ThorError(f"attempts (repairs) must be >= 0, got {attempts}")
        self.rt, self.tok, self.speculation = runtime, tokenizer, speculation
        self.max_tokens, self.attempts, self.max_steps = max_tokens, attempts, max_steps
        self.progress = on_progress or (lambda msg: None)
        self.complete = bool(complete)
        self.gtok = grammar_tokenizer or GrammarTokenizer(tokenizer)
        # None = think when the tokenizer can; the span is optional in the grammar either way.
        self.thinking = self.gtok.think_ids is not None if thinking is None else bool(thinking)
        if self.thinking and self.gtok.think_ids is None:
            raise ThorError("thinking requested but the tokenizer has no <think> / </think> tokens")
        # Relaxed acceptance may reach into the plan only where no executor reads the wording
        # (free_text.py): asked for with RelaxedConfig.spans (--relaxed-spans).
        self.relaxed_spans = speculation.relaxed is not None and speculation.relaxed.spans
        # goal_choice: alternative goals scored against the greedy one (goal_choice.py); its
        # forwards crop the cache back, which a hybrid target's recurrent state cannot do
        model = getattr(runtime, "model", None)
        self.chooser = (GoalChooser(model, tokenizer, self.gtok, runtime.new_cache, goal_choice,
                                    getattr(runtime, "prefill_chunk", 0), _prefix_restore(runtime))
                        if goal_choice > 0 and model is not None and not model.is_hybrid else None)
        self.words = words           # where the task's word rules act (WORD_RULES; an ablation)
        # world starts on disk (thor_runtime/cache/prefix_shelf.py): fetched before a first attempt,
        # kept after it; the caller flushes them once the plan is out
        self.shelf = shelf
        self._starts: dict[str, tuple[int, ...]] = {}      # system prompt -> the ids every task shares

    def prepare(self, world: World, skills: SkillSet, schema: dict | None = None,
                task: str | None = None) -> PreparedRequest:
        return prepare_request(self.gtok, world, skills, schema, self.max_steps, self.thinking, task, self.words)

    def compile(self, req: SpecializedRequest) -> PreparedRequest:
        """A request specialized before the model was loaded, compiled for this planner's tokenizer."""
        return compile_request(self.gtok, req, self.thinking)

    def plan(self, request: PreparedRequest | str, world: World | None = None, skills: SkillSet | None = None,
             schema: dict | None = None, on_token=None) -> PlanResult:
        """Plan a prepared request (``prepare`` / ``prepare_request``), or a task with its world,
        skills and optional base schema, prepared here. ``on_token(token_id)`` sees every committed
        token of every attempt; an exception it raises (a cancellation) ends the plan with it."""
        task = request.task if isinstance(request, PreparedRequest) else request
        if not isinstance(task, str) or not task.strip():
            raise ThorError("the task is empty")
        t0 = time.perf_counter()
        # a task is prepared here: bad input raises before any generation
        req = request if isinstance(request, PreparedRequest) else self.prepare(world, skills, schema, task)
        world, skills = req.world, req.skills
        params = SamplingParams(max_tokens=self.max_tokens)
        stats: list[Stats] = []
        history = []
        errors, previous, gate, completed = None, None, None, False
        choices: list[dict] = []
        check_s = 0.0              # the gate, the grounding check and the solver, every attempt
        # the plan's trailing free text (its rationale): its wording is never executed, so it
        # may be relaxed, and neither its length nor its words may steer what is
        free = trailing_free_text(req.schema)
        for attempt in range(1 + self.attempts):
            ids = self.tok.encode_chat(build_messages(task, world, skills, errors, previous))
            # a goal that alone shows the task cannot be done ends the plan before its steps
            stop = goal_stop(world, skills, _max_items(req.schema))
            constraint = req.grammar.constraint(stop, free if self.relaxed_spans else ())
            start = (self._world_start(ids, world, skills) if attempt == 0 and self.shelf is not None
                     and self.shelf.usable(self.rt) else ())
            if start:
                self.shelf.fetch(self.rt, start)
            res = self.rt.generate(ids, params, self.speculation, constraint=constraint, on_token=on_token)
            if start:
                self.shelf.keep(self.rt, start)
            stats.append(res.stats)
            if self.chooser is not None:
                res, choice = self._choose(ids, res, req, task, stats, on_token)
                if choice is not None:
                    choices.append(choice.summary())
            t_check = time.perf_counter()
            text = self._json_text(res.token_ids)
            # cut by the budget in its free text, a plan is whole without it
            text, cut_in_free = drop_free_text(text, free) if res.finish_reason == "length" else (text, False)
            plan, unreadable = parse_plan(text)
            done = stop.done_plan(text) if plan is None else None
            if done is not None:
                # ended once its written steps did the goal (goal_stop): those steps, the
                # model's own, are the plan
                plan, text = done, json.dumps(done)
            model_text = text
            if plan is None and stop.ended:
                # not a cut-off or malformed output: the goal's own reasons follow
                unreadable = [Finding(None, "json", "the plan ends at its goal: the goal alone shows the task "
                                                    "cannot be done here")]
            # Cut off by the budget: the goal, written before the steps, may still be whole.
            # (or ended after it: goal_stop)
            stated = stated_goal(text) if plan is None else None
            base = plan if plan is not None else stated
            # The one parse of this attempt's goal (the stop check's, when it read this goal):
            # the gate, the grounding check, the solver and a refusal's reasons all take it (a
            # completed plan keeps the model's goal).
            parsed = stop.parsed_for(base) or parse_goal(base, world, skills)
            gate = _check(task, plan, unreadable, req, parsed)
            if res.finish_reason == "length" and not cut_in_free and not gate.valid:
                gate = GateResult(gate.plan, gate.findings + (Finding(
                    None, "json", f"stopped at the token budget ({self.max_tokens}); write a shorter plan"),))
            if not gate.valid and self.complete and base is not None:
                filled = solve_from_goal(base, world, skills, _max_items(req.schema), parsed)
                again = _check(task, filled, [], req, parsed) if filled is not None else None
                if again is not None and again.valid:   # the model's goal, the solver's steps
                    gate, completed, text = again, True, json.dumps(filled)
            if not gate.valid and stated is not None:   # a refusal names the goal's own reason
                gate = GateResult(gate.plan, gate.findings + tuple(goal_reasons(stated, world, skills, parsed)))
            check_s += time.perf_counter() - t_check
            history.append({"text": text, "report": gate.report(), "finish_reason": res.finish_reason,
                            "completed": completed, "model_text": model_text})
            self.progress(f"attempt {attempt + 1}/{1 + self.attempts}: {res.stats.generated} tokens, "
                          + (("valid (steps completed from the goal)" if completed else "valid") if gate.valid
                             else f"rejected ({len(gate.findings)} problems)"))
            if gate.valid:
                break
            errors, previous = gate.report(), drop_free_text(text, free)[0]
        merged = merge_stats(stats).to_dict()
        # spec: the proposer that ran (auto's choice for the last attempt), not the option
        ran = merged.get("auto_choice") or {"proposer": self.speculation.name, "k_max": self.speculation.k}
        if self.chooser is not None:
            merged.update(goal_choice=choices, goal_changed=sum(c["changed"] for c in choices),
                          goal_choice_s=round(sum(c["seconds"] for c in choices), 6))
        merged.update(attempts=len(stats), spec=ran["proposer"], k=ran["k_max"], completed=completed,
                      grammar_compile_s=round(req.compile_s, 6), time_check_s=round(check_s, 6),
                      plan_latency_s=round(time.perf_counter() - t0, 6))
        goal = parsed[0]
        return PlanResult(gate.plan, gate.valid, gate.report(), merged, len(stats), history[-1]["text"],
                          tuple(history), completed, tuple(stats), tuple(goal.expansion()) if goal else ())

    def _world_start(self, ids: list[int], world: World, skills: SkillSet) -> tuple[int, ...]:
        """The start of ``ids`` that every task's prompt in this world shares (rendered once per
        world)."""
        from thor_runtime.cache import common_prefix

        text = system_prompt(world, skills)
        start = self._starts.get(text)
        if start is None:
            start = tuple(shared_start(self.tok, lambda task: build_messages(task, world, skills)))
            if len(self._starts) >= 8:
                self._starts.clear()
            self._starts[text] = start
        return start[:common_prefix(start, ids)]

    def _choose(self, ids: list[int], res, req: PreparedRequest, task: str, stats: list, on_token):
        """-> (the attempt's result, the Choice or None): the greedy result, or the chosen goal's
        head, with its steps decoded after it when the solver is off (with the solver on, it
        completes them from the goal, as for any plan whose own steps miss its goal)."""
        t0 = time.perf_counter()
        greedy = stated_goal(self._json_text(res.token_ids))
        if greedy is None:
            return res, None                      # no whole goal: nothing to choose among
        world, skills = req.world, req.skills
        if goal_reasons(greedy, world, skills):   # cheap, before any forward: the refusal stands
            return res, Choice(None, [], False, time.perf_counter() - t0, "refused from the goal alone: kept")
        cands = self.chooser.candidates(ids, res.token_ids, req.grammar, self._think_end(res.token_ids))
        if not cands:
            return res, None
        own = parse_plan(self._json_text(res.token_ids))[0]
        choice = self.chooser.choose(cands, lambda c: self._judge(c, req, task, own))
        choice.seconds = time.perf_counter() - t0
        if not choice.changed:
            return res, choice
        head = choice.chosen.ids
        if self.complete:
            return replace(res, token_ids=list(head), text="", finish_reason="stop"), choice
        after = req.grammar.constraint(None, trailing_free_text(req.schema) if self.relaxed_spans else ())
        for t in head:
            after.advance(t)
        more = self.rt.generate(ids + head, SamplingParams(max_tokens=max(16, self.max_tokens - len(head))),
                                self.speculation, constraint=after, on_token=on_token)
        stats.append(more.stats)
        choice.seconds = time.perf_counter() - t0
        whole = replace(res, token_ids=list(head) + list(more.token_ids), text="", finish_reason=more.finish_reason)
        return whole, choice

    def _judge(self, cand: Candidate, req: PreparedRequest, task: str, own: dict | None) -> tuple[int, list | None]:
        """A candidate goal's tier: infeasible from the goal alone, reachable (the solver's steps
        for it, or for the greedy one its own steps, pass the gate and the grounding check), or not."""
        head = stated_goal(self._json_text(cand.ids))
        if head is None:
            return UNREACHED, None
        world, skills = req.world, req.skills
        parsed = parse_goal(head, world, skills)
        if goal_reasons(head, world, skills, parsed):
            return INFEASIBLE, head["goal"]
        if cand.branch is None and own is not None and _check(task, own, [], req, parsed).valid:
            return REACHABLE, head["goal"]
        filled = solve_from_goal(head, world, skills, _max_items(req.schema), parsed)
        ok = filled is not None and _check(task, filled, [], req, parsed).valid
        return (REACHABLE if ok else UNREACHED), head["goal"]

    def _think_end(self, token_ids: list[int]) -> int:
        """Where the JSON starts: after the last </think>, else 0."""
        if self.gtok.think_ids is None or self.gtok.think_ids[1] not in token_ids:
            return 0
        return len(token_ids) - token_ids[::-1].index(self.gtok.think_ids[1])

    def _json_text(self, token_ids: list[int]) -> str:
        """The JSON part of the output: after the thinking span, without the EOS token."""
        ids = [t for t in token_ids if t not in self.gtok.eos_ids]
        if self.gtok.think_ids is not None and self.gtok.think_ids[1] in ids:
            last = len(ids) - 1 - ids[::-1].index(self.gtok.think_ids[1])
            ids = ids[last + 1:]
        return self.tok.decode(ids).strip()


def _check(task: str, plan: dict | None, unreadable: list, req: PreparedRequest, parsed: ParsedGoal) -> GateResult:
    """The gate, then the goal held to the task's words (grounding.py), on the attempt's parsed
    goal and the request's reading. ``unreadable``: why the text gave no plan (gate.parse_plan)."""
    if plan is None:
        return GateResult(None, tuple(unreadable))
    gate = check_plan(plan, req.schema, req.world, req.skills, parsed)
    if req.reading is None or not req.grounding:      # no words to hold the goal to
        return gate
    return GateResult(gate.plan, gate.findings + tuple(
        grounding_findings(task, gate.plan, req.world, req.skills, parsed, req.reading)))


def _prefix_restore(runtime):
    """restore(ids, cache, limit) from the runtime's prefix cache (``thor plan`` and the service
    keep one; the benches by default do not), under the runtime's lock on it; None without one."""
    prefixes = getattr(runtime, "prefixes", None)
    if prefixes is None:
        return None
    lock = getattr(runtime, "_shared", None) or contextlib.nullcontext()

    def restore(ids, cache, limit: int) -> int:
        with lock:
            return prefixes.restore(ids, cache, limit)
    return restore


def _max_items(schema: dict) -> int:
    steps = schema.get("properties", {}).get("steps", {}) if isinstance(schema.get("properties"), dict) else {}
    n = steps.get("maxItems", 10) if isinstance(steps, dict) else 10
    return n if isinstance(n, int) and n > 0 else 10
