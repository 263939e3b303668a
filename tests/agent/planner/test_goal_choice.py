"""Choosing the plan's goal among the grammar's candidates (agent/planner/goal_choice.py): scores
are the grammar-masked log-likelihood of each goal's tokens, branches share the prompt's cache, and
the choice never turns a refusal into a plan or a reachable goal into one that is not."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from agent.files.loader import base_plan_schema
from agent.planner.goal_choice import (
    EXPLAIN_NATS,
    EXPLAIN_POOL,
    INFEASIBLE,
    MISSING_STARTS,
    REACHABLE,
    UNREACHED,
    Candidate,
    GoalChooser,
    head_span,
)
from agent.planner.planner import Planner, specialize_request
from agent.planner.prompt import explain_messages
from agent.schema.grammar import Grammar, GrammarTokenizer
from agent.schema.specialize import specialize
from agent.symbolic.solver import stated_goal
from tests.helpers.runtimes import ScriptedRuntime
from tests.helpers.worlds import good_plan, world_and_skills
from thor_runtime.cache import common_prefix
from thor_runtime.errors import ThorError

TASK = "put the apple on the table"


def _compact(plan) -> str:
    return json.dumps(plan, separators=(",", ":"))


def _setup(model):
    tok = model.tokenizer
    gtok = GrammarTokenizer(tok)
    w, s = world_and_skills("kitchen")
    grammar = Grammar(gtok, specialize(base_plan_schema(), w, s))
    # a short prompt: the tiny model's context is shorter than the planner's prompt
    prompt = tok.encode("Plan: " + TASK, add_special=False)
    return tok, gtok, w, s, grammar, prompt


def _reference_logprob(model, gtok, grammar, prompt, ids, g) -> float:
    """The masked log-likelihood of ids[g:], recomputed from scratch: one fresh cache, one
    forward over the prompt and all of ids, a fresh grammar walk row by row."""
    cache = model.model.new_cache(len(prompt) + len(ids) + 1)
    logits = model.model.forward(
        torch.tensor(prompt + ids[:-1]), cache, logits_rows="all"
    ).logits  # [P+n-1, V]
    c = grammar.constraint()
    total = 0.0
    for i, t in enumerate(ids):
        if i >= g:
            row = c.mask_rows(logits[len(prompt) + i - 1 : len(prompt) + i].float(), [])
            total += float(torch.log_softmax(row, -1)[0, t])
        c.advance(t)
    return total


def test_head_span_finds_the_goal_and_where_the_steps_open(tiny_llama):
    tok, gtok, *_ = _setup(tiny_llama)
    ids = tok.encode(_compact(good_plan()), add_special=False)
    g, h = head_span(gtok.token_bytes, ids)
    head = tok.decode(ids[:h])
    assert head.endswith('"steps":[') and '"steps":[' not in tok.decode(ids[: h - 1])
    assert '"goal":[' in tok.decode(ids[: g + 1]) and '"goal":[' not in tok.decode(ids[: g - 1])
    assert head_span(gtok.token_bytes, ids[: h - 1]) is None  # the steps never open


def test_every_candidate_is_scored_by_its_own_masked_likelihood(tiny_llama):
    tok, gtok, w, s, grammar, prompt = _setup(tiny_llama)
    ids = tok.encode(_compact(good_plan()), add_special=False)
    chooser = GoalChooser(tiny_llama.model, tok, gtok, tiny_llama.model.new_cache, branches=4)
    cands = chooser.candidates(prompt, ids, grammar)
    g, h = head_span(gtok.token_bytes, ids)
    assert cands[0].branch is None and cands[0].ids == ids[:h] and cands[0].tokens == h - g
    assert len(cands) >= 3
    greedy_text = tok.decode(cands[0].ids)
    for c in cands:
        # each candidate is a whole head under the grammar, whose goal parses
        text = tok.decode(c.ids)
        assert text.endswith('"steps":[') and isinstance(stated_goal(text)["goal"], list)
        if c.branch is not None:
            # it follows the greedy head up to its branch point, then takes another token
            assert (
                c.ids[: c.branch] == ids[: c.branch]
                and c.ids[c.branch] != ids[c.branch]
                and g <= c.branch < h
            )
            assert text != greedy_text
        # the branch's score (shared cache, cropped back) is the one a fresh forward gives
        ref = _reference_logprob(tiny_llama, gtok, grammar, prompt, c.ids, g)
        assert c.logprob == pytest.approx(ref, abs=2e-3), (text, c.logprob, ref)
        assert c.tokens == len(c.ids) - g


def _cand(goal, logprob, branch):
    return Candidate([], logprob, 1, branch, goal=None), goal


def _choose(pairs, tiers, ground=None):
    chooser = GoalChooser(None, None, None, None, branches=2)
    cands = []
    for (c, goal), tier in zip(pairs, tiers):
        c.goal_for_test = (tier, goal)
        cands.append(c)
    return chooser.choose(cands, lambda c: c.goal_for_test, ground=ground)


def test_an_infeasible_goal_about_more_of_what_the_task_names_is_its_refusal():
    heavy, light, other = (
        [{"object": "anvil", "at": "shelf"}],
        [{"object": "anvil", "near": "shelf"}],
        [{"object": "cup", "at": "shelf"}],
    )
    named = {"anvil", "shelf"}

    def ground(c):
        said = len(named & {v for d in c.goal for v in d.values()})
        return said, said

    # "put the anvil on the shelf": the only goal about both is too heavy; it is the refusal
    ch = _choose([_cand(other, -1.0, None), _cand(heavy, -4.0, 3)], [REACHABLE, INFEASIBLE], ground)
    assert ch.changed and ch.chosen.goal == heavy and "infeasible" in ch.note
    # a reachable goal about as much of the task stands
    ch = _choose([_cand(light, -1.0, None), _cand(heavy, -4.0, 3)], [REACHABLE, INFEASIBLE], ground)
    assert not ch.changed and ch.chosen.goal == light


def test_a_thing_the_task_names_and_the_world_lacks_is_refused_where_it_ranks_above():
    put, heavy = [{"object": "cup", "at": "shelf"}], [{"object": "anvil", "at": "shelf"}]
    lacks = [{"missing": "milk jug"}]
    named = {"cup", "shelf"}

    def ground(c):
        if "missing" in c.goal[0]:
            return 1, 1
        said = len(named & {v for d in c.goal for v in d.values()})
        return said, said

    def choose(pairs, tiers, scores, ground=ground):
        chooser = GoalChooser(None, None, None, None, branches=2)
        cands = []
        for (c, goal), tier in zip(pairs, tiers):
            c.goal_for_test = (tier, goal)
            cands.append(c)
        lacking = [c for c in cands if "missing" in c.goal_for_test[1][0]]
        return chooser.choose(
            cands, lambda c: c.goal_for_test, lambda c: scores[id(c)], ground, lacking
        )

    # "put the milk jug next to the cup": the refusal is about as much of the task as the
    # reachable goal about the cup, ranks above it, and the task reads back better from it
    g, m = _cand(put, -1.0, None), _cand(lacks, -9.0, 5)
    m[0].explained = 2.0
    ch = choose([g, m], [REACHABLE, INFEASIBLE], {id(g[0]): 2.0, id(m[0]): 6.0}, lambda c: (1, 1))
    assert ch.changed and ch.chosen.goal == lacks and "lacks" in ch.note
    # read back worse than a reachable goal (or not read back), it is only a mention
    for read_back in (-2.0, 0.0):
        g, m = _cand(put, -1.0, None), _cand(lacks, -9.0, 5)
        m[0].explained = read_back
        ch = choose(
            [g, m], [REACHABLE, INFEASIBLE], {id(g[0]): 2.0, id(m[0]): 6.0}, lambda c: (1, 1)
        )
        assert not ch.changed and ch.chosen.goal == put
    # ranked below it, or less about the task than it, the reachable goal stands
    g, m = _cand(put, -1.0, None), _cand(lacks, -9.0, 5)
    ch = choose([g, m], [REACHABLE, INFEASIBLE], {id(g[0]): 7.0, id(m[0]): 6.0}, lambda c: (1, 1))
    assert not ch.changed and ch.chosen.goal == put
    g, m = _cand(put, -1.0, None), _cand(lacks, -9.0, 5)
    ch = choose([g, m], [REACHABLE, INFEASIBLE], {id(g[0]): 2.0, id(m[0]): 6.0})
    assert not ch.changed and ch.chosen.goal == put  # about the cup and the shelf: 2 > 1
    # with no goal in reach, a goal out of reach about more of the task is the refusal, and a
    # greedy refusal of its own stands
    g, m, h = _cand(put, -1.0, None), _cand(lacks, -9.0, 5), _cand(heavy, -3.0, 4)
    scores = {id(g[0]): 2.0, id(m[0]): 6.0, id(h[0]): 1.0}
    ch = choose(
        [g, m, h], [UNREACHED, INFEASIBLE, INFEASIBLE], scores, lambda c: (1 + (c is h[0]), 1)
    )
    assert ch.changed and ch.chosen.goal == heavy
    g, m = _cand(heavy, -1.0, None), _cand(lacks, -9.0, 5)
    ch = choose([g, m], [INFEASIBLE, INFEASIBLE], {id(g[0]): 2.0, id(m[0]): 6.0})
    assert not ch.changed and ch.chosen.goal == heavy


def test_missing_goals_are_written_in_the_tasks_own_words(tiny_llama):
    """``_lacking``: goals saying a run of the task's words that names nothing of the world is
    missing, scored as forms are, and only such runs."""
    from agent.language.mentions import read_words

    tok, model = tiny_llama.tokenizer, tiny_llama.model
    w, s = world_and_skills("kitchen")
    task = "bring the teapot over to the table"
    said = read_words(task, w)
    runs = said.unnamed()
    assert runs and all("table" not in text for _, text in runs)
    assert (2, "teapot") in runs and (2, "teapot over") in runs
    tok, gtok, w, s, grammar, _ = _setup(tiny_llama)
    prompt = tok.encode("Plan: " + task, add_special=False)  # short: the tiny model's context
    head = _compact({**_head([{"object": "apple", "at": "table"}]), "task": task})[:-1]
    gen = tok.encode(head + ',"steps":[', add_special=False)
    chooser = GoalChooser(model, tok, gtok, model.new_cache, branches=0)
    cands = chooser.candidates(prompt, gen, grammar, unnamed=runs)

    def goal_of(c):
        text = tok.decode(c.ids)
        return json.loads(text[text.index('"goal":') + 7 : text.index(',"steps":[')])

    lacking = [(goal_of(c), c) for c in cands[1:] if "missing" in tok.decode(c.ids[c.start :])]
    said_runs = {text for _, text in runs}
    assert lacking and all(len(g) == 1 and g[0]["missing"] in said_runs for g, _ in lacking)
    # every run from the likeliest starts, one goal each, each scored
    # every run from at most MISSING_STARTS of the task's words, and nothing else
    texts = {g[0]["missing"] for g, _ in lacking}
    starts = sorted({at for at, _ in runs})
    assert any(
        texts == {text for at, text in runs if at in pick}
        for n in range(1, MISSING_STARTS + 1)
        for pick in itertools.combinations(starts, n)
    )
    assert all(math.isfinite(c.logprob) and c.logprob < 0 for _, c in lacking)


def test_the_choice_ranks_reachable_goals_first_and_keeps_a_refusal():
    a, b, c = (
        [{"object": "apple", "at": "table"}],
        [{"object": "apple", "at": "sink"}],
        [{"missing": "toaster"}],
    )
    # a likelier reachable goal replaces a reachable greedy one; a less likely one does not
    ch = _choose([_cand(a, -3.0, None), _cand(b, -1.0, 7)], [REACHABLE, REACHABLE])
    assert ch.changed and ch.chosen.goal == b
    ch = _choose([_cand(a, -1.0, None), _cand(b, -3.0, 7)], [REACHABLE, REACHABLE])
    assert not ch.changed and ch.chosen.goal == a
    # a greedy goal that is not reached gives way to a reachable one, however unlikely
    ch = _choose([_cand(a, -1.0, None), _cand(b, -30.0, 7)], [UNREACHED, REACHABLE])
    assert ch.changed and ch.chosen.goal == b
    # never to a goal that is not reachable, likelier or not
    ch = _choose(
        [_cand(a, -3.0, None), _cand(c, -0.1, 7), _cand(b, -0.2, 9)],
        [REACHABLE, INFEASIBLE, UNREACHED],
    )
    assert not ch.changed and ch.chosen.goal == a
    # a greedy goal infeasible from the goal alone is the task's refusal: kept
    ch = _choose([_cand(c, -5.0, None), _cand(a, -0.1, 7)], [INFEASIBLE, REACHABLE])
    assert not ch.changed and ch.chosen.goal == c and "refused" in ch.note


def _head(goal) -> list:
    return {"plan_id": "p1", "task": TASK, "goal": goal}


class _Runtime(ScriptedRuntime):
    def __init__(self, tok, texts, model):
        super().__init__(tok, texts, model)
        self.new_cache = model.new_cache


@pytest.mark.parametrize("solver", [True, False])
def test_a_likelier_reachable_goal_replaces_the_greedy_one(tiny_llama, monkeypatch, solver):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    greedy_text = _compact({**good_plan(), "task": "move the apple"})
    other = [{"object": "apple", "at": "sink"}]  # "move the apple": any place
    other_head = _compact({**_head(other), "task": "move the apple"})[:-1] + ',"steps":['
    steps = _compact(
        {
            "s": [
                {
                    "id": "s1",
                    "skill": "pick",
                    "args": {"object": "apple", "grasp": "side", "force": 10},
                    "preconditions": [],
                    "expected_effects": [],
                    "timeout_s": 10,
                    "on_failure": "abort",
                },
                {
                    "id": "s2",
                    "skill": "place",
                    "args": {"object": "apple", "target": "sink"},
                    "preconditions": [],
                    "expected_effects": [],
                    "timeout_s": 10,
                    "on_failure": "abort",
                },
            ]
        }
    )[6:]
    rt = _Runtime(tok, [greedy_text, steps], tiny_llama.model)
    pl = Planner(rt, tok, attempts=0, thinking=False, complete=solver, goal_choice=2)

    def candidates(prompt_ids, gen_ids, grammar, start=0, forms=(), unnamed=()):
        g, h = head_span(pl.gtok.token_bytes, gen_ids)
        alt = tok.encode(other_head, add_special=False)
        return [Candidate(list(gen_ids[:h]), -4.0, h - g, None), Candidate(alt, -1.0, 9, 12)]

    monkeypatch.setattr(pl.chooser, "candidates", candidates)
    monkeypatch.setattr(pl.chooser, "priors", lambda *a, **k: None)
    res = pl.plan("move the apple", w, s)
    assert res.valid and res.plan["goal"] == other
    assert res.stats["goal_changed"] == 1 and res.stats["goal_choice"][0]["changed"]
    assert [c["tier"] for c in res.stats["goal_choice"][0]["candidates"]] == [
        "reachable",
        "reachable",
    ]
    if solver:  # the solver's steps for the chosen goal; nothing more decoded
        assert res.completed and len(rt.prompts) == 1
    else:  # the model's steps, decoded after the chosen goal's head
        assert not res.completed and len(rt.prompts) == 2 and rt.prompts[1].endswith(other_head)
        assert [st["args"]["object"] for st in res.plan["steps"]] == ["apple", "apple"]


def test_a_refusal_is_weighed_against_goals_about_as_much_of_the_task(tiny_llama, monkeypatch):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    task = "put the cast iron pan on the table"
    heavy = {**good_plan(), "task": task, "goal": [{"object": "cast_iron_pan", "at": "table"}]}
    rt = _Runtime(tok, [_compact(heavy)], tiny_llama.model)
    pl = Planner(rt, tok, attempts=0, thinking=False, goal_choice=4)
    # the only goal that can be done is about the table alone (and an apple the task does not
    # name): the pan on the table, too heavy, is what the task asks, and its refusal stands
    apple = _compact({**_head([{"object": "apple", "at": "table"}]), "task": task})[:-1]

    def candidates(prompt_ids, gen_ids, grammar, start=0, forms=(), unnamed=()):
        assert any(f.startswith('{"object":"cast_iron_pan"') for f in forms)
        g, h = head_span(pl.gtok.token_bytes, gen_ids)
        alt = tok.encode(apple + ',"steps":[', add_special=False)
        return [Candidate(list(gen_ids[:h]), -9.0, h - g, None), Candidate(alt, -1.0, 9, 12)]

    monkeypatch.setattr(pl.chooser, "candidates", candidates)
    monkeypatch.setattr(pl.chooser, "priors", lambda *a, **k: None)
    res = pl.plan(task, w, s)
    assert not res.valid and "payload" in {f["check"] for f in res.report}
    assert res.stats["goal_changed"] == 0 and "refused" in res.stats["goal_choice"][0]["note"]


def test_a_missing_thing_is_refused_with_no_forward(tiny_llama, monkeypatch):
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    task = "put the toaster on the table"
    gone = {**good_plan(), "task": task, "goal": [{"missing": "toaster"}]}
    rt = _Runtime(tok, [_compact(gone)], tiny_llama.model)
    pl = Planner(rt, tok, attempts=0, thinking=False, goal_choice=4)
    monkeypatch.setattr(
        pl.chooser, "candidates", lambda *a, **k: pytest.fail("no candidates for a refusal")
    )
    res = pl.plan(task, w, s)
    assert not res.valid and res.stats["goal_changed"] == 0
    assert "refused" in res.stats["goal_choice"][0]["note"]


def test_on_by_default_with_one_grammar_for_every_task_and_every_lexicon(tiny_llama):
    from thor_runtime.config import PlannerSettings

    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    assert PlannerSettings.goal_choice > 0 and PlannerSettings.lexicon == "shipped"
    assert Planner(_Runtime(tok, [], tiny_llama.model), tok, goal_choice=0).chooser is None
    # the goal grammar is the world's and the skills', whatever the task and the lexicon: the
    # model says which form the task asks for
    one, other = specialize_request(TASK, w, s), specialize_request("bring me the red cup", w, s)
    none = specialize_request(TASK, w, s, lexicon="none")
    assert one.schema == other.schema == none.schema == specialize(base_plan_schema(), w, s)
    assert not any(none.reading.hints.values())
    with pytest.raises(ThorError, match="lexicon file not found"):
        specialize_request(TASK, w, s, lexicon="no-such-lexicon.json")
    cup = _compact(
        {
            **good_plan(),
            "goal": [{"object": "red_cup", "at": "table"}],
            "steps": [
                {
                    "id": "s1",
                    "skill": "pick",
                    "args": {"object": "red_cup", "grasp": "side", "force": 10},
                    "preconditions": [],
                    "expected_effects": [],
                    "timeout_s": 10,
                    "on_failure": "abort",
                },
                {
                    "id": "s2",
                    "skill": "place",
                    "args": {"object": "red_cup", "target": "table"},
                    "preconditions": [],
                    "expected_effects": [],
                    "timeout_s": 10,
                    "on_failure": "abort",
                },
            ],
        }
    )

    def plan(lexicon):
        return Planner(
            ScriptedRuntime(tok, [cup]),
            tok,
            attempts=0,
            thinking=False,
            complete=False,
            lexicon=lexicon,
        ).plan(TASK, w, s)

    # with no lexicon too, a goal about a thing the task does not name is held to the task
    for lexicon in ("shipped", "none"):
        res = plan(lexicon)
        assert not res.valid and {f["check"] for f in res.report} & {"object", "goal"}, lexicon


def test_forms_open_goals_of_every_kind_and_rank_by_what_the_task_adds(tiny_llama):
    """Each form the skills allow opens a candidate goal (a call of each skill that puts nothing
    anywhere, an order, a set), completed under the grammar and scored; a goal's prior is its
    score with no task, and a lexicon's hints add to the rank of the goals that take them up."""
    from agent.planner.goal_choice import HINT_NATS, goal_openings, hinted, rank

    tok, model = tiny_llama.tokenizer, tiny_llama.model
    w, s = world_and_skills("kitchen")
    forms = goal_openings(s)
    assert (
        '{"do":"inspect"' in forms
        and '{"do":"pick"' not in forms
        and forms[-2:] == ('{"before":[', '{"every":')
    )
    gtok = GrammarTokenizer(tok)
    req = specialize_request(TASK, w, s)
    grammar = Grammar(gtok, req.schema)
    head = tok.encode(_compact(good_plan())[:-1], add_special=False)
    prompt = tok.encode("Task: " + TASK, add_special=False)
    chooser = GoalChooser(model, tok, gtok, model.new_cache, 1)
    cands = chooser.candidates(prompt, head, grammar, forms=forms)
    opened = cands[2:]
    texts = [tok.decode(c.ids[c.start :]) for c in opened]
    assert any(t.lstrip("[").startswith('{"do":"inspect"') for t in texts), texts
    assert all(c.tokens > 0 and c.logprob < 0 for c in cands)
    chooser.priors(tok.encode("Task: ", add_special=False), cands, grammar)
    assert all(c.prior < 0 for c in cands)
    cands[0].goal = [
        {
            "before": [
                {"do": "inspect", "args": {"object": "apple"}},
                {"object": "apple", "at": "table"},
            ]
        }
    ]
    hints = {
        "forms": frozenset({"before"}),
        "skills": frozenset({"inspect"}),
        "states": frozenset(),
    }
    assert hinted(cands[0].goal, hints) == 2 and hinted(cands[0].goal, {}) == 0
    assert rank(cands[0], hints) == cands[0].logprob - cands[0].prior + 2 * HINT_NATS


