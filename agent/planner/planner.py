"""Planner: task + world + skills -> a plan that passed schema and safety gate, or a report.

A plan is up to 1 + ``attempts`` attempts; each runs the same stages, a method each:

- ``decode``: the prompt (with the last attempt's findings when repairing) decoded under the
  request's grammar, speculative or plain, the same cycle; the world's start from the shelf
  first; then, with ``goal_choice``, the goal weighed against the others the grammar allows.
- ``read_goal``: the output's plan, or the goal it wrote before it was cut off or stopped, and
  the one parse of that goal every later stage takes.
- ``check``: schema validation and the safety gate (which runs the plan symbolically against
  its own goal), then the goal held to the task's words.
- ``complete``: when the steps miss the goal, the symbolic solver's steps from it
  (``complete=True``, the default; solver.py), checked the same way.
- ``explain``: a refusal names the goal's own reasons (payload, workspace, a missing thing).
- ``repair``: what the next attempt's prompt carries: the rejected plan and its findings.
  Greedy decoding is deterministic, so a repair only helps because its prompt differs.

The request is prepared once, before any generation (request.py); the attempts and the result
are result.py's types.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace

from agent.files.loader import SkillSet, World
from agent.language.checks import (
    absent,
    grounding,
    missing_names,
    takes_amounts,
    task_findings,
)
from agent.language.lexicon import SHIPPED
from agent.planner.goal_choice import (
    EXPLAIN_NATS,
    GROUND_NATS,
    HINT_NATS,
    INFEASIBLE,
    REACHABLE,
    UNREACHED,
    Candidate,
    Choice,
    GoalChooser,
    end_states,
    goal_openings,
    named_goals,
    ordered_goals,
    rank,
)
from agent.planner.prompt import build_messages, shared_start, system_prompt
from agent.planner.request import (
    PreparedRequest,
    SpecializedRequest,
    compile_request,
    prepare_request,
    specialize_request,
)
from agent.planner.result import Attempt, PlanResult, merge_stats
from agent.schema.free_text import drop_free_text, trailing_free_text
from agent.schema.grammar import GrammarTokenizer
from agent.symbolic.executor import ParsedGoal, parse_goal
from agent.symbolic.gate import Finding, GateResult, check_plan, parse_plan
from agent.symbolic.solver import complete as solve_from_goal
from agent.symbolic.solver import goal_reasons, goal_stop, stated_goal
from thor_runtime.config import PlannerSettings
from thor_runtime.engine import SamplingParams
from thor_runtime.errors import ThorError
from thor_runtime.speculative import PLAIN, Speculation

# the names callers import from here: the request's preparation and the result
__all__ = [
    "Planner",
    "PlanResult",
    "PreparedRequest",
    "SpecializedRequest",
    "compile_request",
    "merge_stats",
    "prepare_request",
    "specialize_request",
]


class Planner:
    """speculation: built once by ``build_speculation`` (the CLI's default is ``auto``).
    goal_choice: 0 keeps the greedy goal; ``thor plan``, the service and the ROS node plan
    through a PlanSession, which passes the config's (PlannerSettings.goal_choice)."""

    def __init__(
        self,
        runtime,
        tokenizer,
        speculation: Speculation = PLAIN,
        max_tokens: int = PlannerSettings.max_tokens,
        attempts: int = PlannerSettings.attempts,
        thinking: bool | None = None,
        max_steps: int | None = None,
        on_progress=None,
        grammar_tokenizer: GrammarTokenizer | None = None,
        complete: bool = True,
        goal_choice: int = 0,
        lexicon: str = SHIPPED,
        shelf=None,
    ):
        if max_tokens < 16:
            raise ThorError(f"max_tokens must be >= 16 for a plan, got {max_tokens}")
        if attempts < 0:
            raise ThorError(f"attempts (repairs) must be >= 0, got {attempts}")
        self.rt, self.tok, self.speculation = runtime, tokenizer, speculation
        self.max_tokens, self.attempts, self.max_steps = max_tokens, attempts, max_steps
        self.progress = on_progress or (lambda msg: None)
        self.solver = bool(complete)  # the complete stage runs the solver
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
        self.chooser = (
            GoalChooser(
                model,
                tokenizer,
                self.gtok,
                getattr(runtime, "new_cache", None),
                goal_choice,
                getattr(runtime, "prefill_chunk", 0),
                _prefix_restore(runtime),
            )
            # a runtime that keeps no cache of its own (a scripted one) has no forwards to weigh
            if goal_choice > 0
            and model is not None
            and hasattr(runtime, "new_cache")
            and not model.is_hybrid
            else None
        )
        # word knowledge the goal choice may use as hints (language/lexicon.py; "none": no words)
        self.lexicon = lexicon
        # world starts on disk (thor_runtime/cache/prefix_shelf.py): fetched before a first
        # attempt, kept after it; the caller flushes them once the plan is out
        self.shelf = shelf
        self._starts: dict[str, tuple[int, ...]] = {}  # system prompt -> the ids all tasks share

    def prepare(
        self, world: World, skills: SkillSet, schema: dict | None = None, task: str | None = None
    ) -> PreparedRequest:
        return prepare_request(
            self.gtok, world, skills, schema, self.max_steps, self.thinking, task, self.lexicon
        )

    def compile(self, req: SpecializedRequest) -> PreparedRequest:
        """A request specialized before the model was loaded, compiled for this planner's
        tokenizer."""
        return compile_request(self.gtok, req, self.thinking)

    def plan(
        self,
        request: PreparedRequest | str,
        world: World | None = None,
        skills: SkillSet | None = None,
        schema: dict | None = None,
        on_token=None,
    ) -> PlanResult:
        """Plan a prepared request (``prepare`` / ``prepare_request``), or a task with its world,
        skills and optional base schema, prepared here. ``on_token(token_id)`` sees every committed
        token of every attempt; an exception it raises (a cancellation) ends the plan with it."""
        task = request.task if isinstance(request, PreparedRequest) else request
        if not isinstance(task, str) or not task.strip():
            raise ThorError("the task is empty")
        t0 = time.perf_counter()
        # a task is prepared here: bad input raises before any generation
        req = (
            request
            if isinstance(request, PreparedRequest)
            else self.prepare(world, skills, schema, task)
        )
        attempts, repair = [], None
        for n in range(1 + self.attempts):
            a = self.decode(req, repair, first=n == 0, on_token=on_token)
            t_check = time.perf_counter()
            self.read_goal(a, req)
            self.check(a, req)
            self.complete(a, req)
            self.explain(a, req)
            a.check_s = time.perf_counter() - t_check
            attempts.append(a)
            self._report(a, n)
            if a.gate.valid:
                break
            repair = self.repair(a, req)
        return self._result(req, attempts, t0)

    # ---- the stages of one attempt ----------------------------------------------------------
    def decode(
        self, req: PreparedRequest, repair: tuple | None = None, first: bool = True, on_token=None
    ) -> Attempt:
        """One attempt's generation: the prompt (carrying ``repair``, the last attempt's findings
        and plan) decoded under the request's grammar, which a goal that alone shows the task
        cannot be done ends before its steps; the first attempt's world start from the shelf.
        With goal_choice, the greedy goal is weighed against the others here."""
        world, skills = req.world, req.skills
        errors, previous = repair if repair is not None else (None, None)
        ids = self.tok.encode_chat(build_messages(req.task, world, skills, errors, previous))
        stop = goal_stop(world, skills, _max_items(req.schema))
        # the plan's trailing free text (its rationale): its wording is never executed, so it
        # may be relaxed, and neither its length nor its words may steer what is
        free = trailing_free_text(req.schema) if self.relaxed_spans else ()
        constraint = req.grammar.constraint(stop, free)
        start = (
            self._world_start(ids, world, skills)
            if first and self.shelf is not None and self.shelf.usable(self.rt)
            else ()
        )
        if start:
            self.shelf.fetch(self.rt, start)
        res = self.rt.generate(
            ids,
            SamplingParams(max_tokens=self.max_tokens),
            self.speculation,
            constraint=constraint,
            on_token=on_token,
        )
        if start:
            self.shelf.keep(self.rt, start)
        a = Attempt(res, stop, [res.stats])
        if self.chooser is not None:
            a.result, choice = self._choose(ids, res, req, req.task, a.generations, on_token)
            a.choice = choice.summary() if choice is not None else None
        return a

    def read_goal(self, a: Attempt, req: PreparedRequest) -> None:
        """The attempt's plan, or, when its text is not a whole plan (cut off by the budget, or
        ended at its goal by the goal check), the goal it wrote before its steps; and the one
        parse of that goal the gate, the grounding check, the solver and a refusal's reasons
        all take (a completed plan keeps the model's goal)."""
        res, stop = a.result, a.stop
        text = self._json_text(res.token_ids)
        # cut by the budget in its free text, a plan is whole without it
        if res.finish_reason == "length":
            text, a.cut_in_free = drop_free_text(text, trailing_free_text(req.schema))
        plan, unreadable = parse_plan(text)
        done = stop.done_plan(text) if plan is None else None
        if done is not None:
            # ended once its written steps did the goal (goal_stop): those steps, the model's
            # own, are the plan
            plan, text = done, json.dumps(done)
        if plan is None and stop.ended:
            # not a cut-off or malformed output: the goal's own reasons follow
            unreadable = [
                Finding(
                    None,
                    "json",
                    "the plan ends at its goal: the goal alone shows the task cannot be done here",
                )
            ]
        a.plan, a.unreadable, a.text, a.model_text = plan, unreadable, text, text
        # cut off by the budget (or ended after it), the goal written before the steps may be whole
        a.stated = stated_goal(text) if plan is None else None
        a.parsed = stop.parsed_for(a.goal) or parse_goal(a.goal, req.world, req.skills)

    def check(self, a: Attempt, req: PreparedRequest) -> None:
        """Schema, gate and the goal held to the task's words (``_check``); an invalid plan the
        budget cut outside its free text is also told to be shorter."""
        a.gate = _check(req.task, a.plan, a.unreadable, req, a.parsed)
        if a.result.finish_reason == "length" and not a.cut_in_free and not a.gate.valid:
            a.gate = GateResult(
                a.gate.plan,
                a.gate.findings
                + (
                    Finding(
                        None,
                        "json",
                        f"stopped at the token budget ({self.max_tokens}); write a shorter plan",
                    ),
                ),
            )

    def complete(self, a: Attempt, req: PreparedRequest) -> None:
        """A rejected attempt with a goal: the solver's steps from the model's goal, taken when
        they pass the same checks (the plan is then the model's goal and the solver's steps)."""
        if a.gate.valid or not self.solver or a.goal is None:
            return
        filled = solve_from_goal(a.goal, req.world, req.skills, _max_items(req.schema), a.parsed)
        again = _check(req.task, filled, [], req, a.parsed) if filled is not None else None
        if again is not None and again.valid:
            a.gate, a.completed, a.text = again, True, json.dumps(filled)

    def explain(self, a: Attempt, req: PreparedRequest) -> None:
        """A refusal of a plan that is not whole names its goal's own reasons."""
        if not a.gate.valid and a.stated is not None:
            a.gate = GateResult(
                a.gate.plan,
                a.gate.findings + tuple(goal_reasons(a.stated, req.world, req.skills, a.parsed)),
            )

    def repair(self, a: Attempt, req: PreparedRequest) -> tuple[list, str]:
        """What the next attempt's prompt carries: the findings, and the rejected plan without
        its free text."""
        return a.gate.report(), drop_free_text(a.text, trailing_free_text(req.schema))[0]

    # ---- after the attempts -----------------------------------------------------------------
    def _report(self, a: Attempt, n: int) -> None:
        self.progress(
            f"attempt {n + 1}/{1 + self.attempts}: {a.result.stats.generated} tokens, "
            + (
                ("valid (steps completed from the goal)" if a.completed else "valid")
                if a.gate.valid
                else f"rejected ({len(a.gate.findings)} problems)"
            )
        )

    def _result(self, req: PreparedRequest, attempts: list[Attempt], t0: float) -> PlanResult:
        """The last attempt's plan and verdict, with every generation's stats summed."""
        stats = [g for a in attempts for g in a.generations]
        last = attempts[-1]
        merged = merge_stats(stats).to_dict()
        # spec: the proposer that ran (auto's choice for the last attempt), not the option
        ran = merged.get("auto_choice") or {
            "proposer": self.speculation.name,
            "k_max": self.speculation.k,
        }
        if self.chooser is not None:
            choices = [a.choice for a in attempts if a.choice is not None]
            merged.update(
                goal_choice=choices,
                goal_changed=sum(c["changed"] for c in choices),
                goal_choice_s=round(sum(c["seconds"] for c in choices), 6),
            )
        check_s = 0.0  # the gate, the grounding check and the solver, every attempt
        for a in attempts:
            check_s += a.check_s
        merged.update(
            attempts=len(stats),
            spec=ran["proposer"],
            k=ran["k_max"],
            completed=last.completed,
            grammar_compile_s=round(req.compile_s, 6),
            time_check_s=round(check_s, 6),
            plan_latency_s=round(time.perf_counter() - t0, 6),
        )
        goal = last.parsed[0]
        return PlanResult(
            last.gate.plan,
            last.gate.valid,
            last.gate.report(),
            merged,
            len(stats),
            last.text,
            tuple(a.record() for a in attempts),
            last.completed,
            tuple(stats),
            tuple(goal.expansion()) if goal else (),
        )

    # ---- the world's start, the goal choice, the output's JSON -----------------------------
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
        return start[: common_prefix(start, ids)]

    def _choose(self, ids: list[int], res, req: PreparedRequest, task: str, stats: list, on_token):
        """-> (the attempt's result, the Choice or None): the greedy result, or the chosen goal's
        head, with its steps decoded after it when the solver is off (with the solver on, it
        completes them from the goal, as for any plan whose own steps miss its goal)."""
        t0 = time.perf_counter()
        greedy = stated_goal(self._json_text(res.token_ids))
        if greedy is None:
            return res, None  # no whole goal: nothing to choose among
        world, skills = req.world, req.skills
        said = req.reading
        # a refusal stands without a forward where the model says the thing is not here (the
        # task checks hold that to the task's words), or where the task names nothing to weigh
        # another goal against; one for payload or reach is weighed against goals that can be
        # done (a small model may read "camera" as the 95 kg camera pedestal)
        missing = bool(missing_names(greedy.get("goal")))
        if goal_reasons(greedy, world, skills) and (
            missing or said is None or not (said.named or said.typed)
        ):
            return res, Choice(
                None, [], False, time.perf_counter() - t0, "refused from the goal alone: kept"
            )
        start = self._think_end(res.token_ids)
        unnamed = said.unnamed() if said is not None else []
        cands = self.chooser.candidates(
            ids, res.token_ids, req.grammar, start, self._forms(req), unnamed=unnamed
        )
        if not cands:
            return res, None
        neutral = self._neutral_ids(req, res.token_ids[start : cands[0].start])
        self.chooser.priors(neutral, cands, req.grammar)
        own = parse_plan(self._json_text(res.token_ids))[0]
        hints = said.hints if said is not None else {}

        def ground(c: Candidate) -> tuple[int, int]:
            if said is None:
                return 0, 0
            if _lacks(c.goal):  # about each thing it says the task names and the world lacks
                return len(c.goal), len(c.goal)
            return grounding(said, c.goal, world, skills)

        def score(c: Candidate) -> float:
            # the numbers the task says that the goal's calls take, and the things it names
            # that the goal is about, rank it as a lexicon's hint does, in any language
            if said is None:
                return rank(c, hints) + EXPLAIN_NATS * c.explained
            taken = takes_amounts(said, c.goal, world, skills)
            return (
                rank(c, hints)
                + HINT_NATS * taken
                + GROUND_NATS * ground(c)[0]
                + EXPLAIN_NATS * c.explained
            )

        judged: dict[int, tuple[int, list | None]] = {}

        def judge(c: Candidate) -> tuple[int, list | None]:
            if id(c) not in judged:
                judged[id(c)] = self._judge(c, req, task, own)
            return judged[id(c)]

        def judge_all(cs: list[Candidate]) -> None:
            for c in cs:
                c.tier, c.goal = judge(c)

        if said is not None:
            # the one-line goals, ranked, put in the order the task names their things (one a
            # task check holds back may still be a step of the order: "wait ten seconds, then
            # check the map" is neither alone)
            judge_all(cands)
            options = [c for c in cands if c.tier != INFEASIBLE]
            more = ordered_goals(said, options, score, world, skills)
            if more:
                extra = self.chooser.candidates(
                    ids, res.token_ids, req.grammar, start, more, branch=False
                )[1:]
                self.chooser.priors(neutral, extra, req.grammar)
                cands += extra
        # a call whose whole effect is an end state is that end state, said the way a goal says
        # it ("pick up the phone": the phone held, not a pick after which the hand is emptied)
        judge_all(cands)
        stated = {repr(c.goal) for c in cands if c.tier == REACHABLE}
        for c in cands:
            plain = end_states(c.goal, skills) if c.tier == REACHABLE else None
            if plain is not None and repr(plain) in stated:
                judged[id(c)] = (UNREACHED, c.goal)
        grounded = said is not None and bool(said.named or said.typed)

        def order(c: Candidate) -> tuple:
            # the choice's own order: about the task first (where it names things), then rank
            return (ground(c)[1] > 0, ground(c)[0], score(c)) if grounded else (score(c),)

        # goals saying a thing the task names is missing, in its own words (``_judge`` tiers one
        # naming a thing the world has, or words the task does not say, as not reached)
        lacking = [c for c in cands if c.tier == INFEASIBLE and _lacks(c.goal)]
        self.chooser.explain(task, world, cands, order, lacking)
        choice = self.chooser.choose(cands, judge, score, ground if grounded else None, lacking)
        choice.seconds = time.perf_counter() - t0
        if not choice.changed:
            return res, choice
        head = choice.chosen.ids
        if self.solver:
            return replace(res, token_ids=list(head), text="", finish_reason="stop"), choice
        after = req.grammar.constraint(
            None, trailing_free_text(req.schema) if self.relaxed_spans else ()
        )
        for t in head:
            after.advance(t)
        more = self.rt.generate(
            ids + head,
            SamplingParams(max_tokens=max(16, self.max_tokens - len(head))),
            self.speculation,
            constraint=after,
            on_token=on_token,
        )
        stats.append(more.stats)
        choice.seconds = time.perf_counter() - t0
        whole = replace(
            res,
            token_ids=list(head) + list(more.token_ids),
            text="",
            finish_reason=more.finish_reason,
        )
        return whole, choice

    @staticmethod
    def _forms(req: PreparedRequest) -> tuple[str, ...]:
        """The goals weighed beside the greedy one's branches: one opening per form the skills
        allow, and whole goals over the things the task names (first named first)."""
        world, said = req.world, req.reading
        if said is None:
            return goal_openings(req.skills)
        order = sorted(said.named, key=said.named.get)
        objects = tuple(n for n in order if world.object(n) is not None)
        places = tuple(n for n in order if world.place(n) is not None)
        types = tuple(
            dict.fromkeys(world.object(n).type for n in sorted(said.typed, key=said.typed.get))
        )
        return goal_openings(req.skills, objects) + named_goals(req.skills, objects, places, types)

    def _neutral_ids(self, req: PreparedRequest, head: list[int]) -> list[int]:
        """The request with no task, up to where its goal opens: the prompt with an empty task,
        and the plan's head (``head``: the JSON before the goal) with its task's copy emptied."""
        text = self.tok.decode(head)
        key = '"task":"'
        at = text.find(key)
        if at >= 0:
            end, i = None, at + len(key)
            while i < len(text):
                if text[i] == "\\":
                    i += 2
                    continue
                if text[i] == '"':
                    end = i
                    break
                i += 1
            if end is not None:
                text = text[: at + len(key)] + text[end:]
        ids = self.tok.encode_chat(build_messages("", req.world, req.skills))
        return ids + self.tok.encode(text, add_special=False)

    def _judge(
        self, cand: Candidate, req: PreparedRequest, task: str, own: dict | None
    ) -> tuple[int, list | None]:
        """A candidate goal's tier: infeasible from the goal alone, reachable (the solver's steps
        for it, or for the greedy one its own steps, pass the gate and the grounding check), or
        not. Another than the greedy goal is a refusal only for what the world sets against the
        task (a payload, the reach): one that holds a fixed thing or names what is not here is a
        goal the model was made to write, not a reading of the task."""
        head = stated_goal(self._json_text(cand.ids))
        if head is None:
            return UNREACHED, None
        world, skills = req.world, req.skills
        parsed = parse_goal(head, world, skills)
        reasons = goal_reasons(head, world, skills, parsed)
        if reasons:
            missing = missing_names(head["goal"])
            said = req.reading
            refusal = (
                cand.branch is None
                or {f.check for f in reasons} <= _WORLD_LIMITS
                or bool(missing)
                and said is not None
                and all(absent(said, m, world) for m in missing)
            )
            return (INFEASIBLE if refusal else UNREACHED), head["goal"]
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
            ids = ids[last + 1 :]
        return self.tok.decode(ids).strip()


def _lacks(goal) -> bool:
    """Whether a goal says only that things are missing."""
    return bool(goal) and len(missing_names(goal)) == len(goal)


# the findings a goal other than the greedy one may be refused for (``_judge``)
_WORLD_LIMITS = frozenset({"payload", "workspace"})


def _check(
    task: str, plan: dict | None, unreadable: list, req: PreparedRequest, parsed: ParsedGoal
) -> GateResult:
    """The gate, then the goal held to the things and amounts the task names (checks.py), on
    the attempt's parsed goal and the request's reading. ``unreadable``: why the text gave no plan
    (gate.parse_plan)."""
    if plan is None:
        return GateResult(None, tuple(unreadable))
    gate = check_plan(plan, req.schema, req.world, req.skills, parsed)
    if req.reading is None:  # no task to hold the goal to
        return gate
    return GateResult(
        gate.plan,
        gate.findings + tuple(task_findings(req.reading, gate.plan, req.world, req.skills, parsed)),
    )


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
    props = schema.get("properties")
    steps = props.get("steps", {}) if isinstance(props, dict) else {}
    n = steps.get("maxItems", 10) if isinstance(steps, dict) else 10
    return n if isinstance(n, int) and n > 0 else 10
