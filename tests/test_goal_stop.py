"""A plan whose goal alone shows the task cannot be done ends at its goal: the grammar allows
only end-of-sequence once the steps open, so no steps are decoded toward the token budget."""
from __future__ import annotations

import json

import numpy as np
import torch
from test_agent import good_plan, world_and_skills

from agent.files import base_plan_schema
from agent.grammar import Grammar, GrammarTokenizer
from agent.solver import goal_stop
from agent.specialize import specialize


def _walk(tok, gtok, grammar, plan, stop):
    """Commit the plan's tokens one by one; -> (constraint, tokens committed before the cut)."""
    c = grammar.constraint(stop=stop)
    ids = tok.encode(json.dumps(plan, separators=(",", ":")), add_special=False)
    for i, t in enumerate(ids):
        if c.cut:
            return c, i
        c.advance(t)
    return c, len(ids)


def test_an_infeasible_goal_ends_the_plan_before_its_steps(tiny_llama):
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    gtok = GrammarTokenizer(tok)
    grammar = Grammar(gtok, specialize(base_plan_schema(), w, s))
    stop = goal_stop(w, s)
    for goal in ([{"object": "cast_iron_pan", "at": "table"}],                  # 3.2 kg > 2 kg
                 [{"missing": "toaster"}],
                 [{"every": {"type": "cup"}, "at": "top_shelf"}, {"do": "wait", "args": {"duration": 9}}]):  # out of reach
        plan = {**good_plan(), "goal": goal}
        c, n = _walk(tok, gtok, grammar, plan, stop)
        text = json.dumps(plan, separators=(",", ":"))
        assert c.cut and n <= len(tok.encode(text[:text.index('"steps":[') + 12], add_special=False)), goal
        # only EOS from here, in masks, drafts and forced tokens; and it ends the plan
        width = gtok.n_vocab
        rows = c.mask_rows(torch.zeros(2, width), [gtok.eos_ids[0]])
        assert set(np.flatnonzero(rows[0].isfinite().numpy())) == set(gtok.eos_ids)
        assert c.forced() == [] and c.valid_prefix([5, 6]) == 0 and c.is_accepting()
        c.advance(gtok.eos_ids[0])
        assert c.finished
    # a goal that can be done decodes its steps as before
    c, n = _walk(tok, gtok, grammar, good_plan(), stop)
    assert not c.cut and c.is_accepting()


def test_steps_past_twice_the_solvers_are_cut(tiny_llama):
    """A goal the solver reaches in n steps leaves the model max(2n, n + 2) steps: a plan that
    repeats its steps past that ends there (the planner then takes the solver's steps, as for a
    plan the token budget cut), and one within it decodes as before."""
    w, s = world_and_skills("kitchen")
    tok = tiny_llama.tokenizer
    gtok = GrammarTokenizer(tok)
    grammar = Grammar(gtok, specialize(base_plan_schema(), w, s))
    stop = goal_stop(w, s)
    plan = good_plan()
    c, _ = _walk(tok, gtok, grammar, plan, stop)
    assert stop.step_cap == 4 and not c.cut and c.is_accepting()      # pick, place: n = 2
    pair = plan["steps"]
    runaway = {**plan, "steps": [{**st, "id": f"s{i + 1}"} for i, st in enumerate(pair * 4)]}   # 8 steps
    c, n = _walk(tok, gtok, grammar, runaway, stop)
    text = json.dumps(runaway, separators=(",", ":"))
    fifth = [i for i in range(len(text)) if text.startswith('"skill":', i)][4]
    assert c.cut and c.steps == 5
    # cut at the token that completes the fifth step's key, not before it
    assert len(tok.encode(text[:fifth + 7], add_special=False)) <= n <= len(tok.encode(text[:fifth + 8],
                                                                                         add_special=False))
    assert c.forced() == [] and c.is_accepting()
    # a goal the solver cannot reach leaves the steps uncapped
    stop = goal_stop(w, s, max_steps=1)
    c, _ = _walk(tok, gtok, grammar, runaway, stop)
    assert stop.step_cap is None and not c.cut