def test_whole_goals_over_the_named_things_and_their_order():
    from agent.language.mentions import read_words
    from agent.planner.goal_choice import named_goals, ordered_goals

    w, s = world_and_skills("kitchen")
    forms = named_goals(s, ("apple",), ("table", "sink"), ("cup",))
    for want in (
        '{"object":"apple","at":"table"}]',
        '{"holding":"apple"}]',
        '{"object":"apple","is":"inspected"}]',
        '{"do":"inspect","args":{"object":"apple"}}]',
        '{"every":{"type":"cup"},"at":"sink"}]',
        '{"every":{"at":"table"},"at":"sink"}]',
    ):
        assert want in forms
    # no words of the task order anything: where it names each thing does ("Apfel" is an alias
    # the test adds), and a goal already true before any step (the apple on the counter it
    # lies on) is no step of an order
    task = "den Apfel zuerst ansehen und dann auf den Tisch, 5 s warten"
    world = w.__class__(
        **{
            **w.__dict__,
            "objects": tuple(
                o.__class__(**{**o.__dict__, "aliases": ("Apfel",)}) if o.name == "apple" else o
                for o in w.objects
            ),
            "places": tuple(
                p.__class__(**{**p.__dict__, "aliases": ("Tisch",)}) if p.name == "table" else p
                for p in w.places
            ),
        }
    )
    said = read_words(task, world)
    one = [
        ({"object": "apple", "is": "inspected"}, -1.0),
        ({"object": "apple", "at": "table"}, -2.0),
        ({"object": "apple", "at": "counter"}, 0.0),
    ]
    cands = []
    for goal, sc in one:
        c = Candidate([], sc, 1, 3, goal=[goal])
        cands.append(c)
    out = ordered_goals(said, cands, lambda c: c.logprob, world, s)
    first = json.loads("[" + out[0])
    assert first[0]["before"][0] == {"object": "apple", "is": "inspected"}
    assert {"object": "apple", "at": "counter"} not in first[0]["before"]
    assert any(
        {"do": "wait", "args": {"duration": 5}} in json.loads("[" + o)[0]["before"] for o in out
    )


def test_a_call_whose_whole_effect_is_an_end_state_is_that_end_state():
    from agent.planner.goal_choice import end_states

    _, s = world_and_skills("kitchen")
    pick = {"do": "pick", "args": {"object": "apple"}}
    assert end_states([pick], s) == [{"holding": "apple"}]
    place = {"do": "place", "args": {"object": "apple", "target": "sink"}}
    assert end_states([place, {"object": "plate", "is": "inspected"}], s) == [
        {"object": "apple", "at": "sink"},
        {"object": "plate", "is": "inspected"},
    ]
    # a call that says more than where things end, or is asked more than once, stays a call
    assert end_states([{**pick, "args": {"object": "apple", "force": 5}}], s) is None
    assert end_states([{**pick, "times": 2}], s) is None
    assert end_states([{"do": "inspect", "args": {"object": "apple"}}], s) is None
    assert end_states([{"object": "apple", "at": "sink"}], s) is None


def _explained_reference(model, task, goal, world) -> float:
    """log P(task's words and the turn's end | the explain prompt), from one fresh forward over
    the whole chat."""
    tok = model.tokenizer
    msgs = explain_messages(goal, world)
    head = tok.encode_chat(msgs)
    full = tok.encode_chat(
        msgs + [{"role": "assistant", "content": task}], add_generation_prompt=False
    )
    n = common_prefix(head, full)
    cache = model.model.new_cache(len(full) + 1)
    logits = model.model.forward(torch.tensor(full[:-1]), cache, logits_rows="all").logits
    lp = torch.log_softmax(logits.float(), -1)  # [len(full) - 1, V]
    return float(sum(lp[i - 1, full[i]] for i in range(n, len(full))))


def test_explain_weighs_the_best_ranked_reachable_goals_by_the_tasks_words(tiny_llama_long):
    m = tiny_llama_long
    w, _ = world_and_skills("kitchen")
    chooser = GoalChooser(m.model, m.tokenizer, None, m.model.new_cache, branches=2)
    goals = [
        [{"object": "apple", "at": "table"}],
        [{"holding": "apple"}],
        [{"object": "apple", "at": "sink"}],
        [{"object": "red_cup", "at": "sink"}],
    ]
    cands = [
        Candidate([], -float(i), 1, i or None, goal=g, tier=REACHABLE) for i, g in enumerate(goals)
    ]
    cands.append(Candidate([], 0.0, 1, 9, goal=[{"object": "plate", "at": "sink"}]))  # not reached
    # the same goal spelt another way is weighed once and shares the weight
    cands.append(Candidate([], -9.0, 1, 7, goal=goals[1], tier=REACHABLE))
    assert chooser.explain(TASK, w, cands, key=lambda c: c.logprob) == EXPLAIN_POOL == 3
    raw = [_explained_reference(m, TASK, g, w) for g in goals[:3]]
    best = max(raw)
    assert [c.explained for c in cands[:3]] == pytest.approx([r - best for r in raw], abs=2e-3)
    assert max(c.explained for c in cands[:3]) == 0.0
    # reachable but not weighed: the lowest weight, so it cannot overtake a weighed goal
    assert cands[3].explained == pytest.approx(min(raw) - best, abs=2e-3)
    assert cands[4].explained == 0.0 and cands[5].explained == cands[1].explained
    # fewer than two goals in reach: nothing to weigh, no forward
    one = [Candidate([], 0.0, 1, None, goal=goals[0], tier=REACHABLE)]
    assert chooser.explain(TASK, w, one + cands[4:5], key=lambda c: c.logprob) == 0
    assert one[0].explained == 0.0


def test_how_well_a_goal_explains_the_task_moves_its_rank(tiny_llama, monkeypatch):
    """The alternative is likelier (-1 against -4), but the task's words read back far worse
    from it than from the greedy goal: the greedy goal stands, and the stats say why."""
    tok = tiny_llama.tokenizer
    w, s = world_and_skills("kitchen")
    task = "move the apple"
    greedy_text = _compact({**good_plan(), "task": task})
    other_head = (
        _compact({**_head([{"object": "apple", "at": "sink"}]), "task": task})[:-1] + ',"steps":['
    )
    pl = Planner(
        _Runtime(tok, [greedy_text], tiny_llama.model),
        tok,
        attempts=0,
        thinking=False,
        goal_choice=2,
    )
    alt = tok.encode(other_head, add_special=False)

    def candidates(prompt_ids, gen_ids, grammar, start=0, forms=(), unnamed=()):
        g, h = head_span(pl.gtok.token_bytes, gen_ids)
        return [Candidate(list(gen_ids[:h]), -4.0, h - g, None), Candidate(alt, -1.0, 9, 12)]

    def explain(task_text, world, cands, key, lacking=()):
        assert task_text == task and world is w
        for c in cands:
            c.explained = -10.0 if c.ids == alt else 0.0
        return 2

    monkeypatch.setattr(pl.chooser, "candidates", candidates)
    monkeypatch.setattr(pl.chooser, "priors", lambda *a, **k: None)
    monkeypatch.setattr(pl.chooser, "explain", explain)
    res = pl.plan(task, w, s)
    assert res.valid and res.plan["goal"] == good_plan()["goal"]
    assert res.stats["goal_changed"] == 0
    stated = res.stats["goal_choice"][0]["candidates"]
    assert [c["explained"] for c in stated] == [0.0, -10.0]
    assert stated[0]["score"] - stated[1]["score"] == pytest.approx(-3.0 + EXPLAIN_NATS * 10)
